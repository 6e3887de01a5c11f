"""The recorder's flat lists: graphs recorded through the API equal the workloads' own
graphs, nested instances and bad operands leave the recording consistent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.api import BuiltinOp, DynamicBatch, Handle, RecordingWarning, take_graph
from edbatch.errors import GraphError
from edbatch.executor import init_params
from edbatch.workloads import make_workload


@pytest.fixture(scope="module")
def tree_batch() -> DynamicBatch:
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=3)
    return DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))


def _ops(batch: DynamicBatch) -> tuple:  # type: ignore[type-arg]
    return tuple(batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))


def test_instances_follow_nesting_and_next_instance(tree_batch: DynamicBatch) -> None:
    leaf, internal, _ = _ops(tree_batch)
    a = leaf(attr=0)                      # before any instance: instance 0
    with tree_batch.instance():           # instance 0
        b = leaf(attr=1)
        with tree_batch.instance():       # instance 1, nested
            c = leaf(attr=2)
        d = internal(b, c)                # back in instance 0
    tree_batch.next_instance()            # instance 2
    e = internal(d, a)
    with pytest.warns(RecordingWarning, match=r"1 node\(s\) of this mini-batch were "
                                              r"recorded outside any"):
        graph = take_graph(tree_batch)[0]
    assert graph.instance.tolist() == [0, 0, 1, 0, 2]  # outside: instance 0
    assert graph.operand_ids.tolist() == [1, 2, 3, 0]
    assert graph.operand_ptr.tolist() == [0, 0, 0, 0, 2, 4]
    assert graph.attrs.tolist() == [0, 1, 2, -1, -1]
    assert [h.node_id for h in (a, b, c, d, e)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("bad", [5, "x", None, (), [0], torch.zeros(2)])
def test_a_bad_operand_raises_and_records_nothing(tree_batch: DynamicBatch, bad: object
                                                  ) -> None:
    leaf, internal, loss = _ops(tree_batch)
    with tree_batch.instance():
        a = leaf(attr=1)
        with pytest.raises(GraphError, match="operand 1 is a"):
            internal(a, bad)
        with pytest.raises(GraphError, match="takes 2 operands"):
            internal(a)
        c = internal(a, leaf(attr=2))
        tree_batch.add_loss(loss(c, attr=1))
    graph = take_graph(tree_batch)[0]
    assert graph.num_nodes == 5  # leaf, leaf, internal, loss, loss_sum
    assert graph.operand_ids.tolist() == [0, 1, 2, 3]


def test_stale_and_foreign_handles_are_rejected(tree_batch: DynamicBatch) -> None:
    leaf, internal, _ = _ops(tree_batch)
    old = leaf(attr=1)
    take_graph(tree_batch)
    with pytest.raises(GraphError, match="already ran"):
        internal(old, leaf(attr=1))
    with pytest.raises(GraphError, match="already ran"):
        tree_batch.add_loss(old)
    other = DynamicBatch.from_workload(make_workload("tree_lstm", embed_dim=4, hidden_dim=3))
    foreign = other.op("tree_lstm.leaf")(attr=1)
    with pytest.raises(GraphError, match="another DynamicBatch"):
        internal(leaf(attr=1), foreign)
    with pytest.raises(GraphError, match="not one number"):
        tree_batch.add_loss(leaf(attr=1))
    tree_batch.discard()


def test_builtin_ops_are_builtin_op_callables(tree_batch: DynamicBatch) -> None:
    """``batch.op`` returns plain functions (no kwargs dict per ``attr=`` call) that still
    satisfy the public ``BuiltinOp`` protocol."""
    for f, name in zip(_ops(tree_batch), ("leaf", "internal", "loss"), strict=True):
        assert isinstance(f, BuiltinOp) and f.batch is tree_batch
        assert f.op.name == f.__name__ == f"tree_lstm.{name}"
    assert not isinstance(len, BuiltinOp)


def test_handles_are_single_nodes(tree_batch: DynamicBatch) -> None:
    leaf = _ops(tree_batch)[0]
    a = leaf(attr=3)
    assert isinstance(a, Handle) and a.shape == (6,) and a.op_name == "tree_lstm.leaf"
    assert a.batch is tree_batch and a.generation == tree_batch._generation
    assert a == a and a != leaf(attr=3) and len({a, a}) == 1
    with pytest.raises(GraphError, match="one node, not a sequence"):
        _, _ = a
    tree_batch.discard()


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_recorded_graph_equals_the_workload_builder(name: str) -> None:
    from benchmarks.models_api import RECORDERS

    wl = make_workload(name, embed_dim=4, hidden_dim=3)
    batch = DynamicBatch.from_workload(wl)
    data = wl.load("dev")[:6]
    RECORDERS[name](batch, wl, data)
    got = take_graph(batch)[0]
    want = wl.build_graph(data)
    for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "depth"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_every_fixed_arity_checks_count_and_operands(name: str) -> None:
    """The per-arity fast paths (0 to 3 operands) fall back to the generic checks: a wrong
    operand count or a bad operand in any slot raises and records nothing."""
    wl = make_workload(name, embed_dim=4, hidden_dim=3)
    batch = DynamicBatch.from_workload(wl)
    zero = next(o.name for o in wl.vocab if o.arity == 0)
    with batch.instance():
        src = batch.op(zero)(attr=0)
        for op in wl.vocab:
            if op.arity is None or op.name == "loss_sum":
                continue
            call, k = batch.op(op.name), op.arity
            rec = batch._rec
            before = (len(rec.ops), len(rec.operands), len(rec.attrs), len(rec.counts))
            with pytest.raises(GraphError, match=f"takes {k} operands"):
                call(*[src] * (k + 1), attr=1)
            if k:
                with pytest.raises(GraphError, match=f"takes {k} operands"):
                    call(*[src] * (k - 1), attr=1)
            for slot in range(k):
                args: list[object] = [src] * k
                args[slot] = "x"
                with pytest.raises(GraphError, match=f"operand {slot} is a str"):
                    call(*args, attr=1)
            assert (len(rec.ops), len(rec.operands), len(rec.attrs),
                    len(rec.counts)) == before, op.name
            h = call(*[src] * k, attr=5)
            assert h.node_id == before[0] and h.op_name == op.name
            assert rec.operands[before[1]:] == [src.node_id] * k and rec.attrs[-1] == 5
    batch.discard()
