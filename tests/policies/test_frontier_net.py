"""The frontier network: equivariance, masking, numpy/numba == torch, valid schedules, the
teacher's labels, the weight file, and a short DAgger run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from edbatch.errors import ConfigError, PolicyFileError
from edbatch.graph import Graph
from edbatch.schedule import CriticalPathPolicy, Frontier, run_policy
from edbatch.schedule.policy import drive
from edbatch.workloads.synthetic import random_dag, random_lattices
from policies._frontier_features import FEATURES, NUM_FEATURES, FeatureTracker
from policies._frontier_teacher import teacher_q
from policies.frontier_deploy import (
    FrontierNetPolicy,
    load_weights,
    numpy_scores,
    save_weights,
)
from policies.frontier_net import (
    FrontierNet,
    FrontierNetConfig,
    FrontierNetTrainer,
    distill_fsm,
    train_frontier_net,
)
from policies.fsm import FSMPolicy

CONF = Path(__file__).resolve().parents[2] / "conf" / "trainer" / "frontier_net.yaml"


def _net(seed: int = 0, hidden: int = 8) -> FrontierNet:
    torch.manual_seed(seed)
    return FrontierNet(hidden)


def _dag(seed: int = 0) -> Graph:
    return random_dag(np.random.default_rng(seed), 120, 5, 3, max_span=12)


def _states(graph: Graph) -> list[tuple[list[int], np.ndarray]]:
    """Feature rows of every decision of critical path's schedule of ``graph``."""
    tracker, out = FeatureTracker(), []
    cp = CriticalPathPolicy()

    def choose(f: Frontier) -> int:
        view = f.view()
        out.append(tracker.features(view))
        a = cp.choose(view)
        tracker.record(a)
        return a

    drive(Frontier(graph, typewise=True), choose)
    return out


def test_permuting_op_types_permutes_scores() -> None:
    net = _net()
    rng = np.random.default_rng(1)
    x = rng.random((6, NUM_FEATURES)).astype(np.float32)
    perm = rng.permutation(6)
    valid = torch.ones(1, 6, dtype=torch.bool)
    s = net(torch.from_numpy(x)[None], valid)[0].detach().numpy()
    sp = net(torch.from_numpy(x[perm])[None], valid)[0].detach().numpy()
    np.testing.assert_allclose(sp, s[perm], rtol=1e-5, atol=1e-6)
    w = net.export()
    np.testing.assert_allclose(numpy_scores(x[perm].astype(np.float64), w),
                               numpy_scores(x.astype(np.float64), w)[perm], atol=1e-9)
    # and padding rows (masked types) change nothing
    xp = np.concatenate([x, rng.random((3, NUM_FEATURES)).astype(np.float32)])
    vp = torch.tensor([[True] * 6 + [False] * 3])
    s2 = net(torch.from_numpy(xp)[None], vp)[0].detach().numpy()
    np.testing.assert_allclose(s2[:6], s, rtol=1e-5, atol=1e-6)
    assert np.all(np.isneginf(s2[6:]))


def test_masked_types_are_never_chosen() -> None:
    net = _net(2)
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.random((50, 7, NUM_FEATURES)).astype(np.float32)) * 5
    valid = torch.from_numpy(rng.random((50, 7)) < 0.4)
    valid[:, 0] = True
    s = net(x, valid)
    chosen = s.argmax(-1)
    assert valid[torch.arange(50), chosen].all()
    assert torch.softmax(s, -1)[~valid].abs().max() == 0
    policy = FrontierNetPolicy(net.export())
    for g in (_dag(0), random_lattices(np.random.default_rng(0), 4, 12, 3)):
        sched = run_policy(g, policy)  # an unready choice would raise InvalidActionError
        sched.validate(g)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_deployment_chooses_as_the_torch_model(backend: str) -> None:
    net = _net(4)
    w = net.export()
    policy = FrontierNetPolicy(w, backend)
    compared = 0
    for ready, x in _states(_dag(1)):
        if len(ready) < 2:
            continue
        with torch.no_grad():
            s = net(torch.from_numpy(x)[None], torch.ones(1, len(ready), dtype=torch.bool))[0]
        s = s.double().numpy()
        np.testing.assert_allclose(numpy_scores(x.astype(np.float64), w), s, atol=1e-5)
        top = np.sort(s)[-2:]
        if top[1] - top[0] > 1e-4:  # a clear winner: every implementation picks it
            from policies.frontier_deploy import _best_row
            idx = (_best_row(x.astype(np.float64), *policy._args) if backend == "numba"
                   else int(np.argmax(numpy_scores(x.astype(np.float64), w))))
            assert idx == int(np.argmax(s))
            compared += 1
    assert compared > 10


def test_features_name_ready_types_and_critical_paths_pick() -> None:
    g = _dag(2)
    f = Frontier(g, typewise=True)
    tracker, cp = FeatureTracker(), CriticalPathPolicy()
    seen = 0
    while not f.done:
        while f.pop_forced() is not None:
            pass
        if f.done:
            break
        view = f.view()
        ready, x = tracker.features(view)
        assert ready == view.ready_ops and x.shape == (len(ready), len(FEATURES))
        pick = cp.choose(view)
        assert x[:, FEATURES.index("cp_pick")].tolist() == [float(a == pick) for a in ready]
        assert np.all(x[:, FEATURES.index("gap0")] <= 1) and x[:, FEATURES.index("gap0")].any()
        f.pop(pick)
        tracker.record(pick)
        seen += 1
    assert seen > 5


