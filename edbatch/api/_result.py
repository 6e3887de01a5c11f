"""What a run of the user API hands back: :class:`BatchResult` (loss, graph, schedule,
requested values) and :func:`dtype_hint`, the fix named when a cell's module computes in
another dtype than its batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from edbatch.api._handles import Handle
from edbatch.errors import GraphError
from edbatch.executor.torch_executor import RunResult
from edbatch.graph import Graph
from edbatch.schedule import Schedule

__all__ = ["BatchResult", "dtype_hint"]


def dtype_hint(cells: Iterable[Any], dtype: torch.dtype) -> str:
    """A hint naming ``DynamicBatch(dtype=...)`` when a cell's module has floating-point
    parameters of another dtype than the batch's (``""`` if none has)."""
    for cell in cells:
        module = getattr(cell, "module", None)
        if not isinstance(module, nn.Module):
            continue
        other = sorted({str(p.dtype) for p in module.parameters()
                        if p.is_floating_point() and p.dtype != dtype})
        if other:
            return (f" The batch computes in {dtype} but cell {cell.name!r}'s module has "
                    f"{', '.join(other)} parameters: create the batch with "
                    f"DynamicBatch(dtype={other[0]}) or convert the module with "
                    f"module.to({dtype})")
    return ""


@dataclass(frozen=True)
class BatchResult:
    """What :meth:`DynamicBatch.run` returns.

    ``loss`` is the sum of the :meth:`~DynamicBatch.add_loss` terms (a scalar; ``None`` if
    none), ``graph`` and ``schedule`` what ran, ``run`` the executor's
    :class:`~edbatch.executor.torch_executor.RunResult` (stats, time); ``result[handle]``
    reads a requested handle's value.
    """

    loss: Tensor | None
    graph: Graph
    schedule: Schedule
    run: RunResult
    batch: Any  # the DynamicBatch that recorded it
    generation: int

    @property
    def num_batches(self) -> int:
        """Kernel launches of the schedule (batches)."""
        return self.schedule.num_batches

    def __getitem__(self, handle: Handle) -> Tensor:
        """The value of a requested handle, shaped ``handle.shape``.

        Raises:
            GraphError: the handle is of another mini-batch or was not requested.
        """
        if handle.batch is not self.batch or handle.generation != self.generation:
            raise GraphError(f"{handle!r} is not a node of the mini-batch of this result; "
                             f"read values from the result of the run that computed them")
        value = self.run.outputs.get(handle.node_id)
        if value is None:
            raise GraphError(f"{handle!r} was not requested; pass it in "
                             f"run(outputs=[...]) to read its value")
        return value.reshape(handle.shape)

    def stack(self, handles: Sequence[Handle]) -> Tensor:
        """The values of ``handles`` stacked: ``[len(handles), *shape]``."""
        return torch.stack([self[h] for h in handles])
