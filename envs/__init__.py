"""Gymnasium environments of edbatch; importing this package registers them.

    >>> import gymnasium as gym, envs
    >>> "edbatch/Batching-v0" in gym.registry
    True
"""

from __future__ import annotations

import gymnasium

from envs.batching import REWARDS, BatchingEnv, CostModel, GraphSource
from envs.encoding import (
    ENCODINGS,
    StateKey,
    encode_observation,
    encode_state,
    fallback_action,
    observation_size,
)

__all__ = ["ENCODINGS", "REWARDS", "BatchingEnv", "CostModel", "GraphSource", "StateKey",
           "encode_observation", "encode_state", "fallback_action", "observation_size"]

if "edbatch/Batching-v0" not in gymnasium.registry:
    # Gymnasium convention: every action of the declared space is a legal step() input, so
    # the registered env makes an in-range masked action a -1 no-op (BatchingEnv itself
    # raises). An action outside Discrete(K) raises InvalidActionError in both modes.
    gymnasium.register(id="edbatch/Batching-v0", entry_point="envs.batching:BatchingEnv",
                       kwargs={"on_invalid": "noop"})
