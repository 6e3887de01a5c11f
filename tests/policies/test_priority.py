"""The priority policy: compiled scorer vs its Python twin, critical path's weights, the CEM
trainer's guard, the JSON artifact and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import PolicyFileError
from edbatch.schedule import CriticalPathPolicy, lower_bound, make_scheduler, run_policy
from edbatch.schedule._compiled_priority import V2_FEATURES, V3_FEATURES
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_binary_trees, random_lattices
from experiments._learned import score_unseen
from policies.priority import (
    FEATURES,
    PriorityPolicy,
    PriorityTwin,
    critical_path_weights,
    num_params,
    population_batches,
    widen,
)
from policies.priority_train import PriorityTrainer, prune_hidden
from policies.user import load_policy
from tests.policies.conftest import same_schedule


@pytest.fixture(scope="module")
def graphs() -> list:
    """Real mini-batches (module networks: many op types; lattices) and random trees."""
    out = list(make_workload("module_net", granularity="cell").batches("test", 12, limit=2))
    out += list(make_workload("lattice_lstm").batches("train", 6, limit=1))
    out.append(random_binary_trees(np.random.default_rng(0), 6, 12))
    return out


@pytest.mark.parametrize("hidden", [0, 3])
def test_critical_path_weights_reproduce_critical_path(graphs: list, hidden: int) -> None:
    p = PriorityPolicy(critical_path_weights(hidden), hidden=hidden, learned=False)
    cp = make_scheduler("critical_path")
    for g in graphs:
        s = p(g)
        assert same_schedule(s, cp(g))
        assert same_schedule(s, run_policy(g, CriticalPathPolicy()))
    assert p.hits == 0 and p.misses > 0  # never overrides critical path


@pytest.mark.parametrize(("seed", "hidden"), [(0, 0), (1, 0), (2, 0), (0, 4), (1, 8)])
def test_compiled_scorer_equals_python_twin(graphs: list, seed: int, hidden: int) -> None:
    rng = np.random.default_rng(seed)
    w = critical_path_weights(hidden) + rng.normal(0.0, 0.7, num_params(hidden))
    p = PriorityPolicy(w, hidden=hidden)
    cp = make_scheduler("critical_path")
    differs = 0
    for g in graphs:
        s = p(g)
        assert same_schedule(s, run_policy(g, p.twin()))
        differs += s.num_batches != cp(g).num_batches
    assert p.hits > 0 and differs > 0  # the weights really override critical path


def test_training_is_never_worse_than_critical_path_on_validation() -> None:
    rng = np.random.default_rng(7)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    res = PriorityTrainer(iterations=4, population=8, elite=3, seed=1).fit(train, val)
    p, cp = res.policy, PriorityPolicy(critical_path_weights())
    val_new = sum(p(g).num_batches for g in val)
    val_cp = sum(cp(g).num_batches for g in val)
    assert val_new <= val_cp
    assert res.best_ratio == pytest.approx(val_new / sum(lower_bound(g) for g in val))
    if p.learned:
        assert sum(p(g).num_batches for g in train) < sum(cp(g).num_batches for g in train)
    else:
        assert np.array_equal(p.weights, critical_path_weights()) and p.num_states == 0


def test_training_learns_on_module_networks_and_is_deterministic(graphs: list) -> None:
    train, val = graphs[:1], graphs[1:2]
    a = PriorityTrainer(iterations=3, population=8, elite=3, seed=3).fit(train, val)
    b = PriorityTrainer(iterations=3, population=8, elite=3, seed=3).fit(train, val)
    assert np.array_equal(a.policy.weights, b.policy.weights)
    meta = a.policy.metadata
    assert meta["train_batches"] <= meta["train_fallback_batches"]
    assert a.policy.learned == (meta["train_batches"] < meta["train_fallback_batches"]
                                and meta["val_batches"] <= meta["val_fallback_batches"])
    u = score_unseen(a.policy, graphs[2:])
    assert u.fallback == "critical_path" and 0.0 <= u.hit_rate <= 1.0
    assert u.fallback_batches == sum(make_scheduler("critical_path")(g).num_batches
                                     for g in graphs[2:])


def test_mlp_training_is_deterministic_and_guarded(graphs: list) -> None:
    """``hidden_units > 0``: the MLP scorer trains from critical path (output weights 0), is
    deterministic, and its artifact keeps the layer."""
    train, val = graphs[:1], graphs[1:2]
    a = PriorityTrainer(iterations=2, population=6, elite=2, seed=5, hidden_units=2).fit(train, val)
    b = PriorityTrainer(iterations=2, population=6, elite=2, seed=5, hidden_units=2).fit(train, val)
    assert np.array_equal(a.policy.weights, b.policy.weights)
    meta = a.policy.metadata
    assert meta["hidden_searched"] == 2 and meta["val_batches"] <= meta["val_fallback_batches"]
    assert a.policy.hidden == meta["hidden"] == (2 if a.policy.learned else 0)  # CEM: all move
    assert len(a.policy.weights) == num_params(a.policy.hidden)


@pytest.mark.parametrize("zero", [[0, 1, 2], [1], []])
def test_prune_hidden_drops_the_units_with_zero_output_weight(graphs: list, zero: list) -> None:
    """Units with output weight 0 add nothing to any score: pruned, the same schedules; all
    pruned, a linear artifact (``hidden`` 0, no MLP cost per decision)."""
    nh, f = 3, len(FEATURES)
    w = critical_path_weights(nh) + np.random.default_rng(2).normal(0.0, 0.7, num_params(nh))
    w[[f + nh * (f + 1) + j for j in zero]] = 0.0
    wp, kept = prune_hidden(w, nh)
    assert kept == nh - len(zero) and len(wp) == num_params(kept)
    assert np.array_equal(wp[:f], w[:f])
    full, small = PriorityPolicy(w, hidden=nh), PriorityPolicy(wp, hidden=kept)
    for g in graphs:
        assert same_schedule(full(g), small(g))
    assert full.hits == small.hits > 0


def test_trainer_deploys_linear_weights_when_dagger_keeps_the_cems(graphs: list,
                                                                  monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``trainer=priority_dagger``'s MLP is a residual with output weights 0 until a DAgger
    round beats the CEM; when none does, the artifact is the CEM's linear weights."""
    kept = []

    def no_gain(self, train, w, progress):  # type: ignore[no-untyped-def]
        kept.append(w.copy())  # the CEM's best, its hidden units untouched
        return w, int(population_batches(train, w[None], self.hidden)[0].sum()), []

    monkeypatch.setattr(PriorityTrainer, "_dagger", no_gain)
    res = PriorityTrainer(iterations=2, population=6, elite=2, seed=5, hidden_units=4,
                          dagger_rounds=1).fit(graphs[:1], graphs[1:2])
    p, meta = res.policy, res.policy.metadata
    assert p.learned and p.hidden == meta["hidden"] == 0 and meta["hidden_searched"] == 4
    assert np.array_equal(p.weights, kept[0][:len(FEATURES)])
    mlp = PriorityPolicy(kept[0], hidden=4)
    assert all(same_schedule(p(g), mlp(g)) for g in graphs)


