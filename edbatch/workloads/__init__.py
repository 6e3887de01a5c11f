"""Workloads on real data, synthetic generators and the ED-Batch graph-dump loader."""

from __future__ import annotations

import importlib
from typing import Any

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.workloads.base import (
    DATA_DIR,
    LOSS_SUM,
    Granularity,
    GraphSampler,
    Workload,
    check_granularity,
    loss_sum_op,
)

__all__ = [
    "DATA_DIR",
    "LOSS_SUM",
    "REAL_WORKLOADS",
    "WORKLOADS",
    "Granularity",
    "GraphSampler",
    "Workload",
    "check_granularity",
    "loss_sum_op",
    "make_workload",
]

#: Registry: workload name -> "module:Class" (imported lazily by :func:`make_workload`).
WORKLOADS: dict[str, str] = {
    "tree_lstm": "edbatch.workloads.tree_lstm:TreeLSTM",
    "tree_gru": "edbatch.workloads.tree_gru:TreeGRU",
    "mvrnn": "edbatch.workloads.mvrnn:MVRNN",
    "lattice_lstm": "edbatch.workloads.lattice:LatticeLSTM",
    "lattice_gru": "edbatch.workloads.lattice:LatticeGRU",
    "bilstm_tagger": "edbatch.workloads.bilstm_tagger:BiLSTMTagger",
    "seq2seq": "edbatch.workloads.seq2seq:Seq2Seq",
    "dumps": "edbatch.workloads.dumps:DumpWorkload",
    "synthetic": "edbatch.workloads.synthetic:SyntheticWorkload",
    "ggnn_molecules": "edbatch.workloads.ggnn_molecules:GGNNMolecules",
    "tree_lstm_sick": "edbatch.workloads.tree_lstm_sick:TreeLSTMSick",
}

#: The seven real-data workloads (the dumps and synthetic generators are extra).
REAL_WORKLOADS = ("tree_lstm", "tree_gru", "mvrnn", "lattice_lstm", "lattice_gru",
                  "bilstm_tagger", "seq2seq")


def make_workload(name: str, **kwargs: Any) -> Workload:
    """Instantiate a registered workload by name (``kwargs`` go to its constructor)."""
    target = WORKLOADS.get(name)
    if target is None:
        raise UnknownNameError(f"unknown workload {name!r}; registered: {sorted(WORKLOADS)}."
                               + did_you_mean(name, WORKLOADS))
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)  # type: ignore[no-any-return]
