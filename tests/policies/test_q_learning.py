"""Tabular Q-learning: ED-Batch's behaviour on dumps, generalisation, resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import PolicyFileError
from edbatch.schedule import lower_bound
from edbatch.workloads.dumps import DumpWorkload
from edbatch.workloads.synthetic import random_lattices
from policies import QLearningConfig, evaluate_policy, train_q_table
from policies._q_checkpoint import load_checkpoint, pack_table, save_checkpoint, unpack_table
from policies.q_learning import _update


@pytest.mark.parametrize("encoding", ["base", "sorted", "max", "complete"])
def test_ed_batch_setting_reaches_lb_on_mvrnn_dumps(encoding: str) -> None:
    graphs = DumpWorkload("mvrnn_B1").graphs()
    result = train_q_table(graphs[:1], QLearningConfig(encoding=encoding))
    assert result.best_ratio < 1.01 and result.episodes == 50  # early stop at first eval
    _ratio, batches, lb = evaluate_policy(result.policy, graphs[1:])
    assert batches == lb == 108  # 9 test graphs x LB 12 (docs/architecture.md 3.11: every FSM = LB)


def test_bilstm_dumps_match_design_with_ed_batch_fallback() -> None:
    graphs = DumpWorkload("bilstm_B1").graphs()
    result = train_q_table(graphs[:1], QLearningConfig(encoding="base"))
    _, batches, lb = evaluate_policy(result.policy, graphs[1:])
    # docs/architecture.md 3.11, E_base
    assert round(batches / 9, 1) == 115.9 and round(lb / 9, 1) == 107.8


def test_multi_graph_training_with_typewise_fallback_reaches_lb_on_unseen() -> None:
    graphs = DumpWorkload("bilstm_B1").graphs()
    cfg = QLearningConfig(encoding="base", fallback="typewise_greedy")
    result = train_q_table(graphs[:3], cfg)
    ratio, _, _ = evaluate_policy(result.policy, graphs[3:])
    assert ratio == 1.0


def test_update_clipped_bootstrap_is_truncated_monte_carlo() -> None:
    cfg = QLearningConfig(n_step=2, alpha=1.0)
    states = [(0,), (1,), (2,)]
    q = {s: {s[0]: -5.0} for s in states}
    _update(q, states, [0, 1, 2], [-1.0, -0.5, -0.25], cfg)
    assert q[(0,)][0] == -1.5  # -1 - 0.5, then V(s2) clipped to max(0, -5) = 0
    q = {s: {s[0]: -5.0} for s in states}
    _update(q, states, [0, 1, 2], [-1.0, -0.5, -0.25], replace(cfg, clip_bootstrap=False))
    assert q[(0,)][0] == -6.5  # -1 - 0.5 + V(s2) = -5


def test_killed_run_resumes_from_checkpoint_and_ends_identical(tmp_path: Path) -> None:
    graphs = [random_lattices(np.random.default_rng(i), 4, 14, 4) for i in range(4)]
    cfg = QLearningConfig(max_episodes=40, eval_every=10, early_stop_ratio=0.0, seed=5)
    full = train_q_table(graphs, cfg)
    ckpt = tmp_path / "ckpt.json"

    def kill_at_25(row: dict) -> None:
        if row["episode"] == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_q_table(graphs, cfg, checkpoint=ckpt, callback=kill_at_25)
    resumed = train_q_table(graphs, cfg, checkpoint=ckpt)
    assert [r["episode"] for r in resumed.history] == list(range(21, 41))  # from episode 20
    assert resumed.policy.table == full.policy.table
    assert resumed.best_ratio == full.best_ratio
    with pytest.raises(PolicyFileError, match="another configuration"):
        train_q_table(graphs, replace(cfg, alpha=0.1), checkpoint=ckpt)
    ckpt.write_text("{broken")
    with pytest.raises(PolicyFileError, match="corrupt checkpoint"):
        train_q_table(graphs, cfg, checkpoint=ckpt)


def test_checkpoint_tables_are_packed_flat_and_damage_is_a_policy_file_error(tmp_path: Path
                                                                           ) -> None:
    """Tables travel as flat base64 arrays (a nested-list table cost ~25 KB of peak memory
    per state to write); every key, action and value comes back exactly, the empty table
    too, and a damaged or old-format table names the file and the fix."""
    q = {(3, 1, 4): {1: 0.5, 4: -1.25e-7}, (): {0: 2.0}, (2,) * 40: {}, (7, 8): {8: -3.0}}
    assert unpack_table(json.loads(json.dumps(pack_table(q)))) == q
    assert unpack_table(pack_table({})) == {}
    cfg = QLearningConfig(max_episodes=1, seed=1)
    rng = np.random.default_rng(0)
    ckpt = tmp_path / "ckpt.json"
    save_checkpoint(ckpt, cfg, q, {}, 1.5, 3, 0.2, 1.0, rng)
    got = load_checkpoint(ckpt, cfg, np.random.default_rng(9))
    assert got[:2] == (q, {}) and got[2:5] == (1.5, 3, 0.2)
    data = json.loads(ckpt.read_text())
    for damage in ({**data["q"], "values": data["q"]["values"][:-4]},  # one value short
                   {**data["q"], "keys": "not base64!"}, [[[1, 2], [[1, 0.5]]]]):
        ckpt.write_text(json.dumps({**data, "q": damage}))
        with pytest.raises(PolicyFileError, match="corrupt checkpoint.*delete it"):
            load_checkpoint(ckpt, cfg, rng)


def test_policy_beats_or_matches_heuristic_fallback_on_train() -> None:
    graphs = [random_lattices(np.random.default_rng(i), 6, 20, 4) for i in range(3)]
    result = train_q_table(graphs, QLearningConfig(max_episodes=100, fallback="typewise_greedy"))
    ratio, _batches, lb = evaluate_policy(result.policy, graphs)
    assert lb == sum(lower_bound(g) for g in graphs)
    assert ratio == pytest.approx(result.best_ratio)


def test_auto_fallback_picks_the_best_heuristic_on_validation_graphs() -> None:
    from edbatch.schedule import make_scheduler
    from policies.q_learning import AUTO_FALLBACKS, select_fallback

    graphs = DumpWorkload("bilstm_B1").graphs()[1:4]
    totals = {n: sum(make_scheduler(n)(g).num_batches for g in graphs) for n in AUTO_FALLBACKS}
    chosen = select_fallback(graphs, "hints")
    assert totals[chosen] == min(totals.values())
    result = train_q_table(graphs, QLearningConfig(fallback="auto", max_episodes=10))
    assert result.policy.fallback_name == chosen
    assert result.policy.metadata["config"]["fallback"] == chosen
