"""``edbatch.api.route``: every slot of a top-k routing recorded in one call records the
same nodes as one ``switch`` per slot, runs to the same values and gradients, and keeps the
errors of a bad routing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, Handles, route, switch, topk
from edbatch.errors import GraphError


def _batch():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    b = DynamicBatch(dtype=torch.float64)
    cells = {"embed": b.cell(nn.Embedding(10, 3).double(), "embed", [], 3, takes_attr=True),
             "gate": b.cell(nn.Linear(3, 3).double(), "gate", [3], 3),
             "experts": [b.cell(nn.Linear(3, 3).double(), f"e{a}", [3], 3) for a in range(3)],
             "mix": b.cell(lambda x, y, z: x * y + z, "mix", [3, 3, 3], 3),
             "sq": b.cell(lambda h: h.pow(2).sum(1), "sq", [3], ())}
    return b, cells


def _program(b, c, words, fused: bool):  # type: ignore[no-untyped-def]
    xs = c["embed"].map(attrs=words)
    gates = c["gate"].map(xs)
    top = yield topk(gates, 2)  # per word its two experts, read from the gates' values
    if fused:
        outs = route(c["experts"], top, xs)
    else:
        outs = [switch(c["experts"], slot, xs) for slot in zip(*top, strict=True)]
    b.add_loss(c["sq"].map(c["mix"].map(gates, *outs)))  # (gradients reach the gate)
    return top


def _run(fused: bool):  # type: ignore[no-untyped-def]
    b, c = _batch()
    out = b.run_programs([_program(b, c, w, fused) for w in ([1, 4, 2, 7], [3, 3], [9])])
    out.loss.backward()
    graph = out.segments[-1].graph
    grads = [p.grad.clone() for cell in (c["embed"], c["gate"], *c["experts"])
             for p in cell.module.parameters()]
    return out, graph, grads


def test_route_records_what_switch_per_slot_records_with_equal_values_and_grads() -> None:
    fused, g_fused, grads_fused = _run(True)
    single, g_single, grads_single = _run(False)
    assert fused.returns == single.returns and fused.syncs == single.syncs == 1
    assert {len(set(map(tuple, t))) for t in fused.returns} != {1}  # real routing
    assert g_fused.op_ids.tolist() == g_single.op_ids.tolist()
    assert g_fused.operand_ids.tolist() == g_single.operand_ids.tolist()
    assert g_fused.attrs.tolist() == g_single.attrs.tolist()
    assert fused.loss.item() == single.loss.item()
    for a, b in zip(grads_fused, grads_single, strict=True):
        assert torch.equal(a, b)


def test_route_returns_one_block_per_slot_of_the_routed_kinds() -> None:
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2, 3])
        first = len(b._rec.ops)
        outs = route(c["experts"], [[0, 2], [1, 0], [2, 2]], xs)
        assert [type(o) for o in outs] == [Handles, Handles]
        assert [o.first for o in outs] == [first, first + 3] and len(b._rec.ops) == first + 6
        assert [h._kind for h in outs[1]] == [c["experts"][a].kind for a in (2, 0, 2)]
        lists = route(c["experts"], [[0, 1], [1, 0], [2, 2]], list(xs))  # not a block
        assert [len(o) for o in lists] == [3, 3]
    b.discard()


def test_route_keeps_the_errors_of_a_bad_routing() -> None:
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2])
        n = len(b._rec.ops)
        with pytest.raises(GraphError, match="choice 3 is not a cell index 0..2"):
            route(c["experts"], [[0, 3], [1, 0]], xs)
        with pytest.raises(GraphError, match="choice -1 is not a cell index"):
            route(c["experts"], [[0, 1], [-1, 0]], xs)
        with pytest.raises(GraphError, match="rows of top have different lengths"):
            route(c["experts"], [[0, 1], [1]], xs)
        assert len(b._rec.ops) == n  # nothing recorded by a refused call
        with pytest.raises(GraphError, match="2 choices but operand lists of lengths"):
            route(c["experts"], [[0, 1], [1, 0]], xs[:1])
        with pytest.raises(GraphError, match="takes 1 operands .* got 2"):  # as switch
            route(c["experts"], [[0, 1], [1, 0]], xs, xs)
    b.discard()
