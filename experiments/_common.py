"""Pieces shared by the entry points: seeding, graph sets, workload configs, trackers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from edbatch.errors import UnknownNameError
from edbatch.graph import Graph
from edbatch.tracking import NullTracker, Tracker, git_sha
from edbatch.workloads import Workload

__all__ = ["cfg_to_dict", "graph_set", "make_tracker", "one_workload", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch once, at the entry point."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def cfg_to_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as a plain dict (what W&B receives)."""
    out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


def one_workload(node: Any, granularity: str | None = None
                 ) -> tuple[str, Workload, dict[str, Any]]:
    """Instantiate the single workload selected in a ``workload`` config node."""
    spec = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(spec, dict) or len(spec) != 1:
        raise UnknownNameError(f"select exactly one workload here (e.g. workload=tree_lstm); "
                               f"got {list(spec) if isinstance(spec, dict) else spec}")
    (name, body), = spec.items()
    body = dict(body)
    overrides = body.pop("eval", None) or {}
    if granularity is not None and "granularity" in body:
        body["granularity"] = granularity
    return str(name), instantiate(body), overrides


def graph_set(workload: Workload, split: str, batch_size: int, count: int | None,
              *, shuffle_seed: int | None = None) -> list[Graph]:
    """``count`` mini-batch graphs of consecutive instances of ``split``.

    With ``shuffle_seed`` the instances are shuffled first (seeded), so training graphs
    differ between seeds while evaluation graphs (no shuffle) stay fixed.
    """
    n = len(workload.load(split))
    order = np.arange(n)
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    chunks = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if count is not None:
        chunks = chunks[:count]
    return [workload.minibatch(split, np.sort(c).tolist()) for c in chunks]


def make_tracker(node: Any, cfg: DictConfig, name: str) -> Tracker:
    """Instantiate the configured tracker with the resolved config, seed and git SHA."""
    if node is None:
        return NullTracker()
    config = {**cfg_to_dict(cfg), "git_sha": git_sha()}
    # Not recursive: run_config holds the whole config, whose logger node has a _target_.
    return instantiate(node, _recursive_=False, run_config=config,  # type: ignore[no-any-return]
                       name=name)
