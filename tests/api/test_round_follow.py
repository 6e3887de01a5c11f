"""A round that repeats the last one shifted (:class:`edbatch.api._rounds.Follow`) takes its
plan without localising: same returns, loss, gradients and segment graphs as with the long
path (fp64, exactly); a round shifted but reading other op types, of another tag or with
variadic nodes is not followed."""

from __future__ import annotations

import numpy as np
import torch

from edbatch.api import _rounds
from edbatch.api._rounds import Follow, localise
from tests.api.test_round_plans import PLAN, Greedy

_MATCH = Follow.match


def _run(monkeypatch, follow: bool, grad: bool):  # type: ignore[no-untyped-def]
    """A fresh model's two runs of PLAN (the second with every op type registered) and
    how many rounds were followed."""
    matched = [0]

    def counted(self, *args):  # type: ignore[no-untyped-def]
        found = _MATCH(self, *args) if follow else None
        matched[0] += found is not None
        return found

    monkeypatch.setattr(_rounds.Follow, "match", counted)
    model = Greedy()
    model.run(PLAN, grad=grad)
    out, grads = model.run(PLAN, grad=grad)
    return out, grads, matched[0]


def test_followed_rounds_equal_the_long_path(monkeypatch) -> None:
    for grad in (True, False):
        fast, fast_grads, followed = _run(monkeypatch, True, grad)
        slow, slow_grads, none = _run(monkeypatch, False, grad)
        assert followed >= 2 and none == 0  # (every decoding step after the first)
        assert fast.returns == slow.returns and fast.syncs == slow.syncs
        if grad:
            assert torch.equal(fast.loss, slow.loss)
            for a, b in zip(fast_grads, slow_grads, strict=True):
                assert torch.equal(a, b)
        for s, t in zip(fast.segments, slow.segments, strict=True):
            for name in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "outputs"):
                assert np.array_equal(getattr(s.graph, name), getattr(t.graph, name)), name


def _kept(op_all: np.ndarray) -> Follow:  # type: ignore[type-arg]
    """A Follow that kept a round of nodes 4..7 (op 1 reading 2 and 3, op 2 reading it)."""
    follow = Follow()
    flat, losses = np.array([2, 4, 3, 6], np.int64), np.array([5], np.int64)
    old, local, loss_local = localise(flat, losses, 4, 2)
    follow.keep(("tag",), 4, np.array([1, 2, 1, 2], np.int32), flat, losses, old, local,
                loss_local, "plan", op_all)  # type: ignore[arg-type]
    return follow


def test_follow_takes_only_the_same_round_shifted() -> None:
    op_all = np.array([0, 0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2], np.int32)
    ops = np.array([1, 2, 1, 2], np.int32)
    follow = _kept(op_all)
    shifted = (np.array([6, 8, 7, 10], np.int64), np.array([9], np.int64))
    assert follow.match(("other",), 8, ops, None, *shifted, op_all) is None
    assert follow.match(("tag",), 8, ops, np.ones(4, np.int64), *shifted, op_all) is None
    assert follow.match(("tag",), 8, ops[::-1].copy(), None, *shifted, op_all) is None
    assert follow.match(("tag",), 8, ops, None, shifted[0] + 1, shifted[1], op_all) is None
    found = follow.match(("tag",), 8, ops, None, *shifted, op_all)
    assert found is not None
    old, loc, loss_loc, plan = found
    want = localise(*shifted, 8, 2)
    assert np.array_equal(old, want[0]) and np.array_equal(old, [6, 7])
    assert np.array_equal(loc, want[1]) and np.array_equal(loss_loc, want[2])
    assert plan == "plan"
    # the same operands shifted, but the earlier nodes read are of other op types
    other = op_all.copy()
    other[6] = 2
    follow = _kept(op_all)
    assert follow.match(("tag",), 8, ops, None, *shifted, other) is None
