"""Round plans by shape (:func:`~edbatch.api._rounds.shape_ops`): a round reading earlier
nodes of another op type of the same shape reuses the plan (a parser's decisions reading
word features or root / pad vectors); the answer to a round asking for its own new nodes
in order is their batch itself (:func:`~edbatch.api._rounds.last_rows`), with the values of
the per-program reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, _direct, argmax
from edbatch.api._rounds import last_rows, shape_ops, whole_batch
from edbatch.api._segments import segment_state

DIM, OUT = 4, 5


def _model() -> tuple[DynamicBatch, nn.Module, nn.Module, nn.Module, object, object, object]:
    torch.manual_seed(7)
    a, b, s = nn.Linear(DIM, DIM).double(), nn.Linear(DIM, DIM).double(), \
        nn.Linear(DIM, OUT).double()
    batch = DynamicBatch(dtype=torch.float64)
    return (batch, a, b, s, batch.cell(a, "a", [DIM], DIM), batch.cell(b, "b", [DIM], DIM),
            batch.cell(s, "s", [DIM], OUT))


def test_rounds_reading_other_op_types_of_one_shape_share_a_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_direct, "DIRECT", False)  # (the long path's plans: round 3 is direct)
    batch, a, b, s, ca, cb, cs = _model()
    xs = [torch.randn(DIM, dtype=torch.float64) for _ in range(3)]
    mask = np.array([True, False, True, True, False])

    def program(x):  # type: ignore[no-untyped-def]
        h_a, h_b = ca(batch.input(x)), cb(batch.input(x))
        yield h_a  # (round 1 runs both)
        first = yield argmax(cs(h_a), mask)  # round 2 reads a node of op type "a"
        second = yield argmax(cs(h_b), mask)  # round 3 one of "b": round 2's plan
        return first, second

    with torch.no_grad():
        batch.run_programs([program(x) for x in xs[:1]], grad=False)  # (op types made)
        hits = segment_state(batch).rounds.hits
        out = batch.run_programs([program(x) for x in xs], grad=False)
        rounds = segment_state(batch).rounds
        assert rounds.hits - hits >= 1, "round 2 did not reuse round 1's plan"
        for x, got in zip(xs, out.returns, strict=True):
            want = tuple(int(torch.where(torch.from_numpy(mask), s(f(x)), -torch.inf).argmax())
                         for f in (a, b))
            assert got == want


def test_shape_ops_maps_each_op_type_to_the_first_of_its_shape() -> None:
    batch, *_ = _model()
    ops = batch._ops
    got = shape_ops(ops)
    for k, op in enumerate(ops):
        assert ops[int(got[k])].out_shape == op.out_shape
        assert all(o.out_shape != op.out_shape for o in ops[:int(got[k])])


def test_last_rows_only_for_the_last_segments_new_nodes_in_order() -> None:
    out = torch.arange(6.0).reshape(3, 2)
    new = (5, 8, 1, out)
    assert last_rows(new, np.array([5, 6, 7])) is out
    assert last_rows(new, np.array([5, 7, 6, 7][:3])) is None
    assert last_rows(new, np.array([5, 6])) is None
    assert last_rows(new, np.array([4, 5, 6])) is None
    assert last_rows(None, np.array([5, 6, 7])) is None
    chain = (6, 12, 3, out)  # (a direct chain round's last position: nodes 6, 9, 11)
    assert last_rows(chain, np.array([6, 9, 11])) is None
    assert last_rows((6, 13, 3, out), np.array([6, 9, 12])) is out
    assert last_rows((6, 13, 3, out), np.array([6, 10, 12])) is None
    assert last_rows((6, 13, 3, out), np.array([6, 7, 12])) is None


def test_whole_batch_needs_exactly_the_new_nodes_in_row_order() -> None:
    # nodes 0, 1: value nodes (batch 0); 2..4: new nodes
    assert whole_batch(np.array([0, 0, 1, 1, 1]), np.array([0, 1, 0, 1, 2]), 2, 3) == 1
    assert whole_batch(np.array([0, 0, 1, 1, 1]), np.array([0, 1, 0, 2, 1]), 2, 3) == -1
    assert whole_batch(np.array([0, 1, 1, 1, 1]), np.array([0, 0, 1, 2, 3]), 2, 3) == -1
    assert whole_batch(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 0, 1, 0]), 2, 3) == -1
    assert whole_batch(np.array([0, 0]), np.array([0, 1]), 2, 0) == -1
