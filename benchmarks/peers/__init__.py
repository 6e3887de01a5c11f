"""Each workload's benchmark peers, one module per workload, found by its registry name.

``benchmarks/peers/<name>.py`` may define ``record`` (the per-instance model on
``edbatch.api``, :mod:`benchmarks.models_api`) and ``HandBatched`` (the hand-batched PyTorch
model, :mod:`benchmarks.hand_batched`); ``benchmarks/peers/dynet/<name>.py`` defines the
DyNet peer's ``loss`` and ``LOOKUPS`` (:mod:`benchmarks.dynet_peer`; torch-free, as the DyNet
worker is). Nothing lists them: :func:`find_peers` looks for a module named after every
registered workload. Adding a workload's peers = adding its modules here.

Torch-free (the DyNet worker imports this package).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from edbatch.workloads import WORKLOADS

__all__ = ["find_peers"]


def find_peers(attr: str, package: str = __name__) -> dict[str, Any]:
    """``{workload name: attr}`` of every registered workload whose module
    ``<package>.<name>`` exists and defines ``attr``, in registry order."""
    found: dict[str, Any] = {}
    for name in WORKLOADS:
        module = f"{package}.{name}"
        if importlib.util.find_spec(module) is None:
            continue
        value = getattr(importlib.import_module(module), attr, None)
        if value is not None:
            found[name] = value
    return found