def _complete_cp(frontier: Frontier) -> list:
    cp = CriticalPathPolicy()
    return drive(frontier, lambda f: cp.choose(f.view()))


def test_teacher_q_is_the_one_step_rollout_of_critical_path() -> None:
    g = _dag(3)
    decisions = [b.op_id for b in run_policy(g, CriticalPathPolicy()).batches if not b.forced]
    q = teacher_q(g, decisions)
    assert q.shape == (len(decisions), len(g.vocab))
    f = Frontier(g, typewise=True)
    for i, a_taken in enumerate(decisions[:8]):
        while f.pop_forced() is not None:
            pass
        for a in range(len(g.vocab)):
            if a in f.view().ready_ops:
                trial = f.copy()
                trial.pop(a)
                rest = _complete_cp(trial)
                assert q[i, a] == f.num_batches + 1 + len(rest)
            else:
                assert q[i, a] == -1
        f.pop(a_taken)


def test_weight_file_round_trip_and_clear_errors(tmp_path: Path) -> None:
    w = _net(5).export()
    path = save_weights(tmp_path / "w.npz", w, {"seed": 5})
    back, meta = load_weights(path)
    assert meta == {"seed": 5}
    for k in w:
        np.testing.assert_array_equal(back[k], w[k])
    g = _dag(4)
    assert (run_policy(g, FrontierNetPolicy.load(path)).num_batches
            == run_policy(g, FrontierNetPolicy(w)).num_batches)
    with pytest.raises(PolicyFileError, match="no such weight file"):
        load_weights(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(PolicyFileError, match="not a frontier-network weight file"):
        load_weights(bad)
    small = dict(w, W1=w["W1"][:-1])  # made for one feature fewer
    header = {"format": "edbatch.frontier_net", "version": 1, "features": list(FEATURES)}
    np.savez(tmp_path / "shape.npz", header=np.array(json.dumps(header)), **small)
    with pytest.raises(PolicyFileError, match="array W1 has shape"):
        load_weights(tmp_path / "shape.npz")
    np.savez(tmp_path / "feat.npz", header=np.array(
        '{"format": "edbatch.frontier_net", "version": 1, "features": ["x"]}'), **w)
    with pytest.raises(PolicyFileError, match="made for the features"):
        load_weights(tmp_path / "feat.npz")
    np.savez(tmp_path / "fmt.npz", header=np.array('{"format": "edbatch.fsm"}'), **w)
    with pytest.raises(PolicyFileError, match="is not 'edbatch.frontier_net'"):
        load_weights(tmp_path / "fmt.npz")


def test_short_dagger_run_and_distillation() -> None:
    rng = np.random.default_rng(0)
    train = [random_lattices(rng, 6, 14, 3) for _ in range(2)]
    val = [random_lattices(rng, 6, 14, 3)]
    res = train_frontier_net(train, FrontierNetConfig(hidden=8, rounds=2, epochs=5, augment=2),
                             val_graphs=val)
    assert len(res.history) <= 2 and res.val_ratio >= 1.0
    for g in val:
        run_policy(g, res.net).validate(g)
    fsm, tried = distill_fsm(res.net, train, val, ("expert", "tie"))
    assert isinstance(fsm, FSMPolicy) and set(tried) == {"expert", "tie"}
    assert tried[fsm.encoding] == min(tried.values())
    fsm.scheduler()(val[0]).validate(val[0])
    trainer = FrontierNetTrainer(hidden=8, rounds=1, epochs=5, augment=0,
                                 distill_encodings=["expert"])
    out = trainer.fit(train, val)
    assert isinstance(out.policy, FSMPolicy) and trainer.net is not None
    assert out.policy.metadata["fsm_val_ratio"] == out.best_ratio >= 1.0


def test_trainer_config_file_and_bad_values() -> None:
    hp = yaml.safe_load(CONF.read_text())
    hp.pop("_target_")
    hp["seed"] = 0
    trainer = FrontierNetTrainer(**hp)
    assert trainer.config.distill_encodings[0] == "expert"
    with pytest.raises(ConfigError, match="trainer.hidden"):
        FrontierNetConfig(hidden=0)
    with pytest.raises(ConfigError, match="trainer.rounds"):
        FrontierNetConfig(rounds=0)


@pytest.mark.parametrize("tau", [0.0, 0.5])
def test_fit_lowers_the_imitation_loss(tau: float) -> None:
    from policies.frontier_net import Samples, _fit, collect

    g = random_lattices(np.random.default_rng(5), 6, 14, 3)
    data = Samples()
    decisions, added = collect(g, CriticalPathPolicy(), data)
    assert decisions > 0 and added == len(data) > 0
    assert all(gap.min() == 0 and gap.max() > 0 for gap in data.gap)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        short = _fit(_net(0, 8), data, FrontierNetConfig(hidden=8, epochs=1, tau=tau))
        long = _fit(_net(0, 8), data, FrontierNetConfig(hidden=8, epochs=40, tau=tau))
    finally:
        torch.set_num_threads(threads)
    assert long < short
