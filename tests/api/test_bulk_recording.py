"""Bulk recording: ``Cell.map``, ``edbatch.api.switch`` and the ``Handles`` they return
record the same graph as calls node by node, and keep the checks and errors of a call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, Handles, switch
from edbatch.errors import GraphError


def _batch():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    b = DynamicBatch(dtype=torch.float64)
    emb = nn.Embedding(10, 3).double()
    cells = {"embed": b.cell(emb, "embed", [], 3, takes_attr=True),
             "a": b.cell(nn.Linear(3, 3).double(), "a", [3], 3),
             "b": b.cell(nn.Linear(3, 3).double(), "b", [3], 3),
             "mix": b.cell(lambda x, y: x * y, "mix", [3, 3], 3),
             "sq": b.cell(lambda h: h.pow(2).sum(1), "sq", [3], ())}
    return b, cells


def _record(b, c, bulk: bool, words, choice):  # type: ignore[no-untyped-def]
    with b.instance():
        if bulk:
            xs = c["embed"].map(attrs=words)
            ys = switch([c["a"], c["b"]], choice, xs)
            zs = c["mix"].map(xs, ys)
        else:
            xs = [c["embed"](attr=w) for w in words]
            ys = [(c["a"], c["b"])[k](x) for k, x in zip(choice, xs, strict=True)]
            zs = [c["mix"](x, y) for x, y in zip(xs, ys, strict=True)]
        for z in zs:
            b.add_loss(c["sq"](z))


def test_map_and_switch_record_the_same_graph_as_single_calls() -> None:
    words, choice = [1, 4, 2, 7], [0, 1, 1, 0]
    b, c = _batch()
    _record(b, c, True, words, choice)
    bulk = b.graph()[0]
    got = b.run("depth").loss
    _record(b, c, False, words, choice)
    single = b.graph()[0]
    want = b.run("depth").loss
    assert bulk.op_ids.tolist() == single.op_ids.tolist()
    assert bulk.operand_ids.tolist() == single.operand_ids.tolist()
    assert bulk.attrs.tolist() == single.attrs.tolist()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_handles_index_like_a_list_and_yield_whole() -> None:
    b, c = _batch()

    def program(words):  # type: ignore[no-untyped-def]
        xs = c["embed"].map(attrs=words)
        assert isinstance(xs, Handles) and len(xs) == len(words)
        assert xs[-1].node_id == xs[len(words) - 1].node_id and len(xs[1:]) == len(words) - 1
        with pytest.raises(IndexError):
            xs[len(words)]
        values = yield xs                       # one check for the whole block
        ys = switch([c["a"], c["b"]], (values[:, 0] > 0).long().tolist(), xs)
        for y in c["sq"].map(ys):
            b.add_loss(y)
        return values.shape

    out = b.run_programs([program([1, 2, 3]), program([4, 5])])
    assert [tuple(s) for s in out.returns] == [(3, 3), (2, 3)] and out.syncs == 1


def test_bulk_calls_keep_the_errors_of_single_calls() -> None:
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2])
        with pytest.raises(GraphError, match="choice 2 is not a cell index 0..1"):
            switch([c["a"], c["b"]], [0, 2], xs)
        with pytest.raises(GraphError, match="2 choices but operand lists of lengths"):
            switch([c["a"], c["b"]], [0, 1], xs[:1])
        with pytest.raises(GraphError, match="has shape"):  # the single call's error
            c["a"].map(c["sq"].map(xs))
        with pytest.raises(GraphError, match="takes no attr"):
            c["a"].map(xs, attrs=[1, 2])
    b.discard()


def test_numpy_choices_and_attrs_and_whole_loss_blocks_record_the_same_graph() -> None:
    """``switch`` takes a numpy array of choices, ``map`` numpy attrs, and
    ``add_loss(handles)`` adds every node of a block: the graph of the calls one by one."""
    import numpy as np

    words, choice = [1, 4, 2, 7], [0, 1, 1, 0]
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=np.array(words))
        zs = c["mix"].map(xs, switch([c["a"], c["b"]], np.array(choice), xs))
        b.add_loss(c["sq"].map(zs))
    bulk, got = b.graph()[0], b.run("depth").loss
    _record(b, c, False, words, choice)
    single, want = b.graph()[0], b.run("depth").loss
    assert bulk.op_ids.tolist() == single.op_ids.tolist()
    assert bulk.operand_ids.tolist() == single.operand_ids.tolist()
    assert bulk.attrs.tolist() == single.attrs.tolist()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_bulk_losses_and_numpy_inputs_are_checked() -> None:
    import numpy as np

    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2])
        with pytest.raises(GraphError, match="not one number per row"):
            b.add_loss(xs)
        with pytest.raises(GraphError, match="attrs must be integers"):
            c["embed"].map(attrs=np.array([1.0, 2.0]))
        with pytest.raises(GraphError, match="choices must be integers"):
            switch([c["a"], c["b"]], np.array([0.0, 1.0]), xs)
        with pytest.raises(GraphError, match="choice 5 is not a cell index"):
            switch([c["a"], c["b"]], np.array([0, 5]), xs)
        n = len(b._rec.ops)
        old = c["sq"].map(xs)
    b.discard()
    with b.instance():
        with pytest.raises(GraphError, match="another mini-batch"):
            b.add_loss(old)  # the discarded mini-batch's
    assert n == 2 and not b._rec.losses
    b.discard()
