"""The compiled scheduling core against the Python oracle: identical schedules everywhere."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.errors import UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import COMPILED, Schedule, heights, make_scheduler, typewise_graph
from edbatch.schedule._compiled import key_hash, key_hash_numba
from edbatch.schedule._compiled_analysis import (
    core_inputs,
    flat_arrays,
    flat_arrays_numpy,
    typewise_graph_numba,
)
from edbatch.schedule.compiled import CompiledScheduler
from edbatch.schedule.compiled import heights as compiled_heights
from edbatch.workloads import REAL_CASES, make_workload
from tests.schedule.test_properties import graphs


def assert_same(compiled: Schedule, python: Schedule) -> None:
    """Same batches in the same order: op, forced flag, node ids (and their dtype)."""
    assert compiled.num_batches == python.num_batches
    for i, (c, p) in enumerate(zip(compiled.batches, python.batches, strict=True)):
        assert (c.op_id, c.forced) == (p.op_id, p.forced), i
        assert c.node_ids.dtype == p.node_ids.dtype == np.int32
        np.testing.assert_array_equal(c.node_ids, p.node_ids, err_msg=f"batch {i}")
    assert compiled.scheduler == python.scheduler


_GRAPHS: dict[tuple[str, str, int], Graph] = {}


#: Node cap of :func:`minibatch`: the Python oracles are slow on big primitive graphs, and
#: every registered workload adds its cases to these tests.
NODE_CAP = 3000


def minibatch(workload: str, granularity: str, size: int = 8) -> Graph:
    """The first ``size`` instances of a workload's eval split as one graph (cached), fewer
    (at least one) where ``size`` of them would exceed :data:`NODE_CAP` nodes."""
    key = (workload, granularity, size)
    if key not in _GRAPHS:
        wl = make_workload(workload, granularity=granularity)
        instances = wl.load(wl.default_eval_split)
        graph = wl.build_graph(instances[:size])
        if graph.num_nodes > NODE_CAP:
            fewer = max(1, size * NODE_CAP // graph.num_nodes)
            graph = wl.build_graph(instances[:fewer])
        _GRAPHS[key] = graph
    return _GRAPHS[key]


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_equals_python_on_every_workload(workload: str, granularity: str) -> None:
    graph = minibatch(workload, granularity)
    for name in COMPILED:
        compiled = make_scheduler(name)
        assert isinstance(compiled, CompiledScheduler)
        s = compiled(graph)
        s.validate(graph)
        assert_same(s, make_scheduler(name, backend="python")(graph))


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_compiled_equals_python_on_random_dags(graph: Graph) -> None:
    for name in COMPILED:
        assert_same(make_scheduler(name)(graph), make_scheduler(name, backend="python")(graph))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 2**40), max_size=40))
def test_key_hash_is_identical_in_python_and_numba(key: list[int]) -> None:
    assert key_hash(tuple(key)) == key_hash_numba(np.array(key, dtype=np.int64))


def test_key_hash_separates_prefixes_and_orders() -> None:
    keys = [(), (0,), (0, 0), (1, 0), (0, 1), (0, 1, -1, 1, 0), (0, 1, -1, 0, 1)]
    assert len({key_hash(k) for k in keys}) == len(keys)


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(make_scheduler("critical_path"), CompiledScheduler)
    assert not isinstance(make_scheduler("critical_path", backend="python"), CompiledScheduler)
    monkeypatch.setenv("EDBATCH_BACKEND", "python")
    assert not isinstance(make_scheduler("critical_path"), CompiledScheduler)
    assert isinstance(make_scheduler("critical_path", backend="compiled"), CompiledScheduler)
    monkeypatch.setenv("EDBATCH_BACKEND", "numba")
    with pytest.raises(UnknownNameError, match="EDBATCH_BACKEND.*'compiled'"):
        make_scheduler("critical_path")
    with pytest.raises(UnknownNameError, match="Did you mean 'python'"):
        make_scheduler("depth", backend="pyton")


def test_python_only_schedulers_keep_python(two_trees: Graph) -> None:
    for name in ("depth", "random", "rollout"):
        assert not isinstance(make_scheduler(name), CompiledScheduler)


def assert_same_analyses(graph: Graph) -> None:
    """Compiled type-wise graph and heights equal the Python analyses of a fresh graph."""
    fresh = Graph.from_arrays(graph.vocab, graph.op_ids, graph.operand_ptr, graph.operand_ids,
                              validate=False)
    want = typewise_graph(graph)
    got = typewise_graph_numba(fresh.op_ids.astype(np.int64),
                               fresh.operand_ptr.astype(np.int64),
                               fresh.operand_ids.astype(np.int64))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    for v in range(graph.num_nodes):  # same successors per row (Python's row order varies)
        lo, hi = want[1][v], want[1][v + 1]
        assert sorted(got[2][lo:hi].tolist()) == sorted(want[2][lo:hi].tolist()), v
    assert got[0].dtype == np.int32 and got[1].dtype == np.int64 and got[2].dtype == np.int32
    np.testing.assert_array_equal(compiled_heights(fresh), heights(graph))
    got_flat = flat_arrays(fresh.op_ids, fresh.operand_ptr, fresh.operand_ids, fresh.depth,
                           len(fresh.vocab))
    for name, g, w in zip(("op", "depth", "arity", "uptr", "uids", "mean"), got_flat,
                          flat_arrays_numpy(fresh), strict=True):
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)  # (mean: bit for bit)
    # the fused call (a fresh graph's inputs in one call) against the separate ones
    fused = core_inputs(fresh.op_ids, fresh.operand_ptr, fresh.operand_ids, fresh.depth,
                        len(fresh.vocab), True, True)
    separate = (*got_flat, compiled_heights(fresh), *got)
    for k, (f, w) in enumerate(zip(fused, separate, strict=True)):
        assert f.dtype == w.dtype, k
        np.testing.assert_array_equal(f, w, err_msg=str(k))
    none = core_inputs(fresh.op_ids, fresh.operand_ptr, fresh.operand_ids, fresh.depth,
                       len(fresh.vocab), False, False)
    assert [len(a) for a in none[6:]] == [0, 0, 0, 0]  # heights and type-wise graph


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_analyses_equal_python(workload: str, granularity: str) -> None:
    assert_same_analyses(minibatch(workload, granularity))


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_compiled_analyses_equal_python_on_random_dags(graph: Graph) -> None:
    assert_same_analyses(graph)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([63, 64, 65, 130]))
def test_compiled_typewise_with_more_types_than_a_word(seed: int, num_types: int) -> None:
    """The per-node type bit sets span several 64-bit words (types 64 and up)."""
    from edbatch.workloads.synthetic import random_dag

    rng = np.random.default_rng(seed)
    assert_same_analyses(random_dag(rng, 300, num_types, 3, 0.1, 40))
    assert_same_analyses(random_dag(rng, 200, num_types, 2, 0.0, None))


def test_typewise_edges_beyond_the_first_guess_are_walked_again() -> None:
    """More type-wise edges than the compiled walk's first buffer guess (``2 * (nodes +
    edges)``): ``k`` nodes of type ``a``, one variadic join of them all, ``k`` more ``a``
    nodes reading the join, so every later ``a`` has all ``k`` earlier ones as type-wise
    predecessors (``k**2`` edges). The second walk into exact buffers gives the oracle's
    graph, and a walk into too small buffers still counts every edge."""
    from edbatch.graph import GraphBuilder, OpType, Vocab
    from edbatch.schedule._compiled_analysis import _type_reach, _typewise_edges

    k = 30
    b = GraphBuilder(Vocab([OpType("s", "lookup", (), (1,)), OpType("a", "tanh", ((1,),), (1,)),
                            OpType("join", "sum", None, (1,))]))
    s = b.add("s")
    first = [b.add("a", s) for _ in range(k)]
    join = b.add("join", *first)
    for _ in range(k):
        b.add("a", join)
    graph = b.build()
    assert_same_analyses(graph)
    op, optr, oids = (x.astype(np.int64) for x in (graph.op_ids, graph.operand_ptr,
                                                    graph.operand_ids))
    assert len(typewise_graph_numba(op, optr, oids)[2]) == k * k > 2 * (len(op) + len(oids))
    small = np.full(5, -7, np.int64), np.full(5, -7, np.int64)
    assert _typewise_edges(op, optr, oids, _type_reach(op, optr, oids), *small) == k * k
    assert (small[0] >= 0).all() and (small[1] >= 0).all()  # filled up to capacity only
