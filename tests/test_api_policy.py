"""Training and using an FSM batching policy for a user's own model (edbatch.api)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch
from edbatch.errors import GraphError, PolicyFileError, UnknownNameError
from edbatch.schedule import lower_bound
from policies import load_policy, train_policy

ROOT = Path(__file__).resolve().parents[1]


class Chains:
    """A toy model: per instance a chain of ``step`` cells over words, a loss at the end,
    plus a ``mix`` cell joining two chains (two op types to choose between)."""

    def __init__(self, order: tuple[str, ...] = ("step", "mix")) -> None:
        torch.manual_seed(0)
        self.batch = DynamicBatch()
        self.embed = nn.Embedding(20, 4)
        mods = {"step": nn.Sequential(nn.Linear(4, 4), nn.Tanh()), "mix": nn.Linear(8, 4)}
        self.mods = mods
        cells = {}
        for name in order:
            shapes = [4] if name == "step" else [4, 4]
            module = mods[name] if name == "step" else _Cat(mods[name])
            cells[name] = self.batch.cell(module, name, shapes, 4)
        self.step, self.mix = cells["step"], cells["mix"]
        self.loss = self.batch.cell(lambda h: h.pow(2).sum(1), "sq", [4], ())

    def record(self, rng: np.random.Generator, n: int) -> None:
        for _ in range(n):
            with self.batch.instance():
                a = self.batch.lookup(self.embed, int(rng.integers(20)))
                b = self.batch.lookup(self.embed, int(rng.integers(20)))
                for _ in range(int(rng.integers(1, 6))):
                    a = self.step(a)
                for _ in range(int(rng.integers(1, 4))):
                    b = self.step(b)
                self.batch.add_loss(self.loss(self.step(self.mix(a, b))))

    def graphs(self, count: int, seed: int = 0) -> list:
        rng, out = np.random.default_rng(seed), []
        for _ in range(count):
            self.record(rng, 8)
            out.append(self.batch.graph())
            self.batch.discard()
        return out


class _Cat(nn.Module):
    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([a, b], 1))


def test_train_save_load_and_run_a_policy_for_an_own_model(tmp_path: Path) -> None:
    model = Chains()
    pairs = model.graphs(4)
    path = tmp_path / "policy.json"
    policy = train_policy(pairs[:2], trainer="ed_batch", val_graphs=pairs[2:], path=path,
                          max_episodes=30)
    assert path.is_file() and policy.num_states > 0
    assert policy.op_names == pairs[0][0].vocab.names
    loaded = load_policy(path)
    assert loaded.table == policy.table
    rng = np.random.default_rng(7)
    model.record(rng, 8)
    out = model.batch.run(loaded)
    assert loaded.hits > 0  # the learned table made decisions
    out.schedule.validate(out.graph)
    assert out.num_batches >= lower_bound(out.graph)
    model.record(np.random.default_rng(7), 8)
    ref = model.batch.run("depth")
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-5)


def test_default_trainer_is_edbatch_learner_with_rollout(tmp_path: Path) -> None:
    model = Chains()
    graphs = [g for g, _ in model.graphs(3, seed=1)]
    with pytest.warns(UserWarning, match="learned nothing"):  # the fallback meets the LB
        policy = train_policy(graphs[:2], val_graphs=graphs[2:], max_episodes=20)
    assert policy.lookahead == "rollout" and policy.encoding == "hints"
    assert policy.metadata["best_ratio"] >= 1.0
    model.record(np.random.default_rng(3), 4)
    assert model.batch.run(policy).loss is not None


def test_a_policy_matches_op_types_by_name(tmp_path: Path) -> None:
    policy = train_policy(Chains().graphs(1), trainer="ed_batch", max_episodes=5)
    other = Chains(order=("mix", "step"))  # same cells, other registration order
    other.record(np.random.default_rng(0), 2)
    out = other.batch.run(policy)
    out.schedule.validate(out.graph)
    other.record(np.random.default_rng(0), 2)
    assert out.loss.item() == pytest.approx(other.batch.run("depth").loss.item(), rel=1e-6)


def test_train_policy_errors() -> None:
    model = Chains()
    graphs = model.graphs(1)
    with pytest.raises(GraphError, match="at least one graph"):
        train_policy([])
    with pytest.raises(GraphError, match="not a Graph"):
        train_policy(["graph.json"])
    with pytest.raises(UnknownNameError, match="Did you mean 'ed_batch'"):
        train_policy(graphs, trainer="ed_bach")
    with pytest.raises(UnknownNameError, match="max_episode"):
        train_policy(graphs, trainer="ed_batch", max_episode=3)
    with pytest.raises(PolicyFileError, match="no such policy file"):
        load_policy("missing/policy.json")


def test_own_model_example_trains_with_its_policy(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("own_model", ROOT / "examples" / "own_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "policy.json"
    result = module.main(["--trees", "96", "--batch-size", "32", "--epochs", "2",
                          "--episodes", "10", "--policy", str(path)])
    assert path.is_file()
    assert result["losses"][1] < result["losses"][0]
    assert all(r >= 1.0 for r in result["ratio_to_lb"])
