"""The residual guard: RL learners start from the fallback and never end worse than it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from edbatch.workloads.synthetic import random_lattices
from policies import QLearningConfig, train_q_table
from policies.guard import fallback_choices, guard_table, q_proposals, vote_proposals
from policies.sb3 import MaskablePPOTrainer, SB3Policy, clone_fallback
from policies.table_search import policy_votes, table_batches


def _lattices(seeds: range) -> list:
    return [random_lattices(np.random.default_rng(s), 6, 16, 4) for s in seeds]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_guard_keeps_only_entries_that_pay_and_never_ends_worse(seed: int) -> None:
    train, val = _lattices(range(seed, seed + 3)), _lattices(range(50 + seed, 52 + seed))
    enc, fb = "hints", "critical_path"
    choices = fallback_choices(train, enc, fb)
    rng = np.random.default_rng(seed)
    # random proposals: every visited state with a random other action of its key
    proposals = []
    for key in sorted(choices):
        acts = sorted({a for a in key if a >= 0} - set(choices[key]))
        if acts:
            proposals.append((key, int(rng.choice(acts))))
    table, rep = guard_table(proposals, train, val, enc, fb)
    assert rep.train_fallback == table_batches({}, train, enc, fb)
    assert rep.val_fallback == table_batches({}, val, enc, fb)
    assert rep.train_table == table_batches(table, train, enc, fb) <= rep.train_fallback
    assert rep.val_table == table_batches(table, val, enc, fb) <= rep.val_fallback
    assert rep.kept == len(table) and set(table.items()) <= set(proposals)
    # every kept entry pays: dropping it would not lower the training batches
    assert (rep.train_table < rep.train_fallback) == bool(table)
    assert (rep.reason() is None) == bool(table)


def test_guard_with_nothing_to_propose_says_why() -> None:
    train, val = _lattices(range(3)), _lattices(range(50, 52))
    table, rep = guard_table([], train, val, "hints", "critical_path")
    assert table == {} and rep.proposals == rep.evaluations == rep.kept == 0
    assert "never disagreed" in rep.reason()
    props = [(k, 0) for k in fallback_choices(train, "hints", "critical_path")][:3]
    _, rep = guard_table(props, train, val, "hints", "critical_path", max_evals=0)
    assert "guard_max_evals=0" in rep.reason()


def test_q_proposals_rank_learned_advantages_and_skip_untried_actions() -> None:
    fb = {(0, 1, 2): Counter({1: 3}), (0, 2): Counter({2: 1})}
    q = {(0, 1, 2): {0: -4.0, 1: -5.0, 2: -0.01},  # 2 untried (warm-start value)
         (0, 2): {0: -1.0, 2: -3.0},              # advantage 2 at a visited state
         (1, 2): {1: -2.0, 2: -2.5}}              # a state the fallback never visits
    assert q_proposals(q, fb) == [((0, 2), 0), ((0, 1, 2), 0), ((1, 2), 1)]
    assert q_proposals(q, fb, margin=1.5) == [((0, 2), 0)]


def test_vote_proposals_skip_what_the_fallback_always_does() -> None:
    fb = {(0, 1): Counter({0: 4}), (1, 2): Counter({1: 2, 2: 2})}
    votes = {(0, 1): Counter({0: 9}), (1, 2): Counter({1: 5}), (0, 2): Counter({2: 7})}
    assert vote_proposals(votes, fb) == [((0, 2), 2), ((1, 2), 1)]


def test_guarded_q_learning_is_no_worse_than_its_fallback_and_records_it() -> None:
    train, val = _lattices(range(4)), _lattices(range(60, 62))
    cfg = QLearningConfig(encoding="hints", fallback="auto", warm_start=True,
                          fallback_snapshot=True, guard=True, max_episodes=30, eval_every=10,
                          early_stop_ratio=0.0, seed=3)
    res = train_q_table(train, cfg, val_graphs=val)
    p = res.policy
    g = p.metadata["guard"]
    assert p.fallback_name in ("critical_path", "typewise_greedy", "dynet_agenda",
                               "ed_batch_agenda")
    assert g["kept"] == p.num_states and g["train_table"] <= g["train_fallback"]
    assert table_batches(p.table, train, "hints", p.fallback_name) == g["train_table"]
    assert table_batches(p.table, val, "hints", p.fallback_name) == g["val_table"] \
        <= g["val_fallback"]
    assert p.metadata["q_states"] > 0
    assert ("learned_nothing" in p.metadata) == (p.num_states == 0)


def test_guarded_q_learning_on_graphs_at_lb_says_so() -> None:
    from edbatch.workloads.dumps import DumpWorkload

    graphs = DumpWorkload("mvrnn_B1").graphs()  # critical path meets LB on every dump
    cfg = QLearningConfig(encoding="hints", fallback="critical_path", warm_start=True,
                          fallback_snapshot=True, guard=True)
    p = train_q_table(graphs[:2], cfg, val_graphs=graphs[2:3]).policy
    assert p.num_states == 0 and "lower bound" in p.metadata["learned_nothing"]


@pytest.mark.parametrize(("observation", "least"), [("base", 0.6), ("critical", 0.95)])
def test_behaviour_cloning_makes_ppo_start_as_its_fallback(observation: str, least: float
                                                           ) -> None:
    torch.set_num_threads(1)
    train = _lattices(range(3))
    t = MaskablePPOTrainer(total_timesteps=64, seed=0, n_steps=64, batch_size=32,
                           observation=observation)
    model = t._make_model(t._env(train))
    fb_votes = policy_votes(_fb(), train, "hints")

    def agreement() -> float:
        net = policy_votes(SB3Policy(model, observation), train, "hints")
        same = sum(min(c[a], fb_votes.get(k, Counter())[a]) for k, c in net.items() for a in c)
        return same / sum(sum(c.values()) for c in fb_votes.values())

    before = agreement()
    acc = clone_fallback(model.policy, train, "critical_path", "hints", 40, 3e-3, 0,
                         observation=observation)
    assert acc >= least and acc > before
    assert agreement() > before


def _fb():  # type: ignore[no-untyped-def]
    from policies.fsm import make_fallback

    return make_fallback("critical_path", "hints")


def test_guarded_ppo_is_no_worse_than_its_fallback() -> None:
    torch.set_num_threads(1)
    train, val = _lattices(range(3)), _lattices(range(70, 72))
    t = MaskablePPOTrainer(total_timesteps=256, seed=1, n_steps=128, batch_size=64,
                           fallback="critical_path", warm_start_epochs=5, guard=True,
                           eval_points=1)
    p = t.fit(train, val).policy
    g = p.metadata["guard"]
    assert 0.0 <= p.metadata["warm_start_accuracy"] <= 1.0
    assert table_batches(p.table, train, "hints", "critical_path") == g["train_table"] \
        <= g["train_fallback"] == table_batches({}, train, "hints", "critical_path")
    assert table_batches(p.table, val, "hints", "critical_path") <= g["val_fallback"]


def test_guard_check_graphs_join_the_validation_graphs() -> None:
    """``guard_check``: mini-batches resampled from the training instances are held out too
    (with one training graph validated on itself nothing else is)."""
    from edbatch.schedule import lower_bound
    from policies.resample import resample_graphs

    train, val = _lattices(range(4)), _lattices(range(60, 61))
    cfg = QLearningConfig(encoding="hints", fallback="critical_path", warm_start=True,
                          guard=True, max_episodes=20, eval_every=10, early_stop_ratio=0.0,
                          seed=3, guard_check=3)
    p = train_q_table(train, cfg, val_graphs=val).policy
    g = p.metadata["guard"]
    held = [*val, *resample_graphs(train, 3, np.random.default_rng(4))]
    assert len(held) == 4 and g["val_lb"] == sum(lower_bound(x) for x in held)
    assert g["val_table"] == table_batches(p.table, held, "hints", "critical_path") \
        <= g["val_fallback"] == table_batches({}, held, "hints", "critical_path")
