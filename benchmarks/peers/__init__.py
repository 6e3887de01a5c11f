"""Each workload's benchmark peers, one module per workload, found by its registry name.

``benchmarks/peers/<name>.py`` may define ``record`` (the per-instance model on
``edbatch.api``, :mod:`benchmarks.models_api`), ``HandBatched`` (the hand-batched PyTorch
model, :mod:`benchmarks.hand_batched`) and ``Unbatched`` (per-instance PyTorch, node by node:
the ``pytorch_unbatched`` contender); ``benchmarks/peers/dynet/<name>.py`` defines the
DyNet peer's ``loss`` and ``LOOKUPS`` (:mod:`benchmarks.dynet_peer`; torch-free, as the DyNet
worker is). Nothing lists them: :func:`find_peers` looks for a module named after every
registered workload. Adding a workload's peers = adding its modules here.

Torch-free (the DyNet worker imports this package).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

from edbatch.workloads import WORKLOADS, Workload, make_workload

__all__ = ["find_peers", "sized_workload"]


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


def sized_workload(name: str, embed: int, hidden: int) -> Workload:
    """Workload ``name`` at cell granularity of an ``EMBEDxHIDDEN`` benchmark size; ``embed``
    is ignored by a workload without an ``embed_dim`` (the GGNN's atom states are ``hidden``
    wide)."""
    cls = WORKLOADS[name] if name in WORKLOADS else None
    kwargs: dict[str, Any] = {"granularity": "cell", "hidden_dim": hidden}
    if cls is None or "embed_dim" in inspect.signature(cls.__init__).parameters:
        kwargs["embed_dim"] = embed
    return make_workload(name, **kwargs)
