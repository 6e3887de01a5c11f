"""Pooled handles (one object per node id, reused by the next mini-batch when nobody holds
it) and cells as plain functions: the graphs and errors of the checked paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edbatch.api import Cell, DynamicBatch, Handle, take_graph
from edbatch.errors import GraphError
from edbatch.executor import init_params
from edbatch.workloads import make_workload

W = 2


class _Add(nn.Module):
    def forward(self, *xs: Tensor) -> Tensor:
        return torch.stack(xs).sum(0) if xs else torch.zeros(1, W)


def _cells(batch: DynamicBatch) -> dict[str, Cell]:
    out = {f"c{k}": batch.cell(_Add(), f"c{k}", [W] * k, W) for k in (1, 2, 3)}
    out["sq"] = batch.cell(lambda h, a: h.pow(2).sum(1) * a, "sq", [W], (), takes_attr=True)
    out["var"] = batch.cell(lambda x, rows, seg, n: x.index_add(0, seg, rows), "var",
                            [W, W], W, variadic=True)
    return out


def _fill(batch: DynamicBatch) -> list[Handle]:
    """Record input nodes up to the pool's end (the next node needs a new pool object)."""
    need = max(len(batch._pool), 1024) - len(batch._rec.ops)
    return batch.inputs(torch.ones(need, W))


def _call(path: str, cells: dict[str, Cell], batch: DynamicBatch, embed: nn.Embedding,
          x: Handle, s: Handle) -> Handle:
    if path in ("c1", "c2", "c3"):
        return cells[path](*[x] * int(path[1]))
    if path == "sq":
        return cells["sq"](x, attr=2)
    if path == "var":
        return cells["var"](x, x, x)
    if path == "lookup":
        return batch.lookup(embed, 3)
    leaf, internal, loss = (batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))
    if path == "op0":
        return leaf(attr=4)
    return loss(s, attr=2) if path == "op1" else internal(s, s)


@pytest.mark.parametrize("path", ["c1", "c2", "c3", "sq", "var", "lookup", "op0", "op1",
                                  "op2"])
def test_a_node_past_the_pool_grows_it_and_records_the_same(path: str) -> None:
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=W)
    batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    cells, embed = _cells(batch), nn.Embedding(5, W)
    leaf = batch.op("tree_lstm.leaf")
    graphs = []
    for grow in (False, True):
        with batch.instance():
            x = batch.input(torch.ones(W))
            s = leaf(attr=1)
            if grow:
                _fill(batch)
            first = len(batch._rec.ops)
            h = _call(path, cells, batch, embed, x, s)
            assert h.node_id == first and batch._pool[first] is h
            assert h._rec is batch._rec and len(batch._pool) > first
        graph = take_graph(batch)[0]
        keep = np.r_[0:2, first:graph.num_nodes]
        ops = graph.operand_ids[graph.operand_ptr[first]:graph.operand_ptr[first + 1]]
        graphs.append((graph.op_ids[keep].tolist(), graph.attrs[keep].tolist(),
                       ops.tolist()))
    assert graphs[0] == graphs[1]


def test_a_held_handle_stays_stale_and_the_pool_hands_out_a_new_one() -> None:
    batch = DynamicBatch()
    cells = _cells(batch)
    with batch.instance():
        kept = cells["c1"](batch.input(torch.ones(W)))
        dropped_id = id(cells["c1"](kept))
    batch.discard()
    with batch.instance():
        x = batch.input(torch.ones(W))
        fresh = cells["c1"](x)
        again = cells["c1"](fresh)
    assert fresh.node_id == kept.node_id and fresh is not kept and fresh != kept
    assert id(again) == dropped_id  # nobody held it: the same object serves node 2 again
    assert kept.generation == fresh.generation - 1
    with pytest.raises(GraphError, match="already ran.*rebuild it"):
        cells["c2"](kept, x)
    with pytest.raises(GraphError, match="already ran"):
        batch.add_loss(kept)
    assert len(batch._rec.ops) == 3  # the failed calls recorded nothing


def test_cells_are_functions_with_the_cell_protocol() -> None:
    batch = DynamicBatch()
    cells = _cells(batch)
    for name, cell in cells.items():
        assert isinstance(cell, Cell) and cell.batch is batch and cell.name == name
        assert cell.op.name == f"user.{name}" and batch.cell(
            cell.module, name, *(([W, W], W) if name == "var" else
                                 ([W] * int(name[1]), W) if name[0] == "c" else ([W], ()))
            , **({"variadic": True} if name == "var" else
                 {"takes_attr": True} if name == "sq" else {})) is cell
    assert not isinstance(len, Cell)
    x = batch.input(torch.ones(W))
    with pytest.raises(GraphError, match="cell 'sq' needs attr=<int>"):
        cells["sq"](x)
    with pytest.raises(GraphError, match="cell 'c1' takes no attr"):
        cells["c1"](x, attr=1)
    with pytest.raises(GraphError, match="cell 'c3' takes 3 operands"):
        cells["c3"](x, x)
    with pytest.raises(GraphError, match=r"operand 1 \(repeated\) has shape \(3,\)"):
        cells["var"](x, batch.input(torch.ones(3)))
    h = cells["sq"](x, attr=np.int64(2))  # not an int: the checked path converts it
    assert batch._rec.attrs[h.node_id] == 2 and type(batch._rec.attrs[h.node_id]) is int
