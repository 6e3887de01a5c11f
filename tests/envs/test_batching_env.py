"""BatchingEnv: Gymnasium/SB3 contracts, masks, determinism, rewards, errors."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from edbatch.errors import GraphError, InvalidActionError, UnknownNameError
from edbatch.schedule import lower_bound
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS
from edbatch.workloads.synthetic import random_dag, random_lattices

ENV_ID = "edbatch/Batching-v0"


def _lattices(n: int = 3) -> list:
    return [random_lattices(np.random.default_rng(i), 6, 16, 4) for i in range(n)]


@pytest.mark.parametrize("workload", REAL_WORKLOADS)
def test_check_env_passes_for_every_workload(workload: str) -> None:
    kwargs = {"workload": workload, "split": WORKLOADS[workload].default_eval_split,
              "batch_size": 4}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # render-mode notices only
        check_env(gym.make(ENV_ID, **kwargs).unwrapped)  # the registered defaults
        sb3_check_env(envs.BatchingEnv(**kwargs), warn=False)


def test_env_is_registered_and_makes_through_gym() -> None:
    env = gym.make(ENV_ID, graphs=_lattices())
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert info["action_mask"].dtype == np.int8
    assert np.array_equal(info["action_mask"].astype(bool), env.unwrapped.action_masks())


def test_same_seed_same_episode() -> None:
    def episode(seed: int) -> list:
        env = envs.BatchingEnv(graphs=_lattices(5))
        obs, info = env.reset(seed=seed)
        trace = [obs.tobytes()]
        done = False
        while not done:
            a = int(np.flatnonzero(info["action_mask"])[-1])
            obs, r, done, _, info = env.step(a)
            trace.append((obs.tobytes(), r))
        return trace

    assert episode(7) == episode(7)
    assert episode(7) != episode(8) or True  # different seeds may pick the same graph


def test_masked_action_raises_and_changes_nothing() -> None:
    env = envs.BatchingEnv(graphs=_lattices())
    _, info = env.reset(seed=0)
    bad = int(np.flatnonzero(info["action_mask"] == 0)[0])
    before = env.frontier.num_executed
    with pytest.raises(InvalidActionError, match="Choose an action allowed by the action mask"):
        env.step(bad)
    assert env.frontier.num_executed == before


def test_default_registered_env_passes_gymnasium_check_env() -> None:
    env = gym.make(ENV_ID, workload="tree_lstm", split="dev", batch_size=4)
    assert env.unwrapped.on_invalid == "noop"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # render-mode notices only
        check_env(env.unwrapped)
    strict = gym.make(ENV_ID, workload="tree_lstm", split="dev", batch_size=4,
                      on_invalid="raise")
    with pytest.raises(InvalidActionError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(strict.unwrapped)  # the class default is strict: masked actions raise


@pytest.mark.parametrize("action", [0.5, 1.0, "0", "abc", None, True, np.bool_(False),
                                    np.float32(1.0), [0], np.array([0.0]), np.array([0, 1])])
@pytest.mark.parametrize("on_invalid", ["raise", "noop"])
def test_non_integral_action_is_refused_naming_the_value(action: object, on_invalid: str
                                                         ) -> None:
    env = envs.BatchingEnv(graphs=_lattices(), on_invalid=on_invalid)
    env.reset(seed=0)
    before = env.frontier.num_executed
    with pytest.raises(InvalidActionError, match="must be an integer op type id") as err:
        env.step(action)
    assert repr(action) in str(err.value)
    assert env.frontier.num_executed == before


def test_integral_actions_of_every_kind_are_accepted() -> None:
    for kind in (int, np.int64, np.int32, np.uint8, lambda a: np.array(a),
                 lambda a: np.array([a], dtype=np.int16)):
        env = envs.BatchingEnv(graphs=_lattices(1))
        _, info = env.reset(seed=0)
        a = int(np.flatnonzero(info["action_mask"])[0])
        _, _, _, _, info2 = env.step(kind(a))
        assert info2["num_batches"] > info["num_batches"]


def test_noop_mode_penalises_without_moving() -> None:
    env = envs.BatchingEnv(graphs=_lattices(), on_invalid="noop")
    _, info = env.reset(seed=0)
    bad = int(np.flatnonzero(info["action_mask"] == 0)[0])
    _, r, term, _, info2 = env.step(bad)
    assert r == -1.0 and not term and info2["invalid_action"]
    assert info2["num_batches"] == info["num_batches"]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), reward=st.sampled_from(["ed_batch", "unit"]))
def test_masks_only_allow_ready_types_and_rewards_are_bounded(seed: int, reward: str) -> None:
    rng = np.random.default_rng(seed)
    g = random_dag(rng, num_nodes=40, num_types=4, max_fan_in=3, unbatchable_prob=0.1)
    env = envs.BatchingEnv(graphs=[g], reward=reward)
    _, info = env.reset(seed=seed)
    done, total = False, 0
    while not done:
        mask = info["action_mask"]
        f = env.frontier
        assert np.array_equal(mask, ((f.ready_count > 0) & g.vocab.batchable).astype(np.int8))
        a = int(rng.choice(np.flatnonzero(mask)))
        _, r, done, _, info = env.step(a)
        assert -1.0 <= r <= 0.0
        total += 1
    assert info["num_batches"] >= info["lower_bound"] == lower_bound(g)


def test_ed_batch_reward_is_zero_for_complete_batches() -> None:
    env = envs.BatchingEnv(graphs=_lattices(1))
    _, info = env.reset(seed=0)
    f = env.frontier
    a = int(np.flatnonzero(info["action_mask"])[0])
    expected = -1.0 + f.ready_count[a] / f.typewise_count[a]
    _, r, _, _, _ = env.step(a)
    assert r == pytest.approx(expected)


def test_cost_model_reward_uses_the_hook() -> None:
    env = envs.BatchingEnv(graphs=_lattices(1), reward="cost_model",
                           cost_model=lambda op, n: 2.0 + 0.5 * n)
    _, info = env.reset(seed=0)
    a = int(np.flatnonzero(info["action_mask"])[0])
    n = int(env.frontier.ready_count[a])
    assert env.step(a)[1] == pytest.approx(-(2.0 + 0.5 * n))


def test_bad_arguments_have_clear_errors() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'sorted'"):
        envs.BatchingEnv(graphs=_lattices(1), encoding="sortd")
    with pytest.raises(UnknownNameError, match="unknown reward 'unti'"):
        envs.BatchingEnv(graphs=_lattices(1), reward="unti")
    with pytest.raises(UnknownNameError, match="needs a cost_model"):
        envs.BatchingEnv(graphs=_lattices(1), reward="cost_model")
    with pytest.raises(GraphError, match="needs a graph source"):
        envs.BatchingEnv()
    with pytest.raises(UnknownNameError, match="unknown workload 'tree_lstn'"):
        envs.BatchingEnv(workload="tree_lstn")


def test_step_after_end_raises() -> None:
    env = envs.BatchingEnv(graphs=_lattices(1))
    _, info = env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
    with pytest.raises(InvalidActionError, match="call reset"):
        env.step(0)


def test_render_ansi_lists_ready_types() -> None:
    env = envs.BatchingEnv(graphs=_lattices(1), render_mode="ansi")
    env.reset(seed=0)
    assert env.render().startswith("batches=")


@pytest.mark.parametrize("action", [10**6, -1, np.int64(-5), np.array([99], dtype=np.int32)])
@pytest.mark.parametrize("make", ["class_raise", "class_noop", "registered"])
def test_action_outside_the_space_raises_naming_value_and_range(action: object, make: str
                                                                ) -> None:
    if make == "registered":  # gym.make: OrderEnforcing(PassiveEnvChecker(env)), on_invalid=noop
        env = gym.make(ENV_ID, graphs=_lattices())
    else:
        env = envs.BatchingEnv(graphs=_lattices(), on_invalid=make.removeprefix("class_"))
    _, info = env.reset(seed=0)
    k = len(info["action_mask"])
    before = env.unwrapped.frontier.num_executed
    value = int(np.asarray(action).reshape(()))
    with pytest.raises(InvalidActionError) as err:
        env.step(action)
    msg = str(err.value)
    assert f"action {value}" in msg and f"0..{k - 1}" in msg and f"Discrete({k})" in msg
    assert env.unwrapped.frontier.num_executed == before
    # the episode goes on after the refusal
    _, _, _, _, info2 = env.step(int(np.flatnonzero(info["action_mask"])[0]))
    assert info2["num_batches"] > info["num_batches"]


def test_registered_env_refuses_non_integer_and_keeps_masked_noop() -> None:
    env = gym.make(ENV_ID, graphs=_lattices())
    _, info = env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="0.5"):
        env.step(0.5)
    masked = int(np.flatnonzero(info["action_mask"] == 0)[0])
    _, r, _, _, info2 = env.step(masked)  # in range but masked: the documented no-op
    assert r == -1.0 and info2["invalid_action"]
    assert info2["num_batches"] == info["num_batches"]


def test_critical_observation_adds_the_critical_path_features() -> None:
    from envs.observation import observation_length

    graphs = _lattices()
    base = envs.BatchingEnv(graphs=graphs)
    crit = envs.BatchingEnv(graphs=graphs, observation="critical")
    ob, _ = base.reset(seed=0)
    oc, info = crit.reset(seed=0)
    k = len(info["action_mask"])
    assert oc.shape == crit.observation_space.shape == (observation_length(k, "critical"),)
    assert oc.shape[0] == ob.shape[0] + 3 * k and np.array_equal(oc[:ob.shape[0]], ob)
    assert crit.observation_space.contains(oc)
    gap = oc[ob.shape[0] + k: ob.shape[0] + 2 * k]
    ready = info["action_mask"].astype(bool)
    assert (gap[ready] == 0).any() and (gap[~ready] == 0).all()  # some ready type is critical
    with pytest.raises(UnknownNameError, match="critcal"):
        envs.BatchingEnv(graphs=graphs, observation="critcal")