def test_no_search_keeps_critical_path_and_says_why(graphs: list) -> None:
    res = PriorityTrainer(iterations=0, seed=0).fit(graphs[:1], graphs[1:2])
    assert not res.policy.learned and res.policy.num_states == 0
    assert "critical path" in res.policy.metadata["learned_nothing"]


@pytest.mark.parametrize("hidden", [0, 2])
def test_artifact_round_trip(tmp_path: Path, graphs: list, hidden: int) -> None:
    w = critical_path_weights(hidden) + np.linspace(-0.3, 0.3, num_params(hidden))
    p = PriorityPolicy(w, hidden=hidden, metadata={"seed": 4})
    path = p.save(tmp_path / "policy.json")
    q = load_policy(path)
    assert isinstance(q, PriorityPolicy) and q.hidden == hidden
    assert np.array_equal(q.weights, p.weights) and q.metadata == {"seed": 4} and q.learned
    assert same_schedule(q(graphs[0]), p(graphs[0]))


def test_version_1_artifact_still_loads(tmp_path: Path, graphs: list) -> None:
    """A version-1 file (15 features, linear) scores with its weights, the newer features
    at 0: the same schedules as the padded weights."""
    w15 = critical_path_weights()[:15] + np.linspace(-0.3, 0.3, 15)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"format": "edbatch.priority", "version": 1,
                                "features": list(FEATURES[:15]), "weights": w15.tolist(),
                                "fallback": "critical_path", "learned": True,
                                "metadata": {}}))
    q = PriorityPolicy.load(path)
    assert q.hidden == 0 and np.array_equal(q.weights[:15], w15)
    assert not q.weights[15:].any() and len(q.weights) == len(FEATURES)
    ref = PriorityPolicy(np.concatenate([w15, np.zeros(len(FEATURES) - 15)]))
    assert same_schedule(q(graphs[0]), ref(graphs[0]))
    data = json.loads(path.read_text())
    data["weights"] = data["weights"][:14]
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match="version 1 needs 15 weights"):
        PriorityPolicy.load(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format="edbatch.fsm"), "format"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(version=3), "made for the features"),
    (lambda d: d.update(features=d["features"][:-1]), "made for the features"),
    (lambda d: d.update(weights=d["weights"][:3]), f"need {len(FEATURES)} finite weights"),
    (lambda d: d.update(weights=[float("nan")] * len(FEATURES)), "finite weights"),
    (lambda d: d.update(weights="abc"), "finite weights"),
    (lambda d: d.update(hidden=2), f"need {num_params(2)} finite weights"),
    (lambda d: d.update(hidden=-1), "hidden units must be an integer >= 0, got -1"),
    (lambda d: d.update(hidden="two"), "hidden units must be an integer"),
    # (were a raw TypeError, or read as numbers / as true)
    (lambda d: d.update(version=[4]), r"version \[4\]"),
    (lambda d: d.update(version=4.0), r"version 4\.0"),
    (lambda d: d.update(metadata=True), "metadata is True, not an object"),
    (lambda d: d.update(learned=10 ** 9), "learned is 1000000000, not true or false"),
    (lambda d: d["weights"].__setitem__(0, True), "finite weights"),
    (lambda d: d["weights"].__setitem__(0, "1.5"), "finite weights"),
])
def test_bad_artifact_is_a_clear_error(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = PriorityPolicy(critical_path_weights()).to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=message):
        PriorityPolicy.load(path)


