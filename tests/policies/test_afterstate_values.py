"""Fitted action values for the afterstate policy: the labels are the rollout teacher's
values (its choices are their zeros), the ridge fit recovers a known value function whatever
each decision's constant, the trainer's ``imitate_target="values"`` deploys that fit."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.workloads import make_workload
from policies.afterstate import (
    NUM_WEIGHTS,
    AfterstatePolicy,
    afterstate_inputs,
    afterstate_start,
    population_afterstate,
)
from policies.afterstate_imitate import imitate, label_critical_path, lean_mask
from policies.afterstate_train import AfterstateTrainer
from policies.afterstate_values import fit_values, label_values, value_ridge


@pytest.fixture(scope="module")
def graphs() -> list:
    """Four lattice-LSTM mini-batches of 6, on which the fit beats critical path."""
    return list(make_workload("lattice_lstm").batches("train", 6, limit=4))


def test_values_label_the_teachers_states_and_choices(graphs: list) -> None:
    x, seg, v, n = label_values([afterstate_inputs(g) for g in graphs])
    xc, segc, target, nc = label_critical_path(graphs)
    assert n == nc > 0
    np.testing.assert_array_equal(seg, segc)
    np.testing.assert_array_equal(x, xc)
    np.testing.assert_array_equal(v == 0, target)   # the choices are the fewest batches
    assert (v >= 0).all() and np.array_equal(v, np.round(v))
    assert (np.bincount(seg, v > 0) >= 1).all()     # contested: some type costs more


def test_ridge_recovers_a_linear_value_whatever_the_decisions_constant() -> None:
    rng = np.random.default_rng(3)
    n = 300
    seg = np.repeat(np.arange(n), rng.integers(2, 5, n))
    x = rng.normal(size=(len(seg), NUM_WEIGHTS))
    active = lean_mask(15, ["miss2"])
    beta = np.where(active, rng.normal(size=NUM_WEIGHTS), 0.0)
    v = x @ beta + rng.normal(scale=50.0, size=n)[seg]   # a constant per decision
    got = value_ridge(x, seg, v, n, active, [0.0, 1.0])
    np.testing.assert_allclose(got[0], beta, atol=1e-9)
    assert not got[1][~active].any() and np.abs(got[1]).sum() < np.abs(beta).sum()
    # row weights: all ones is the unweighted fit; noise in down-weighted decisions hardly
    # moves it (they are centred on their own, so the other decisions' rows are unchanged)
    ones = value_ridge(x, seg, v, n, active, [1.0], np.ones(len(seg)))[0]
    np.testing.assert_allclose(ones, got[1], rtol=1e-9, atol=1e-12)
    hit = seg % 7 == 0
    noisy, wt = v + np.where(hit, rng.normal(scale=1e3, size=len(seg)), 0.0), np.where(
        hit, 1e-12, 1.0)
    np.testing.assert_allclose(value_ridge(x, seg, noisy, n, active, [0.0], wt)[0], beta,
                               atol=1e-6)
    with pytest.raises(ValueError, match=r"lams must be .*\[-1\.0\]"):
        value_ridge(x, seg, v, n, active, [-1.0])
    with pytest.raises(ValueError, match=r"one length.*\(10,\)"):
        value_ridge(x, seg[:10], v, n, active)


def test_value_fit_is_deterministic_never_worse_and_runs_the_least_value(graphs: list) -> None:
    inputs = [afterstate_inputs(g) for g in graphs]
    active = lean_mask(None, ["all"])
    w, batches, rec = fit_values(inputs, active)
    w2, batches2, _ = fit_values(inputs, active)
    assert np.array_equal(w, w2) and batches == batches2
    assert batches == int(population_afterstate(inputs, w[None]).sum())
    assert batches < rec["critical_path_batches"], "the value fit beats cp on these graphs"
    lab = label_values(inputs)
    want = -value_ridge(*lab, active, [rec["lam_kept"]])[0]
    np.testing.assert_array_equal(w, want)
    # not the choices' imitation: other weights, other schedules
    wi, _, _ = imitate(graphs, steps=(30, 200), extra=["all"])
    assert not np.allclose(w, wi)


def test_trainer_deploys_the_value_fit(graphs: list, tmp_path) -> None:  # type: ignore[no-untyped-def]
    inputs = [afterstate_inputs(g) for g in graphs[:3]]
    w, batches, _ = fit_values(inputs, lean_mask(None, ["all"]))
    p = AfterstateTrainer(iterations=0, population=2, elite=1, imitate=True,
                          extra_features=["all"], imitate_target="values").fit(
        graphs[:3], graphs[3:]).policy
    m = p.metadata
    assert m["learner"] == "value fit, then cross-entropy method"
    assert m["imitation"]["target"] == "values (ridge regression)"
    assert m["train_batches"] == batches
    assert np.array_equal(p.weights, w if p.learned else afterstate_start())
    p.save(tmp_path / "p.json")
    q = AfterstatePolicy.load(tmp_path / "p.json")
    assert np.array_equal(q.weights, p.weights)
    assert [q(g).num_batches for g in graphs] == [p(g).num_batches for g in graphs]


def test_bad_target_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"imitate_target .* got 'value'"):
        AfterstateTrainer(imitate=True, imitate_target="value")
    with pytest.raises(ValueError, match=r"got 'values', imitate_rounds=2"):
        AfterstateTrainer(imitate=True, imitate_target="values", imitate_rounds=2)


@pytest.mark.slow
def test_experiments_train_with_trainer_afterstate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``experiments.train trainer=afterstate`` (the value fit by default) saves its JSON
    artifact and prints the unseen report line; ``load_policy`` reads it back as the
    afterstate policy, which schedules validly; a truncated file is a ``PolicyFileError``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from edbatch.errors import PolicyFileError
    from policies import load_policy

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "experiments.train", "workload=lattice_lstm",
         "trainer=afterstate", "num_train_graphs=2", "num_val_graphs=1", "batch_size=6",
         "num_eval_graphs=1", "progress=false", f"run_dir={run_dir}"],
        cwd=root, env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(root)},
        text=True, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "unseen test mini-batches" in x)
    assert line.startswith("afterstate on 1 unseen test mini-batches: ")
    p = load_policy(run_dir / "policy.json")
    assert isinstance(p, AfterstatePolicy)
    assert p.metadata["imitation"]["target"] == "values (ridge regression)"
    assert p.metadata["workload"] == "lattice_lstm"
    g = next(iter(make_workload("lattice_lstm").batches("test", 6, limit=1)))
    p(g).validate(g)
    bad = tmp_path / "bad.json"
    bad.write_text((run_dir / "policy.json").read_text()[:-20])
    with pytest.raises(PolicyFileError, match="bad.json"):
        load_policy(bad)
