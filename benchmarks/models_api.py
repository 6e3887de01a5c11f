"""The benchmark's models written as a user writes them: per-instance code on ``edbatch.api``.

Each workload's ``record`` function (``benchmarks/peers/<name>.py``, found by the workload's
name) records one mini-batch into a :class:`~edbatch.api.DynamicBatch` made by
:meth:`DynamicBatch.from_workload <edbatch.api.DynamicBatch.from_workload>` (the
workload's fused cells, kernels and parameters): one ``with batch.instance():`` per data
instance, plain Python recursion or loops over the instance's structure, one built-in op call
per cell. The graph recorded is node for node the one the workload's own builder makes
(``tests/benchmarks/test_models_api.py`` checks it), so the ``api`` construction of
``benchmarks/throughput.py`` does the same work as ``+fastbuild`` after construction.

    batch = DynamicBatch.from_workload(wl, params)
    RECORDERS[wl.name](batch, wl, instances)
    out = batch.run("depth")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers import find_peers
from edbatch.api import DynamicBatch

__all__ = ["RECORDERS"]

#: Workload name -> recorder: the ``record`` of every ``benchmarks/peers/<name>.py``.
RECORDERS: dict[str, Callable[[DynamicBatch, Any, Sequence[Any]], None]] = find_peers("record")


