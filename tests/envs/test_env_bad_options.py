"""Bad constructor options and ``reset`` options of the Gymnasium env (``gym.make`` of the
registered id and ``BatchingEnv``) are edbatch errors naming the value and the fix, raised
where they are given: never a raw ``TypeError`` / ``AttributeError`` at the first step, an
option silently ignored, or an ``assert``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import envs
from edbatch.errors import ConfigError, GraphError, InvalidActionError, UnknownNameError
from edbatch.workloads import GraphSampler, make_workload

__all__: list[str] = []

ID = "edbatch/Batching-v0"


@pytest.mark.parametrize("batch_size", [2.5, "4", True, 0, -2, None])
def test_batch_size_must_be_a_positive_integer(batch_size: Any) -> None:
    with pytest.raises(GraphError, match=f"batch_size must be an integer >= 1, got "
                                         f"{batch_size!r}"):
        gym.make(ID, workload="tree_lstm", batch_size=batch_size)
    with pytest.raises(GraphError, match="batch_size must be an integer"):
        GraphSampler(make_workload("tree_lstm"), "dev", batch_size)


def test_a_numpy_integer_batch_size_is_fine() -> None:
    env = gym.make(ID, workload="tree_lstm", batch_size=np.int64(3))
    assert env.reset(seed=0)[0].shape == env.observation_space.shape


@pytest.mark.parametrize("max_steps", [-1, 0, 2.5, "5", True])
def test_max_steps_must_be_a_positive_integer_or_none(max_steps: Any) -> None:
    with pytest.raises(ConfigError, match=f"config key max_steps={max_steps!r}: expected an "
                                          f"integer >= 1 or None"):
        gym.make(ID, workload="tree_lstm", batch_size=4, max_steps=max_steps)


def test_an_unknown_workload_option_is_named_with_the_options() -> None:
    with pytest.raises(UnknownNameError, match="workload 'tree_lstm' has no option "
                                               "'hiden_dim'.*Did you mean 'hidden_dim'"):
        gym.make(ID, workload="tree_lstm", workload_kwargs={"hiden_dim": 3})
    with pytest.raises(UnknownNameError, match="has no option 'hidden'"):
        make_workload("lattice_lstm", hidden=8)


@pytest.mark.parametrize("options, match", [
    ({"grpah": None}, "takes a dict with the one key 'graph'"),
    ([1, 2], "takes a dict with the one key 'graph'"),
    ({"graph": "abc"}, "options\\['graph'\\] must be an edbatch Graph, got str"),
])
def test_bad_reset_options_are_refused(options: Any, match: str) -> None:
    env = gym.make(ID, workload="tree_lstm", batch_size=4)
    with pytest.raises(GraphError, match=match):
        env.reset(seed=0, options=options)
    graph = make_workload("tree_lstm").minibatch("dev", [0, 1])
    obs, info = env.reset(seed=0, options={"graph": graph})  # the one key still works
    assert info["lower_bound"] >= 1 and obs.shape == env.observation_space.shape


def test_action_masks_before_reset_is_an_invalid_action_error() -> None:
    env = envs.BatchingEnv(workload="tree_lstm", batch_size=4)
    with pytest.raises(InvalidActionError, match=r"before reset\(\); call reset\(\) first"):
        env.action_masks()


@pytest.mark.parametrize("mode", ["human", "rgb_array", "nope"])
def test_an_unsupported_render_mode_is_refused_when_made(mode: str) -> None:
    """(``human`` was accepted with a warning, then Gymnasium's checker asserted at
    ``render()``.)"""
    with pytest.warns(UserWarning), pytest.raises(UnknownNameError, match=f"render_mode {mode!r}"):
        gym.make(ID, workload="tree_lstm", render_mode=mode)
    with pytest.raises(UnknownNameError, match="pass render_mode='ansi'"):
        envs.BatchingEnv(workload="tree_lstm", render_mode=mode)
    env = envs.BatchingEnv(workload="tree_lstm", batch_size=2, render_mode="ansi")
    env.reset(seed=0)
    assert isinstance(env.render(), str)


@pytest.mark.parametrize(("graphs", "found"), [
    ([1, 2], "item 0 is a int, not a Graph"), (5, "takes a list of Graphs or a sampler, got int"),
    (["g"], "item 0 is a str")])
def test_graphs_that_are_no_graphs_are_named(graphs: Any, found: str) -> None:
    """(A list of ints was a raw ``AttributeError``.)"""
    with pytest.raises(GraphError, match=found):
        envs.BatchingEnv(graphs)


@pytest.mark.parametrize("kwargs", [{"hidden_dim": -1}, {"embed_dim": True}, {"vocab_size": 0}])
def test_workload_kwargs_out_of_range_are_edbatch_errors(kwargs: dict[str, Any]) -> None:
    """(The tree workloads raised a plain ``ValueError``.)"""
    with pytest.raises(GraphError, match="must be a positive int"):
        gym.make(ID, workload="tree_lstm", workload_kwargs=kwargs)
