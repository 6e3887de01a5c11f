"""The neural route: an imitation-learned network, distilled to an FSM table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.errors import ConfigError, PolicyFileError
from edbatch.schedule import run_policy
from edbatch.workloads.synthetic import random_binary_trees, random_lattices
from policies import FSMPolicy
from policies.imitation import (
    ImitationConfig,
    ImitationTrainer,
    NetPolicy,
    _net,
    distill,
    load_network,
    train_imitation,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = {"budget": 3000, "label_budget": 3000, "augment": 2, "dagger_rounds": 1,
        "epochs": 5, "exact_max_nodes": 0, "fallback": "critical_path"}


def _ops(graph, policy) -> list[int]:
    return [b.op_id for b in run_policy(graph, policy).batches]


def _lattices(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [random_lattices(rng, 4, 8, 3) for _ in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    graphs = _lattices(0, 3)
    folder = tmp_path_factory.mktemp("imitation")
    trainer = ImitationTrainer(seed=0, **TINY)
    rows: list[dict] = []
    result = trainer.fit(graphs[:2], graphs[2:], checkpoint=folder / "checkpoint.json",
                         callback=rows.append)
    return graphs, trainer, result, rows, folder


def test_training_on_tiny_graphs_gives_a_non_empty_table_and_a_network(trained) -> None:
    graphs, trainer, result, rows, _ = trained
    fsm = result.policy
    assert fsm.num_states > 0 and fsm.encoding == "expert"
    assert fsm.fallback_name == "critical_path"
    assert [r["episode"] for r in rows] == [1, 2]  # behaviour cloning, one DAgger round
    assert result.best_ratio == min(r["eval/ratio_to_lb"] for r in rows)
    assert rows[1]["train/samples"] > rows[0]["train/samples"]  # DAgger adds labels
    for key in ("net_ratio", "teacher_ratio", "fallback_ratio", "train_seconds", "samples"):
        assert key in fsm.metadata
    assert fsm.metadata["net_ratio"] >= 1.0 and result.best_ratio >= 1.0
    for g in graphs:  # both schedule every graph legally
        run_policy(g, trainer.network).validate(g)
        run_policy(g, fsm).validate(g)
    fsm.reset_stats()
    run_policy(graphs[0], fsm)  # a training graph: the table answers most decisions
    assert fsm.hit_rate > 0.5


def test_network_round_trips_through_network_pt(trained) -> None:
    graphs, trainer, _, _, folder = trained
    loaded = load_network(folder / "network.pt")
    for g in graphs:
        assert _ops(g, loaded) == _ops(g, trainer.network)
    with pytest.raises(PolicyFileError, match="no such network file"):
        load_network(folder / "missing.pt")
    (folder / "bad.pt").write_bytes(b"junk")
    with pytest.raises(PolicyFileError, match="not an edbatch imitation network"):
        load_network(folder / "bad.pt")


def test_distilled_artifact_round_trip(trained, tmp_path) -> None:
    graphs, _, result, _, _ = trained
    path = result.policy.save(tmp_path / "policy.json")
    loaded = FSMPolicy.load(path, graphs[0].vocab)
    assert loaded.table == result.policy.table and loaded.fallback_name == "critical_path"
    for g in graphs:
        assert _ops(g, loaded) == _ops(g, result.policy)


def test_same_seed_same_table_bytes(trained, tmp_path) -> None:
    graphs, _, result, _, _ = trained
    again = ImitationTrainer(seed=0, **TINY).fit(graphs[:2], graphs[2:])
    a = result.policy.save(tmp_path / "a.json").read_text()
    b = again.policy.save(tmp_path / "b.json").read_text()
    strip = lambda s: s.split('"metadata"')[0]  # noqa: E731 - train_seconds differ
    assert strip(a) == strip(b) and again.policy.table == result.policy.table


def test_unseen_state_goes_to_the_fallback(trained) -> None:
    from edbatch.schedule import CriticalPathPolicy, Frontier
    from edbatch.schedule.policy import drive
    from envs.encoding import encode_state

    fsm = result_policy = trained[2].policy
    other = random_lattices(np.random.default_rng(99), 6, 12, 4)  # bigger than training
    half = FSMPolicy(dict(list(fsm.table.items())[::2]), fsm.encoding, fsm.op_names,
                     fsm.fallback_name)  # every other key dropped: more unseen states
    unseen = 0

    def choose(f: Frontier) -> int:
        nonlocal unseen
        view = f.view()
        key = encode_state(view, result_policy.encoding)
        a = half.choose(view)
        if key in half.table:
            assert a == half.table[key]
        else:
            unseen += 1
            assert a == CriticalPathPolicy().choose(view)
        return a

    drive(Frontier(other, typewise=True), choose)
    assert unseen > 0 and half.misses == unseen


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), trees=st.booleans())
def test_network_masked_action_is_always_legal(seed: int, trees: bool) -> None:
    """An untrained network (random weights) only ever picks ready batchable types."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    g = (random_binary_trees(rng, num_trees=3, max_leaves=6) if trees
         else random_lattices(rng, 3, 6, 3))
    net = NetPolicy(_net(len(g.vocab), ImitationConfig(seed=seed % 7, hidden=8)))
    run_policy(g, net).validate(g)  # run_policy raises on a masked choice


def test_distill_keeps_the_networks_majority_action_per_key() -> None:
    from collections import Counter

    from edbatch.schedule import Frontier
    from edbatch.schedule.policy import drive
    from envs.encoding import encode_state

    g = _lattices(3, 1)[0]
    net = NetPolicy(_net(len(g.vocab), ImitationConfig(seed=1, hidden=8)))
    seen: dict[tuple[int, ...], Counter[int]] = {}

    def choose(f: Frontier) -> int:
        a = net.choose(f.view())
        seen.setdefault(encode_state(f.view(), "expert"), Counter())[a] += 1
        return a

    drive(Frontier(g, typewise=True), choose)
    fsm = distill(net, [g], "expert", "critical_path")
    assert fsm.num_states == len(seen) > 0
    for key, votes in seen.items():
        top = max(votes.values())
        assert fsm.table[key] == min(a for a, n in votes.items() if n == top)


def test_empty_training_set_is_refused() -> None:
    from edbatch.errors import GraphError

    with pytest.raises(GraphError, match="at least one training graph"):
        train_imitation([], ImitationConfig())


def test_config_composes_and_checks_ranges() -> None:
    from hydra import compose, initialize_config_dir

    import experiments  # noqa: F401 - registers the schemas
    from experiments._schema import validate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["trainer=imitation"])
        bad = compose(config_name="train", overrides=["trainer=imitation",
                                                      "trainer.dagger_rounds=-1"])
    validate(cfg)
    assert cfg.trainer._target_ == "policies.imitation.ImitationTrainer"
    with pytest.raises(ConfigError, match="trainer.dagger_rounds=-1"):
        validate(bad)
