"""The recorder's fast paths against its checked paths: variadic cells (no, one and two
fixed operands) and the packed graph assembly give the same graphs as the checked calls and
``np.fromiter``, on real models; bad inputs raise the same errors and record nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, take_graph
from edbatch.api._assemble import _converted, _packed
from edbatch.errors import GraphError
from edbatch.executor import init_params
from edbatch.workloads import make_workload

W = 3
FIELDS = ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "depth", "outputs")


class _Sum(nn.Module):
    """A variadic module: the fixed operands plus the per-node sum of the repeated ones."""

    def forward(self, *args: Any) -> Tensor:
        *fixed, rows, segment, size = args
        out = rows.new_zeros((size, W)).index_add(0, segment, rows)
        return out + sum(fixed) if fixed else out


class _Odd:
    """Not a handle, and reading any attribute of it raises something else than
    ``AttributeError``."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")


def _child_sum_batch(nfixed: int) -> tuple[DynamicBatch, Any]:
    batch = DynamicBatch()
    return batch, batch.cell(_Sum(), f"sum{nfixed}", [W] * (nfixed + 1), W, variadic=True)


def _record_trees(batch: DynamicBatch, cell: Any, nfixed: int, trees: Sequence[Any],
                  call: Callable[..., Handle]) -> None:
    """A child-sum model over SST trees: ``nfixed`` fixed operands (inputs), the children's
    states repeated; ``call(cell, operands)`` records one node."""
    def encode(node: Any) -> Handle:
        kids = [encode(k) for k in node.children]
        fixed = [batch.input(torch.full((W,), float(node.label))) for _ in range(nfixed)]
        return call(cell, [*fixed, *kids])

    for tree in trees:
        with batch.instance():
            encode(tree)


@pytest.mark.parametrize("nfixed", [0, 1, 2])
def test_variadic_fast_path_records_the_checked_paths_graph(nfixed: int) -> None:
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=W)
    trees = [inst.tree for inst in wl.load("dev")[:5]]
    graphs = []
    for call in (lambda c, ops: c(*ops), lambda c, ops: c.cell.checked(ops)):
        batch, cell = _child_sum_batch(nfixed)
        _record_trees(batch, cell, nfixed, trees, call)
        graphs.append(take_graph(batch)[0])
    assert graphs[0].num_nodes > 50
    for field in FIELDS:
        assert np.array_equal(getattr(graphs[0], field), getattr(graphs[1], field)), field


@pytest.mark.parametrize("nfixed", [0, 1, 2])
def test_variadic_bad_operands_raise_and_record_nothing(nfixed: int) -> None:
    batch, cell = _child_sum_batch(nfixed)
    other, _ = _child_sum_batch(nfixed)
    stale = batch.input(torch.ones(W))  # of a mini-batch that ends here
    batch.discard()
    with batch.instance():
        x, wide = batch.input(torch.ones(W)), batch.input(torch.ones(W + 1))
        foreign = other.input(torch.ones(W))
        fixed = [x] * nfixed
        rec = batch._rec
        before = (len(rec.ops), len(rec.operands), len(rec.attrs), len(rec.counts))
        bad: list[tuple[list[Any], str]] = [
            ([*fixed, x, x, wide], rf"operand {nfixed + 2} \(repeated\) has shape \(4,\)"),
            ([*fixed, x, "h"], f"operand {nfixed + 1} is a str, not a Handle"),
            ([*fixed, x, torch.ones(W)], f"operand {nfixed + 1} is a Tensor"),
            ([*fixed, x, foreign], "belongs to another DynamicBatch"),
            ([*fixed, stale], "already ran"),
            ([*fixed, x, _Odd()], f"operand {nfixed + 1} is a _Odd, not a Handle"),
        ]
        if nfixed:
            bad += [([wide, *fixed[1:], x], r"operand 0 \(fixed\) has shape \(4,\)"),
                    ([*fixed[:-1]], f"takes {nfixed} fixed operands")]
        for args, message in bad:
            with pytest.raises(GraphError, match=message):
                cell(*args)
            assert (len(rec.ops), len(rec.operands), len(rec.attrs),
                    len(rec.counts)) == before, message
        h = cell(*fixed, x, x)
        assert h.node_id == before[0] and rec.operands[before[1]:] == [x.node_id] * (
            nfixed + 2) and rec.counts[-1] == nfixed + 2 and rec.attrs[-1] == 2
        leaf = cell(*fixed)  # no repeated operand
        assert rec.counts[-1] == nfixed and rec.attrs[-1] == 0 and leaf.node_id == h.node_id + 1


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_packed_assembly_equals_fromiter(name: str) -> None:
    from benchmarks.models_api import RECORDERS

    wl = make_workload(name, embed_dim=4, hidden_dim=3)
    batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    RECORDERS[name](batch, wl, wl.load("dev")[:6])
    rec = batch._rec
    for losses in (list(rec.losses), []):
        rec.losses = losses
        packed, converted = _packed(rec, 99), _converted(rec, 99)
        for got, want in zip(packed, converted):
            assert got.dtype == want.dtype and np.array_equal(got, want)
        assert len(packed[0]) == len(rec.ops) + bool(losses)
    batch.discard()


def test_attrs_struct_refuses_are_converted_or_refused_by_name() -> None:
    """Attrs ``struct`` refuses: a numpy integer is converted by ``np.fromiter`` as before;
    a float (was truncated) or an integer past int64 (was a raw ``OverflowError``) is a
    ``GraphError`` naming the node and the value."""
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=W)
    batch = DynamicBatch.from_workload(wl)
    leaf, loss = batch.op("tree_lstm.leaf"), batch.op("tree_lstm.loss")
    with batch.instance():
        a = leaf(attr=np.int64(3))
        batch.add_loss(loss(a, attr=np.int32(2)))
        leaf(attr=-1)
    graph, head = batch.graph()
    assert graph.attrs.tolist() == [3, 2, -1, -1] and head == 3
    assert graph.operand_ids.tolist() == [0, 1] and graph.op_ids[-1] == len(graph.vocab) - 1
    batch.discard()
    for bad, shown in ((2.0, "2.0"), (2 ** 70, str(2 ** 70)), (np.float32(1.5), "1.5")):
        with batch.instance():
            batch.add_loss(loss(leaf(attr=3), attr=bad))
        with pytest.raises(GraphError, match=rf"node %1 \(tree_lstm.loss\) has attr=.*{shown}"):
            batch.graph()
        batch.discard()


def test_generic_builtin_op_takes_back_operands_whatever_an_operand_raises() -> None:
    wl = make_workload("lattice_lstm", embed_dim=4, hidden_dim=W)
    batch = DynamicBatch.from_workload(wl)
    big = next(o.name for o in wl.vocab if o.arity is not None and o.arity > 3)
    call, k = batch.op(big), wl.vocab[wl.vocab.id(big)].arity
    with batch.instance():
        s = batch.op("lattice_lstm.start")()
        rec = batch._rec
        before = (len(rec.ops), len(rec.operands), len(rec.attrs))
        with pytest.raises(GraphError, match=f"operand {k - 1} is a _Odd, not a Handle"):
            call(*[s] * (k - 1), _Odd())
        assert (len(rec.ops), len(rec.operands), len(rec.attrs)) == before
        assert call(*[s] * k).node_id == before[0]
    batch.discard()
