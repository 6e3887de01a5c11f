"""Approximate policy iteration for the afterstate policy (:mod:`policies.afterstate_api`):
the compiled rollout values equal the Python twin forced through the decisions, the labels
are the fewest-batch types, the rounds are never worse than their start and deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edbatch.schedule import FrontierView, run_policy
from edbatch.schedule._compiled_afterstate import afterstate_trace
from edbatch.schedule._compiled_afterstate_q import afterstate_forced_trace, afterstate_q
from edbatch.workloads.synthetic import random_lattices
from policies.afterstate import (
    AFTER_FEATURES,
    AfterstatePolicy,
    AfterstateTwin,
    afterstate_inputs,
    afterstate_start,
    population_afterstate,
)
from policies.afterstate_api import api_rounds, label_rollout
from policies.afterstate_imitate import imitate, lean_mask
from policies.priority import FEATURES


class ForcedAfterTwin(AfterstateTwin):
    """The afterstate twin whose first decisions follow ``prefix`` (a rollout's schedule)."""

    def __init__(self, weights: np.ndarray, prefix: list[int]) -> None:
        super().__init__(weights)
        self.prefix, self.t = prefix, 0

    def choose(self, view: FrontierView) -> int:
        if self.t < len(self.prefix):
            a = self.prefix[self.t]
            self.rows(view)  # the twin's per-decision upkeep, as the compiled loop runs it
            self._hist.append(a)
        else:
            a = super().choose(view)
        self.t += 1
        return a


@pytest.fixture(scope="module")
def graphs() -> list:
    rng = np.random.default_rng(5)
    return [random_lattices(rng, 5, 14, 4) for _ in range(3)]


def _student(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = afterstate_start()
    w[len(FEATURES):] = rng.normal(0.0, 0.5, len(AFTER_FEATURES))  # every afterstate column
    return w


@pytest.mark.parametrize("base", ["student", "critical_path"])
def test_rollout_values_equal_the_twins_forced_schedules(graphs: list, base: str) -> None:
    w = _student(1)
    wb = w if base == "student" else afterstate_start()
    g = graphs[0]
    rows, ids, ptr, q, own = afterstate_q(*afterstate_inputs(g), w, wb, 10_000)  # type: ignore[call-arg]
    sched = AfterstatePolicy(w)(g)
    assert own == sched.num_batches and len(ptr) - 1 == sum(not b.forced for b in sched.batches)
    seq = [b.op_id for b in sched.batches if not b.forced]
    twin_rows = []
    checked = spread = 0
    for t in range(len(ptr) - 1):
        lo, hi = int(ptr[t]), int(ptr[t + 1])
        assert seq[t] in ids[lo:hi].tolist()
        for i in range(lo, hi):
            if ids[i] == seq[t] and base == "student":
                assert q[i] == own
            elif hi - lo >= 2 and checked < 10 and t % 2 == 0:
                ref = run_policy(g, ForcedAfterTwin(wb, [*seq[:t], int(ids[i])]))
                assert q[i] == ref.num_batches, (t, int(ids[i]))
                checked += 1
        spread += q[lo:hi].min() != q[lo:hi].max()
        twin_rows.append(hi - lo)
    assert checked > 0 and spread > 0
    assert rows.shape == (int(ptr[-1]), len(FEATURES) + len(AFTER_FEATURES))


def test_labels_are_the_fewest_batch_types(graphs: list) -> None:
    inputs = [afterstate_inputs(g) for g in graphs]
    w = _student(2)
    x, seg, target, n = label_rollout(inputs, w, "student")
    assert n > 0 and seg.max() + 1 == n and len(x) == len(target)
    counts, hits = np.bincount(seg), np.bincount(seg, weights=target)
    assert (counts >= 2).all() and (hits >= 1).all() and (hits < counts).all()
    _rows, _, ptr, q, _ = afterstate_q(*inputs[0], w, w, 10_000)  # type: ignore[call-arg]
    want = [q[lo:hi] == q[lo:hi].min() for lo, hi in itertools.pairwise(ptr)
            if hi - lo >= 2 and q[lo:hi].min() < q[lo:hi].max()]
    first = seg < len(want)
    np.testing.assert_array_equal(target[first], np.concatenate(want))
    # "both": per type the fewer batches of the student's and critical path's rollouts
    qc = afterstate_q(*inputs[0], w, afterstate_start(), 10_000)[3]  # type: ignore[call-arg]
    qb = np.minimum(q, qc)
    wantb = [qb[lo:hi] == qb[lo:hi].min() for lo, hi in itertools.pairwise(ptr)
             if hi - lo >= 2 and qb[lo:hi].min() < qb[lo:hi].max()]
    _, segb, targetb, _ = label_rollout(inputs, w, "both")
    np.testing.assert_array_equal(targetb[segb < len(wantb)], np.concatenate(wantb))


def test_rounds_are_never_worse_and_deterministic(graphs: list) -> None:
    inputs = [afterstate_inputs(g) for g in graphs]
    w, b, _ = imitate(graphs, steps=(30, 200), priority_features=15, extra=["miss2"])
    active = lean_mask(15, ["miss2"])
    out = [api_rounds(inputs, w, b, 2, active, (30, 200), base="both", aggregate=True)
           for _ in range(2)]
    (w1, b1, rec), (w2, b2, _) = out
    assert np.array_equal(w1, w2) and b1 == b2 <= b
    assert b1 == int(population_afterstate(inputs, w1[None]).sum())
    assert not np.any(w1[~active])  # the lean variant stays lean
    assert [r["round"] for r in rec] == [1, 2] and all(r["base"] == "both" for r in rec)
    for r in rec:
        assert r["batches"] == min(r["candidates"])


def test_bad_arguments_name_the_value(graphs: list) -> None:
    inputs = [afterstate_inputs(g) for g in graphs[:1]]
    w = afterstate_start()
    with pytest.raises(ValueError, match=r"base must be .* got 'cp'"):
        label_rollout(inputs, w, "cp")
    with pytest.raises(ValueError, match=r"w must hold .* shape \(3,\)"):
        label_rollout(inputs, np.zeros(3))
    with pytest.raises(ValueError, match=r"rounds must be >= 0, got -1"):
        api_rounds(inputs, w, 0, -1, lean_mask(15), (5,))


def test_forced_trace_follows_another_schedules_decisions(graphs: list) -> None:
    """Along the policy's own decisions the forced trace is its trace; along a twin's
    schedule forced through a deviation it has that schedule's batches and op types."""
    w = _student(3)
    g = graphs[1]
    gi = afterstate_inputs(g)
    own = AfterstatePolicy(w)(g)
    seq = np.array([b.op_id for b in own.batches if not b.forced], np.int64)
    rows, ids, ptr, nb = afterstate_forced_trace(*gi, w, seq, 10_000)  # type: ignore[call-arg]
    trows, tids = afterstate_trace(*gi, w, 10_000)  # type: ignore[call-arg]
    assert nb == own.num_batches and len(ptr) == len(seq) + 1
    np.testing.assert_array_equal(rows, trows)
    np.testing.assert_array_equal(ids, tids)
    t = next(t for t in range(len(seq)) if ptr[t + 1] - ptr[t] >= 2)
    other = next(int(b) for b in ids[ptr[t]:ptr[t + 1]] if b != seq[t])
    ref = run_policy(g, ForcedAfterTwin(afterstate_start(), [*seq[:t].tolist(), other]))
    rseq = np.array([b.op_id for b in ref.batches if not b.forced], np.int64)
    rows2, ids2, ptr2, nb2 = afterstate_forced_trace(*gi, w, rseq, 10_000)  # type: ignore[call-arg]
    assert nb2 == ref.num_batches and len(ptr2) == len(rseq) + 1
    for u in range(len(rseq)):
        assert rseq[u] in ids2[ptr2[u]:ptr2[u + 1]].tolist()
    assert ptr2[t] == ptr[t] and np.array_equal(rows2[:ptr2[t]], trows[:ptr[t]])


def test_trainer_runs_the_rounds_after_the_imitation(graphs: list) -> None:
    from policies.afterstate_train import AfterstateTrainer

    kw = {"iterations": 0, "population": 2, "elite": 1, "imitate": True,
          "imitate_steps": (30, 200), "imitate_priority_features": 15,
          "extra_features": ("miss2",)}
    plain = AfterstateTrainer(**kw).fit(graphs[:2], graphs[2:]).policy  # type: ignore[arg-type]
    p = AfterstateTrainer(**kw, imitate_rounds=1, imitate_aggregate=True).fit(  # type: ignore[arg-type]
        graphs[:2], graphs[2:]).policy
    rounds = p.metadata["imitation"]["api_rounds"]
    assert len(rounds) == 1 and rounds[0]["base"] == "student"
    assert rounds[0]["fitted_decisions"] > rounds[0]["contested_decisions"] > 0  # aggregated
    assert p.metadata["train_batches"] <= plain.metadata["train_batches"]
    with pytest.raises(ValueError, match=r"imitate_base .* got 1, 'cp'"):
        AfterstateTrainer(imitate_rounds=1, imitate_base="cp")
