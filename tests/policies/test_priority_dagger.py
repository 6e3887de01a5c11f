"""DAgger for the priority policy (:mod:`policies.priority_dagger`): the teacher's rollout
values over another base policy equal the Python twin's schedules, the labels are the
fewest-batch types, the classification loss, and the learner that is never worse than the
weights it starts from, deterministic, and wired into the guarded trainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority_q import priority_q, priority_q_base
from edbatch.workloads.synthetic import random_lattices
from policies.priority import (
    FEATURES,
    PriorityPolicy,
    critical_path_weights,
    graph_inputs,
    num_params,
)
from policies.priority_dagger import _fit, choice_loss, dagger, label
from policies.priority_train import PriorityTrainer, searched
from tests.policies.conftest import ForcedTwin


def test_teacher_values_complete_with_the_base_policy(lattice4) -> None:  # type: ignore[no-untyped-def]
    """States are the student's, completions the base's (here critical path): each value
    equals the twin forced through the student's prefix and the type, then critical path."""
    rng = np.random.default_rng(2)
    w = critical_path_weights(2) + rng.normal(0.0, 0.3, num_params(2))
    cp = critical_path_weights()
    _, ids, ptr, q, base = priority_q_base(*graph_inputs(lattice4), w, 2, cp, 0, 10_000)
    own = PriorityPolicy(w, hidden=2)(lattice4)
    assert base == own.num_batches
    seq = [b.op_id for b in own.batches if not b.forced]
    checked = 0
    for t in range(0, len(ptr) - 1, 4):
        lo, hi = int(ptr[t]), int(ptr[t + 1])
        if hi - lo < 2:
            continue
        for i in range(lo, hi):  # the student's own choice too: completed by the base
            ref = run_policy(lattice4, ForcedTwin(cp, [*seq[:t], int(ids[i])]))
            assert q[i] == ref.num_batches
            checked += 1
        if checked >= 10:
            break
    assert checked > 0
    same = priority_q_base(*graph_inputs(lattice4), w, 2, w, 2, 10_000)
    ref = priority_q(*graph_inputs(lattice4), w, 2, 10_000)
    assert all(np.array_equal(a, b) for a, b in zip(same[:4], ref[:4])) and same[4] == ref[4]


def test_labels_are_the_fewest_batch_types(lattice4) -> None:  # type: ignore[no-untyped-def]
    g = graph_inputs(lattice4)
    cp = critical_path_weights()
    _, seg, target, spread, total, agree = label([g], cp, 0, "critical_path")
    _, _, ptr, q, _ = priority_q_base(*g, cp, 0, cp, 0, 10_000)
    contested = sum(q[ptr[t]:ptr[t + 1]].min() != q[ptr[t]:ptr[t + 1]].max()
                    for t in range(len(ptr) - 1) if ptr[t + 1] - ptr[t] >= 2)
    assert total == PriorityPolicy(cp)(lattice4).num_batches
    assert int(seg.max()) + 1 == contested == len(spread) and 0 <= agree <= contested
    for d in range(contested):  # every decision has a choice and a non-choice
        t = target[seg == d]
        assert t.any() and not t.all() and spread[d] > 0
    both = label([g], cp, 0, "both")
    assert len(both[0]) > 0
    with pytest.raises(ValueError, match="teacher must be one of"):
        label([g], cp, 0, "oracle")


def test_choice_loss_prefers_scores_on_the_teachers_choice() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    seg = torch.tensor([0, 0, 1, 1])
    target = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    good = choice_loss(x, seg, target, torch.tensor([5.0, 0.0], dtype=torch.float64), 0)
    bad = choice_loss(x, seg, target, torch.tensor([0.0, 5.0], dtype=torch.float64), 0)
    even = choice_loss(x, seg, target, torch.zeros(2, dtype=torch.float64), 0)
    assert float(good) < float(even) < float(bad)
    assert float(even) == pytest.approx(float(np.log(2.0)))
    weight = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert float(choice_loss(x, seg, target, torch.zeros(2, dtype=torch.float64), 0,
                             weight)) == pytest.approx(float(np.log(2.0)))


@pytest.mark.parametrize("hidden", [0, 2])
def test_dagger_is_never_worse_and_deterministic(hidden: int) -> None:
    rng = np.random.default_rng(3)
    graphs = [random_lattices(rng, 8, 16, 4) for _ in range(2)]
    inputs = [graph_inputs(g) for g in graphs]
    w0 = critical_path_weights(hidden)
    start = sum(PriorityPolicy(w0, hidden=hidden)(g).num_batches for g in graphs)
    w, best, hist = dagger(inputs, w0, hidden, 2, steps=(5, 20), seed=0, weighting="spread")
    w2, best2, _ = dagger(inputs, w0, hidden, 2, steps=(5, 20), seed=0, weighting="spread")
    assert np.array_equal(w, w2) and best == best2
    assert best == sum(PriorityPolicy(w, hidden=hidden)(g).num_batches for g in graphs)
    assert best <= start and len(hist) <= 2
    assert all(r.aggregated >= r.labelled for r in hist)
    frozen = np.zeros(num_params(hidden), np.bool_)
    frozen[1] = True  # only the fill weight may move
    wf, _, _ = dagger(inputs, w0, hidden, 1, steps=(5,), active=frozen)
    assert np.array_equal(np.delete(wf, 1), np.delete(w0, 1))
    with pytest.raises(ValueError, match="weighting must be one of"):
        dagger(inputs, w0, hidden, 1, weighting="loud")


