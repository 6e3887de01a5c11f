"""Observation vectors of :class:`envs.BatchingEnv` for deep RL.

``base`` is :func:`envs.encoding.encode_observation` (7 blocks of one entry per op type).
``critical`` appends what the critical-path heuristic decides on, per op type: the scaled
height of the type's highest ready node, its gap below the frontier's highest (capped at 4,
scaled) and whether its batch is complete (0 for types with nothing ready), so a network
can represent the heuristic exactly and learn deviations from it (the features of
:func:`policies.imitation.features`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.schedule import FrontierView
from edbatch.schedule.bounds import height_list
from envs.encoding import encode_observation, observation_size

__all__ = ["OBSERVATIONS", "check_observation", "observe", "observation_length"]

OBSERVATIONS = ("base", "critical")


def check_observation(kind: str) -> str:
    """``kind`` if it names an observation, else :class:`UnknownNameError`."""
    if kind not in OBSERVATIONS:
        raise UnknownNameError(f"unknown observation {kind!r}; choose one of "
                               f"{list(OBSERVATIONS)}." + did_you_mean(kind, OBSERVATIONS))
    return kind


def observation_length(num_ops: int, kind: str = "base") -> int:
    """Length of :func:`observe`'s vector for a vocabulary of ``num_ops``."""
    return observation_size(num_ops) + (3 * num_ops if kind == "critical" else 0)


def observe(view: FrontierView, kind: str = "base") -> NDArray[np.float32]:
    """The observation vector of ``kind`` (see the module docstring)."""
    obs = encode_observation(view)
    if kind == "base":
        return obs
    k = len(view.mask)
    h = height_list(view.graph)
    top = np.zeros(k)
    for a in view.ready_ops:
        top[a] = view.max_over_ready(a, h) + 1
    scale = float(max(h, default=0)) + 1.0
    gap = np.where(view.mask > 0, np.minimum(top.max(initial=0) - top, 4) / 4, 0.0)
    tw = view.typewise_count if view.typewise_count is not None else view.ready_count
    full = (view.mask > 0) & (view.ready_count >= tw)
    extra = np.concatenate([top / scale, gap, full.astype(np.float64)]).astype(np.float32)
    return np.concatenate([obs, extra])