def test_missing_or_corrupt_artifact(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="no such"):
        PriorityPolicy.load(tmp_path / "none.json")
    bad = tmp_path / "cut.json"
    bad.write_text('{"format": "edbatch.priority", "weights": [1')
    with pytest.raises(PolicyFileError, match="not a JSON"):
        PriorityPolicy.load(bad)


def test_bad_trainer_settings() -> None:
    with pytest.raises(ValueError, match="elite"):
        PriorityTrainer(population=4, elite=5)
    with pytest.raises(ValueError, match="hidden_units=-1"):
        PriorityTrainer(hidden_units=-1)
    with pytest.raises(ValueError, match="hidden units"):
        PriorityPolicy(critical_path_weights(), hidden=-2)


def test_user_api_trains_saves_loads_and_runs_a_priority_policy(tmp_path: Path) -> None:
    import torch
    from torch import nn

    from edbatch.api import DynamicBatch
    from policies import train_policy

    torch.manual_seed(0)
    batch = DynamicBatch()
    embed = nn.Embedding(20, 4)
    step = batch.cell(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), "step", [4], 4)
    other = batch.cell(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), "other", [4], 4)
    loss = batch.cell(lambda h: h.pow(2).sum(1), "sq", [4], ())

    def record(rng: np.random.Generator) -> None:
        for _ in range(8):
            with batch.instance():
                h = batch.lookup(embed, int(rng.integers(20)))
                for _ in range(int(rng.integers(1, 6))):
                    h = (step if rng.random() < 0.5 else other)(h)
                batch.add_loss(loss(h))

    graphs = []
    for s in range(3):
        record(np.random.default_rng(s))
        graphs.append(batch.graph())
        batch.discard()
    path = tmp_path / "policy.json"
    with pytest.warns(UserWarning, match="learned nothing"):  # critical path is at the LB
        policy = train_policy(graphs[:2], trainer="priority", val_graphs=graphs[2:],
                              path=path, iterations=2, population=4, elite=2)
    assert not policy.learned and policy.metadata["learned"] is False
    loaded = load_policy(path)
    assert isinstance(loaded, PriorityPolicy)
    assert np.array_equal(loaded.weights, policy.weights)
    record(np.random.default_rng(9))
    out = batch.run(loaded)
    out.schedule.validate(out.graph)
    record(np.random.default_rng(9))
    ref = batch.run("depth")
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-5)


