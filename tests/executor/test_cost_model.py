"""The measured cost model: calibration on tiny sizes, the fit, JSON files, the env reward,
and the schedulers that minimise modelled time. No assertion is about how fast anything is."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
from edbatch.executor import init_params
from edbatch.executor.cost_model import (
    CostModel,
    CostModelFileError,
    OpCost,
    calibrate,
    isotonic,
    load_cost_model,
    measure_schedule_ms,
)
from edbatch.executor.cost_schedule import CostGreedyPolicy, cost_rollout_schedule
from edbatch.schedule import CriticalPathPolicy, make_scheduler, run_policy
from edbatch.workloads.lattice import LatticeLSTM
from edbatch.workloads.tree_lstm import TreeLSTM

SIZES = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def tiny() -> tuple[TreeLSTM, list, CostModel]:
    """A primitive Tree-LSTM of width 8, two dev graphs, and its calibrated model."""
    torch.set_num_threads(1)
    wl = TreeLSTM(granularity="primitive", embed_dim=8, hidden_dim=8)
    graphs = list(wl.batches("dev", 2, limit=2))
    return wl, graphs, calibrate(wl, batch_sizes=SIZES, reps=2, graphs=graphs[:1],
                                 launch_reps=1)


def test_calibration_models_every_op_type_finite_and_non_decreasing(tiny) -> None:
    wl, _, model = tiny
    assert set(model.ops) == set(wl.vocab.names)
    for name, cost in model.ops.items():
        assert cost.sizes == list(SIZES)
        assert all(math.isfinite(v) and v > 0 for v in cost.ms), name
        values = [model(name, n) for n in (1, 2, 3, 4, 6, 8, 16, 64)]
        assert all(math.isfinite(v) for v in values)
        assert values == sorted(values), (name, values)  # more nodes never model cheaper
    assert model.launch_ms >= 0
    assert model.meta["launch_fit"]["batches"] > 0
    for key in ("device", "torch_version", "date", "dtype", "sizes", "workload"):
        assert model.meta[key], key
    assert model.meta["sizes"] == {"embed_dim": 8, "hidden_dim": 8}


def test_json_round_trip_gives_the_same_model(tiny, tmp_path: Path) -> None:
    wl, _, model = tiny
    path = model.save(tmp_path / "sub" / "cm.json")
    loaded = load_cost_model(path, wl.vocab, device="cpu")
    assert loaded.to_dict() == model.to_dict()
    for op in wl.vocab:
        for n in (1, 3, 8, 100):
            assert loaded(op, n) == pytest.approx(model(op, n))


def test_fit_interpolates_extrapolates_and_smooths() -> None:
    cost = OpCost("affine", [1, 2, 4], [1.0, 3.0, 2.0])  # noisy middle point
    assert isotonic([1.0, 3.0, 2.0]).tolist() == [1.0, 2.5, 2.5]
    assert cost(1) == 1.0 and cost(2) == 2.5 and cost(3) == 2.5
    assert cost(8) == pytest.approx(2.5 + cost.slope_ms * 4)
    model = CostModel({"a": cost}, launch_ms=0.5)
    assert model("a", 1) == 1.5
    with pytest.raises(KeyError, match="no op type 'b'"):
        model("b", 1)
    with pytest.raises(ValueError, match="must increase"):
        OpCost("x", [2, 1], [1.0, 1.0])


def test_bad_files_name_the_file_and_the_fix(tiny, tmp_path: Path) -> None:
    _, _, model = tiny
    with pytest.raises(CostModelFileError, match=r"missing\.json: no such cost-model file.*"
                                                  r"experiments\.calibrate"):
        load_cost_model(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelFileError, match="bad.json: not valid JSON"):
        load_cost_model(bad)
    bad.write_text(json.dumps({"format": "edbatch-fsm-policy"}))
    with pytest.raises(CostModelFileError, match="not an edbatch cost model"):
        load_cost_model(bad)
    data = model.to_dict()
    bad.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(CostModelFileError, match="schema version 99"):
        load_cost_model(bad)
    broken = json.loads(json.dumps(data))
    next(iter(broken["ops"].values()))["ms"] = [1.0]
    bad.write_text(json.dumps(broken))
    with pytest.raises(CostModelFileError, match="malformed field"):
        load_cost_model(bad)
    path = model.save(tmp_path / "ok.json")
    other = LatticeLSTM(granularity="primitive", embed_dim=8, hidden_dim=8)
    with pytest.raises(CostModelFileError, match=r"ok\.json: calibrated for workload "
                                                  r"'tree_lstm'.*lacks op types"):
        load_cost_model(path, other.vocab)
    cuda = json.loads(path.read_text())
    cuda["device"] = "cuda:0"
    bad.write_text(json.dumps(cuda))
    with pytest.raises(CostModelFileError, match="calibrated on device 'cuda:0'.*uses 'cpu'"):
        load_cost_model(bad, device="cpu")


def test_env_cost_model_reward_is_minus_the_model(tiny, tmp_path: Path) -> None:
    wl, graphs, model = tiny
    path = model.save(tmp_path / "cm.json")
    for hook in (model, str(path)):
        env = envs.BatchingEnv(graphs=graphs, reward="cost_model", cost_model=hook)
        _, info = env.reset(seed=0)
        total, done, steps = 0.0, False, 0
        while not done:
            f = env.frontier
            a = int(np.flatnonzero(info["action_mask"])[-1])
            expected = -model(wl.vocab[a], f.count(a))
            _, r, done, _, info = env.step(a)
            assert r == pytest.approx(expected)
            total, steps = total + r, steps + 1
        assert steps > 3 and total < 0
    other = LatticeLSTM(granularity="primitive", embed_dim=8, hidden_dim=8)
    lattice = next(iter(other.batches("dev", 2, limit=1)))
    with pytest.raises(CostModelFileError, match="lacks op types"):
        envs.BatchingEnv(graphs=[lattice], reward="cost_model", cost_model=path)


def test_modelled_time_of_a_schedule_is_the_sum_over_its_batches(tiny) -> None:
    wl, graphs, model = tiny
    s = make_scheduler("depth")(graphs[0])
    expected = sum(model(wl.vocab[b.op_id], len(b)) for b in s.batches)
    assert model.schedule_ms(s, wl.vocab) == pytest.approx(expected)
    params = init_params(wl, torch.Generator().manual_seed(0))
    measured = measure_schedule_ms(graphs[0], s, params, reps=2, stat="min")
    assert math.isfinite(measured) and measured > 0


def test_cost_schedulers_are_valid_and_rollout_never_costs_more_than_its_base(tiny) -> None:
    wl, graphs, model = tiny
    for g in graphs:
        greedy = run_policy(g, CostGreedyPolicy(model, wl.vocab))
        greedy.validate(g)
        base = run_policy(g, CriticalPathPolicy())
        roll = cost_rollout_schedule(g, model, [CriticalPathPolicy], budget=20_000)
        roll.validate(g)
        assert model.schedule_ms(roll, wl.vocab) <= model.schedule_ms(base, wl.vocab) + 1e-9


def test_cost_rollout_follows_the_model_not_the_batch_count() -> None:
    """A model where one op type is free: the rollout prefers more batches of it."""
    wl = TreeLSTM(granularity="primitive", embed_dim=4, hidden_dim=4)
    g = next(iter(wl.batches("dev", 3, limit=1)))
    free = {n for n in wl.vocab.names if n.startswith("slice")}

    def cost(op, n: int) -> float:
        return 0.0 if op.name in free else 1.0

    roll = cost_rollout_schedule(g, cost, [CriticalPathPolicy], budget=50_000)
    roll.validate(g)
    non_free = sum(1 for b in roll.batches if g.vocab[b.op_id].name not in free)
    base = run_policy(g, CriticalPathPolicy())
    assert non_free <= sum(1 for b in base.batches if g.vocab[b.op_id].name not in free)


def test_calibrate_rejects_bad_arguments(tiny) -> None:
    wl, _, _ = tiny
    with pytest.raises(ValueError, match="batch_sizes must be positive"):
        calibrate(wl, batch_sizes=[0, 2])
    with pytest.raises(KeyError, match="unknown timing statistic 'mean'"):
        calibrate(wl, batch_sizes=[1], stat="mean")
