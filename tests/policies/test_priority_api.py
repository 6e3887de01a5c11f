"""Rollout-based policy iteration for the priority policy (:mod:`policies.priority_api`):
the compiled rollout values equal the Python twin's schedules, the regret loss, and the
trainer stage that is never worse than the weights it starts from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority_q import priority_q
from edbatch.workloads.synthetic import random_lattices
from policies.priority import (
    FEATURES,
    PriorityPolicy,
    critical_path_weights,
    graph_inputs,
    num_params,
)
from policies.priority_api import best_w_scaled, decision_data, improve, regret_loss, unscale
from policies.priority_train import PriorityTrainer, searched
from tests.policies.conftest import ForcedTwin


@pytest.mark.parametrize("hidden", [0, 3])
def test_rollout_values_equal_the_twins_forced_schedules(lattice4, hidden: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(hidden)
    w = critical_path_weights(hidden) + rng.normal(0.0, 0.3, num_params(hidden))
    rows, ids, ptr, q, base = priority_q(*graph_inputs(lattice4), w, hidden, 10_000)
    own = PriorityPolicy(w, hidden=hidden)(lattice4)
    assert base == own.num_batches and len(ptr) - 1 == sum(not b.forced for b in own.batches)
    seq = [b.op_id for b in own.batches if not b.forced]
    checked = spread = 0
    for t in range(len(ptr) - 1):
        lo, hi = int(ptr[t]), int(ptr[t + 1])
        assert seq[t] in ids[lo:hi].tolist()  # the chosen type is among the ready ones
        for i in range(lo, hi):
            if ids[i] == seq[t]:
                assert q[i] == base
            elif checked < 12 and t % 3 == 0:
                ref = run_policy(lattice4, ForcedTwin(w, [*seq[:t], int(ids[i])], hidden))
                assert q[i] == ref.num_batches
                checked += 1
        spread += q[lo:hi].min() != q[lo:hi].max()
    assert checked > 0 and spread > 0
    assert rows.shape == (int(ptr[-1]), len(critical_path_weights()))


def test_regret_loss_prefers_the_scores_that_pick_the_best_type() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    seg = torch.tensor([0, 0, 1, 1])
    regret = torch.tensor([0.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    good = regret_loss(x, seg, regret, torch.tensor([5.0, 0.0], dtype=torch.float64), 0, 1.0)
    bad = regret_loss(x, seg, regret, torch.tensor([0.0, 5.0], dtype=torch.float64), 0, 1.0)
    even = regret_loss(x, seg, regret, torch.zeros(2, dtype=torch.float64), 0, 1.0)
    assert float(good) < float(even) < float(bad)
    assert float(even) == pytest.approx((1.0 + 0.5) / 2)  # p = 1/2 per type, mean of 2


@pytest.mark.parametrize("hidden", [0, 2])
def test_scaled_weights_give_the_same_scores(hidden: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=num_params(hidden))
    scale = rng.uniform(0.5, 4.0, len(critical_path_weights()))
    assert np.allclose(unscale(best_w_scaled(w, scale, hidden), scale, hidden), w)


def test_improve_is_never_worse_and_deterministic() -> None:
    rng = np.random.default_rng(3)
    graphs = [random_lattices(rng, 8, 16, 4) for _ in range(2)]
    inputs = [graph_inputs(g) for g in graphs]
    w0 = critical_path_weights()
    start = sum(PriorityPolicy(w0)(g).num_batches for g in graphs)
    x, seg, regret, total = decision_data(inputs, w0, 0)
    assert total == start and len(x) == len(seg) == len(regret)
    assert (regret >= 0).all() and (len(x) == 0 or regret.max() > 0)
    w, best, hist = improve(inputs, w0, 0, 2, seed=0)
    w2, best2, _ = improve(inputs, w0, 0, 2, seed=0)
    assert np.array_equal(w, w2) and best == best2
    assert best == sum(PriorityPolicy(w)(g).num_batches for g in graphs) <= start
    assert all(r.after <= r.before for r in hist)
    assert improve(inputs, w0, 0, 0)[1] == start  # no rounds: the start


def test_trainer_api_rounds_are_guarded_and_recorded() -> None:
    rng = np.random.default_rng(4)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    val = [random_lattices(rng, 6, 16, 4)]
    res = PriorityTrainer(iterations=1, population=4, elite=2, seed=0, api_rounds=1).fit(
        train, val)
    meta = res.policy.metadata
    assert len(meta["api_rounds"]) <= 1 and meta["val_batches"] <= meta["val_fallback_batches"]
    for r in meta["api_rounds"]:
        assert r["after"] <= r["before"]
    with pytest.raises(ValueError, match="api_rounds=-1"):
        PriorityTrainer(api_rounds=-1)


def test_priority_config_names_every_trainer_argument() -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = yaml.safe_load((root / "conf" / "trainer" / "priority.yaml").read_text())
    assert cfg["_target_"] == "policies.priority_train.PriorityTrainer"
    assert cfg["api_rounds"] == 0  # off by default: CEM alone, as before
    args = set(PriorityTrainer.__init__.__code__.co_varnames[1:PriorityTrainer.__init__
                                                             .__code__.co_argcount])
    assert set(cfg) - {"_target_"} == args


@pytest.mark.parametrize("hidden", [0, 2])
def test_far_is_searched_only_when_asked(hidden: int) -> None:
    """``far=False`` (the default) holds feature ``far``'s weights at 0, in the linear part
    and in every hidden unit, and searches every other parameter but the context features'
    (``context=False``); ``far=True, context=True`` all."""
    f, j = len(FEATURES), FEATURES.index("far")
    nc = f - FEATURES.index("is_cp")
    off = searched(hidden, False)
    assert searched(hidden, True, True).all() and (~off).sum() == (1 + nc) * (1 + hidden)
    assert (~searched(hidden, True)).sum() == nc * (1 + hidden)
    assert not off[j] and all(not off[f + u * (f + 1) + j] for u in range(hidden))
    rng = np.random.default_rng(6)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    held = PriorityTrainer(iterations=2, population=6, elite=2, seed=1, hidden_units=hidden,
                           api_rounds=1).fit(train, train).policy
    kept = searched(held.hidden, False)  # the artifact drops units left at output weight 0
    assert not held.weights[~kept].any() and held.metadata["far"] is False
    free = PriorityTrainer(iterations=2, population=6, elite=2, seed=1, hidden_units=hidden,
                           far=True).fit(train, train).policy
    assert free.metadata["far"] is True and (not free.learned or free.weights[j] != 0.0)
