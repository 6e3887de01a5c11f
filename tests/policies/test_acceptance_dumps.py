"""Acceptance-style protocol on ED-Batch's dumps: train on the first graph(s), test on the rest,
mean over 5 seeds (slow: run with ``pytest -m slow``)."""

from __future__ import annotations

import statistics

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the env)
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS
from edbatch.workloads.dumps import DumpWorkload
from policies import QLearningConfig, evaluate_policy, train_q_table

EDBATCH = {"encoding": "hints", "fallback": "critical_path", "fallback_snapshot": True,
           "warm_start": True, "clip_bootstrap": False, "max_episodes": 300}


@pytest.mark.slow
@pytest.mark.parametrize("folder,k,bound", [("mvrnn_B1", 1, 1.0), ("bilstm_B1", 1, 1.01),
                                              ("bilstm_B1", 3, 1.01)])
def test_edbatch_learner_on_unseen_dumps_over_five_seeds(folder: str, k: int,
                                                        bound: float) -> None:
    """The trained artifact (table + fallback) meets the bound on unseen graphs. With this
    configuration the table may be empty: then the bound is met by the chosen fallback."""
    graphs = DumpWorkload(folder).graphs()
    ratios = []
    for seed in range(5):
        result = train_q_table(graphs[:k], QLearningConfig(seed=seed, **EDBATCH))
        ratios.append(evaluate_policy(result.policy, graphs[k:])[0])
    assert statistics.mean(ratios) <= bound


@pytest.mark.slow
@pytest.mark.parametrize("workload", [n for n in REAL_WORKLOADS
                                      if "primitive" in WORKLOADS[n].granularities])
def test_check_env_at_primitive_granularity(workload: str) -> None:
    split = WORKLOADS[workload].default_eval_split
    env = gym.make("edbatch/Batching-v0", workload=workload, split=split, batch_size=2,
                   granularity="primitive", on_invalid="noop")
    check_env(env.unwrapped, skip_render_check=True)