@pytest.mark.parametrize("first", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_trainer_dagger_is_guarded_and_recorded(first: bool) -> None:
    rng = np.random.default_rng(4)
    train = [random_lattices(rng, 5, 12, 4) for _ in range(2)]
    val = [random_lattices(rng, 5, 12, 4)]
    res = PriorityTrainer(iterations=1, population=4, elite=2, seed=0, hidden_units=2,
                          dagger_rounds=1, dagger_teacher="both",
                          dagger_first=first).fit(train, val)
    meta = res.policy.metadata
    assert meta["dagger"]["teacher"] == "both" and meta["dagger"]["first"] is first
    assert len(meta["dagger"]["rounds"]) <= 1
    assert meta["val_batches"] <= meta["val_fallback_batches"] or not res.policy.learned
    assert meta["train_batches"] <= meta["train_fallback_batches"]


def test_context_weights_are_held_at_zero_unless_asked_for(tmp_path: Path) -> None:
    """``context=False`` leaves the context features' weights 0 (linear part and hidden
    units); ``context=True`` lets DAgger fit them, and that artifact runs compiled as its
    Python twin does and round-trips."""
    f = len(FEATURES)
    c0 = FEATURES.index("is_cp")
    for ctx in (False, True):
        act = searched(2, False, ctx)
        cols = [c0, *(f + u * (f + 1) + c0 for u in range(2))]
        assert act[cols].all() == ctx and act[0] and not act[FEATURES.index("far")]
    rng = np.random.default_rng(4)
    train = [random_lattices(rng, 5, 12, 4) for _ in range(2)]
    x, seg, tg, _, _, _ = label([graph_inputs(g) for g in train], critical_path_weights(2), 2,
                                "critical_path")
    for ctx in (False, True):
        w = _fit(x, seg, tg, None, critical_path_weights(2), 2, [50], 1e-3, 0.01,
                 searched(2, False, ctx))[0]
        assert np.any(w[c0:f]) == ctx and np.any(w[:c0])
    p = PriorityPolicy(w, hidden=2)
    q = PriorityPolicy.load(p.save(tmp_path / "ctx.json"))
    assert np.array_equal(q.weights, w)
    for g in train:
        assert q(g).num_batches == run_policy(g, q.twin()).num_batches
    res = PriorityTrainer(iterations=1, population=4, elite=2, seed=0, hidden_units=2,
                          dagger_rounds=1).fit(train, train[:1])
    assert res.policy.metadata["context"] is False
    ws = res.policy.weights
    nh = res.policy.hidden
    assert not ws[c0:f].any() and not any(ws[f + u * (f + 1) + c0:f + u * (f + 1) + f].any()
                                          for u in range(nh))


def test_trainer_rejects_bad_dagger_arguments() -> None:
    with pytest.raises(ValueError, match="dagger_teacher='search'"):
        PriorityTrainer(dagger_rounds=1, dagger_teacher="search")
    with pytest.raises(ValueError, match="dagger_rounds=-2"):
        PriorityTrainer(dagger_rounds=-2)


def test_dagger_config_is_the_priority_trainer_with_dagger_on() -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = yaml.safe_load((root / "conf" / "trainer" / "priority_dagger.yaml").read_text())
    assert cfg["_target_"] == "policies.priority_train.PriorityTrainer"
    assert cfg["dagger_rounds"] > 0
    args = set(PriorityTrainer.__init__.__code__.co_varnames[1:PriorityTrainer.__init__
                                                             .__code__.co_argcount])
    assert set(cfg) - {"_target_"} <= args


def test_label_stride_keeps_the_rollouts_within_the_budget() -> None:
    """The teacher's rollouts (each a whole schedule) are thinned to every s-th contested
    decision only past the budget: 3 contested decisions of 2, 3 and 4 ready types (one
    with a single type) on 10 nodes, 4 decisions, 5 types: 9 rollouts x (10 + 4 x 5)."""
    from edbatch.schedule._compiled_priority_q import LABEL_BUDGET, label_stride

    ptr = np.array([0, 2, 3, 6, 10], np.int64)
    work = 9 * (10 + 4 * 5)
    assert [label_stride(ptr, 10, 5, b) for b in (work, work - 1, work // 2, work // 3,
                                                  10**9)] == [1, 2, 2, 3, 1]
    assert label_stride(np.zeros(1, np.int64), 10, 5, 1) == 1  # no decision at all
    assert LABEL_BUDGET >= 10**9  # (real cell-level mini-batches: <= 2e7, labelled in full)
