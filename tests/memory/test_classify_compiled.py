"""The planner's compiled read classification against the numpy one (the oracle): the same
reads, rows, arenas, view flags and view count, so the same memory plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.memory import plan_memory
from edbatch.memory._aligned import aligned_orders
from edbatch.memory._chains import ChainPlanner
from edbatch.memory.planner import _Frame, _Layout
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import REAL_CASES
from tests.schedule.test_compiled import minibatch
from tests.schedule.test_properties import graphs

SCHEDULERS = ("depth", "dynet_agenda", "critical_path")
FIELDS = ("read_start", "read_batch", "read_view", "read_rows", "read_arena", "num_views")


def _layouts(graph: Graph, schedule: Schedule) -> list[_Layout]:
    """Layouts of the three strategies' row orders and placements (compiled classify)."""
    naive = [np.asarray(b.node_ids, dtype=np.int32) for b in schedule.batches]
    out = [_Layout(graph, schedule, naive, range(len(naive))),
           _Layout(graph, schedule, aligned_orders(graph, schedule), range(len(naive)))]
    out.append(_Layout(graph, schedule, *ChainPlanner(graph, schedule, False).run()))
    return out


def assert_same_reads(graph: Graph, schedule: Schedule) -> None:
    for lay in _layouts(graph, schedule):
        got = {f: getattr(lay, f) for f in FIELDS}
        cons = (np.concatenate(lay.orders).astype(np.int64) if lay.orders
                else np.zeros(0, np.int64))
        sizes = np.array([len(o) for o in lay.orders], dtype=np.int64)
        lay._classify_numpy(cons, np.repeat(np.arange(len(lay.orders)), sizes))
        for f in FIELDS:
            want = getattr(lay, f)
            if f == "num_views":
                assert got[f] == want
            else:
                np.testing.assert_array_equal(got[f], want, err_msg=f)
                assert got[f].dtype.kind == np.asarray(want).dtype.kind, f


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_classify_equals_numpy(workload: str, granularity: str) -> None:
    graph = minibatch(workload, granularity)
    for name in SCHEDULERS:
        assert_same_reads(graph, make_scheduler(name)(graph))


@settings(max_examples=30, deadline=None)
@given(graphs())
def test_compiled_classify_equals_numpy_on_random_dags(graph: Graph) -> None:
    assert_same_reads(graph, make_scheduler("dynet_agenda")(graph))


def test_variadic_reads_across_arenas_and_batched_variadic_nodes() -> None:
    """A variadic node alone reading two widths (one read per operand, listed first), one
    reading one width (one read), and batched variadic nodes of different arity."""
    vocab = Vocab([OpType("a", "lookup", (), (2,)), OpType("b", "lookup", (), (3,)),
                   OpType("mix", "sum", None, (1,), batchable=False),
                   OpType("cat", "sum", None, (2,))])
    g = GraphBuilder(vocab)
    a = [g.add("a", attr=i) for i in range(4)]
    b = [g.add("b", attr=i) for i in range(2)]
    m1 = g.add("mix", a[0], b[0], a[1])
    m2 = g.add("mix", a[2], a[3])
    c1 = g.add("cat", a[0], a[1], a[2])
    c2 = g.add("cat", a[3])
    graph = g.build([m1, m2, c1, c2])
    schedule = Schedule.from_node_lists(graph, [a, b, [c1, c2], [m1], [m2]], "manual")
    assert_same_reads(graph, schedule)
    lay = _layouts(graph, schedule)[0]
    assert lay.read_batch[:3].tolist() == [3, 3, 3]  # m1: one read per operand, first
    plan_memory(graph, schedule, "naive", cache=False)


@pytest.mark.parametrize("backend", ["compiled", "python"])
@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_counted_views_equal_the_built_layouts(workload: str, granularity: str, backend: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``_Frame.classify`` (what ``aligned`` counts of the naive layout instead of building
    it) equals the views of the layout built in full, for the naive and the aligned orders;
    so ``aligned`` keeps the naive plan exactly when building both would."""
    monkeypatch.setenv("EDBATCH_BACKEND", backend)
    graph = minibatch(workload, granularity)
    for name in SCHEDULERS:
        schedule = make_scheduler(name)(graph)
        frame = _Frame(graph, schedule, range(schedule.num_batches))
        for lay in _layouts(graph, schedule)[:2]:
            cons = (np.concatenate(lay.orders).astype(np.int64) if lay.orders
                    else np.zeros(0, np.int64))
            assert frame.classify(cons)[-1] == lay.num_views
        naive, aligned = _layouts(graph, schedule)[:2]
        want = naive if naive.num_views >= aligned.num_views else aligned
        got = plan_memory(graph, schedule, "aligned", cache=False)
        np.testing.assert_array_equal(got.node_row, want.node_row)
