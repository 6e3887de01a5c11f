"""``replay:<heuristic>`` as an FSM fallback: artifacts, bad names, auto, the guard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import ConfigError, PolicyFileError, UnknownNameError
from edbatch.workloads.synthetic import random_dag, random_lattices
from policies import QLearningConfig, train_q_table
from policies.expert import ExpertConfig
from policies.fsm import FSMPolicy, make_fallback
from policies.guard import pick_fallback
from policies.q_learning import AUTO_FALLBACKS
from policies.table_search import table_batches

REPLAY = "replay:typewise_greedy_backward"


def _dags() -> list:
    """Two graphs on which replaying typewise_greedy_backward beats every forward rule
    (seed found once by search; the test below asserts it)."""
    rng = np.random.default_rng(162)
    return [random_dag(rng, 30, 3, 2, 0.0, None) for _ in range(2)]


def test_artifact_round_trip_keeps_the_replay_fallback(tmp_path: Path) -> None:
    g = random_lattices(np.random.default_rng(0), 3, 8, 4)
    p = FSMPolicy({(0, 1): 1}, "hints", g.vocab.names, REPLAY, {"note": "x"})
    path = p.save(tmp_path / "fsm.json")
    assert json.loads(path.read_text())["fallback"] == REPLAY
    q = FSMPolicy.load(path, g.vocab)
    assert (q.fallback_name, q.table, q.metadata) == (REPLAY, p.table, p.metadata)
    assert q.scheduler()(g).num_batches == p.scheduler()(g).num_batches


@pytest.mark.parametrize("bad", ["replay:typewise_greedy_backwards", "replay", "critical"])
def test_bad_fallback_in_a_file_names_the_value_and_the_choices(tmp_path: Path,
                                                               bad: str) -> None:
    g = random_lattices(np.random.default_rng(0), 2, 6, 3)
    data = FSMPolicy({}, "hints", g.vocab.names, "critical_path").to_json()
    data["fallback"] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=REPLAY) as e:
        FSMPolicy.load(path)
    assert repr(bad) in str(e.value) and "critical_path" in str(e.value)


def test_old_artifacts_with_forward_fallbacks_still_load(tmp_path: Path) -> None:
    g = random_lattices(np.random.default_rng(0), 2, 6, 3)
    data = FSMPolicy({}, "hints", g.vocab.names, "critical_path").to_json()
    del data["lookahead"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert FSMPolicy.load(path).fallback_name == "critical_path"


def test_bad_fallback_in_a_config_is_a_config_error() -> None:
    for cls in (QLearningConfig, ExpertConfig):
        with pytest.raises(ConfigError, match="replay:dynet_level_agenda") as e:
            cls(fallback="replay:nope")
        assert "trainer.fallback='replay:nope'" in str(e.value)
        assert cls(fallback=REPLAY).fallback == REPLAY
        assert cls(fallback="auto").fallback == "auto"
    with pytest.raises(UnknownNameError, match="replay:depth"):
        make_fallback("replay:nope", "hints")


def test_auto_picks_the_replay_where_it_is_best() -> None:
    graphs = _dags()
    scores = {n: table_batches({}, graphs, "hints", n) for n in AUTO_FALLBACKS}
    assert scores[REPLAY] < min(scores[n] for n in AUTO_FALLBACKS if n != REPLAY)
    assert pick_fallback(graphs, "hints", AUTO_FALLBACKS) == REPLAY


@pytest.mark.parametrize("fallback", [REPLAY, "auto"])
def test_guarded_q_learner_with_replay_never_ends_worse(fallback: str) -> None:
    train, val = _dags()[:1], _dags()[1:]
    rng = np.random.default_rng(3)
    train += [random_lattices(rng, 4, 10, 4)]
    val += [random_lattices(rng, 4, 10, 4)]
    cfg = QLearningConfig(encoding="hints", fallback=fallback, guard=True, warm_start=True,
                          fallback_snapshot=True, max_episodes=12, eval_every=6,
                          early_stop_ratio=0.0, guard_check=0, seed=0)
    p = train_q_table(train, cfg, val_graphs=val).policy
    if fallback == "auto":
        assert p.fallback_name in AUTO_FALLBACKS
    for graphs in (train, val):
        assert (table_batches(p.table, graphs, p.encoding, p.fallback_name)
                <= table_batches({}, graphs, p.encoding, p.fallback_name))
    g = p.metadata["guard"]
    assert g["kept"] == p.num_states and g["val_table"] <= g["val_fallback"]