@pytest.mark.slow
def test_module_net_benchmark_runs_a_priority_artifact(tmp_path: Path) -> None:
    """``--policy`` with critical path's weights: exactly critical path's batches."""
    from benchmarks.module_net_peers import main

    path = PriorityPolicy(critical_path_weights(), learned=False).save(tmp_path / "p.json")
    out = main(["--minibatches", "1", "--warmup", "0", "--batch-size", "16",
                "--hidden-dim", "8", "--split", "test", "--policy", str(path)])
    assert out["edbatch/learned"]["batches"] == out["edbatch/critical_path"]["batches"]


@pytest.mark.slow
def test_experiments_train_with_trainer_priority(tmp_path: Path) -> None:
    """``experiments.train trainer=priority`` saves the JSON artifact and prints the unseen
    report line; the artifact reads back and schedules validly."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "experiments.train", "workload=module_net", "trainer=priority",
         "num_train_graphs=1", "num_val_graphs=1", "batch_size=12", "num_eval_graphs=1",
         "trainer.iterations=2", "trainer.population=4", "trainer.elite=2",
         "trainer.best_heuristic=false",  # the weights' artifact (a replay wins this tiny run)
         "progress=false", f"run_dir={run_dir}"],
        cwd=root, env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(root)},
        text=True, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "unseen test mini-batches" in x)
    assert line.startswith("priority on 1 unseen test mini-batches: ") and "critical_path" in line
    p = PriorityPolicy.load(run_dir / "policy.json")
    assert p.metadata["workload"] == "module_net"
    assert p.metadata["learner"] == "cross-entropy method"
    g = next(iter(make_workload("module_net").batches("test", 12, limit=1)))
    p(g).validate(g)
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("hidden", [0, 2])
def test_version_2_artifact_still_loads(tmp_path: Path, graphs: list, hidden: int,
                                        version: int) -> None:
    """A version-2 (22 features) or 3 (23) file, linear or MLP, scores as before: its
    weights widened to every feature, the newer ones at 0 in the linear part and in each
    hidden unit."""
    rng = np.random.default_rng(hidden)
    old_features = V2_FEATURES if version == 2 else V3_FEATURES
    f = len(old_features)
    w = rng.normal(0.0, 0.5, f + hidden * (f + 2))
    w[0] += 2.0
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"format": "edbatch.priority", "version": version,
                                "features": list(old_features), "hidden": hidden,
                                "weights": w.tolist(), "fallback": "critical_path",
                                "learned": True, "metadata": {}}))
    q = PriorityPolicy.load(path)
    assert q.hidden == hidden and len(q.weights) == num_params(hidden)
    assert np.array_equal(q.weights, widen(w, f, hidden))
    x = rng.normal(size=(5, len(FEATURES)))  # the same scores as the 22-feature scorer
    twin, old = q.twin(), PriorityTwin(widen(w, f, hidden), hidden)
    for row in x:
        ref = float(row[:f] @ w[:f])
        for j in range(hidden):
            o = f + j * (f + 1)
            ref += w[f + hidden * (f + 1) + j] * max(0.0, float(row[:f] @ w[o:o + f] + w[o + f]))
        assert twin.score(row.tolist()) == pytest.approx(ref)
        assert twin.score(row.tolist()) == old.score(row.tolist())
    assert same_schedule(q(graphs[0]), run_policy(graphs[0], q.twin()))
    data = json.loads(path.read_text())
    data["weights"] = data["weights"][:-1]
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=f"version {version} needs"):
        PriorityPolicy.load(path)
