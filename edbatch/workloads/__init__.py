"""Workloads on real data, synthetic generators and the ED-Batch graph-dump loader."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.workloads.base import (
    DATA_DIR,
    LOSS_SUM,
    REGISTRY,
    Granularity,
    GraphSampler,
    Workload,
    check_granularity,
    loss_sum_op,
)

__all__ = [
    "DATA_DIR",
    "LOSS_SUM",
    "MODULES",
    "REAL_CASES",
    "REAL_WORKLOADS",
    "REGISTRY",
    "WORKLOADS",
    "Granularity",
    "GraphSampler",
    "Workload",
    "check_granularity",
    "loss_sum_op",
    "make_workload",
]

#: The modules of the shipped workloads, in registry order: importing one registers the
#: :class:`Workload` subclasses it defines. Adding a workload = its module + one entry here.
MODULES = ("tree_lstm", "tree_gru", "mvrnn", "lattice", "bilstm_tagger", "seq2seq", "dumps",
           "synthetic", "ggnn_molecules", "tree_lstm_sick", "module_net", "moe",
           "transition_parser", "bilstm_char_tagger")
for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")

#: Registry: workload name -> class (a workload defined outside this package joins it when
#: its class is defined).
WORKLOADS: dict[str, type[Workload]] = REGISTRY

#: The real-data workloads (``real_data = True``; the dumps and synthetic generators are
#: extra), in registry order.
REAL_WORKLOADS = tuple(name for name, cls in REGISTRY.items() if cls.real_data)

#: Every (real-data workload, granularity it has) pair: what the test suite runs.
REAL_CASES = tuple((name, g) for name in REAL_WORKLOADS for g in REGISTRY[name].granularities)


def make_workload(name: str, **kwargs: Any) -> Workload:
    """Instantiate a registered workload by name (``kwargs`` go to its constructor)."""
    cls = WORKLOADS.get(name)
    if cls is None:
        raise UnknownNameError(f"unknown workload {name!r}; registered: {sorted(WORKLOADS)}."
                               + did_you_mean(name, WORKLOADS))
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        options = [k for k in params if k != "self"]
        for key in kwargs:
            if key not in options:
                raise UnknownNameError(f"workload {name!r} has no option {key!r}; its options "
                                       f"are {options}." + did_you_mean(key, options))
    return cls(**kwargs)
