"""Computed values of a mini-batch run in segments, kept as the executor's batch outputs.

:meth:`DynamicBatch.run_programs <edbatch.api.DynamicBatch.run_programs>` runs a mini-batch
in segments (one per synchronisation point). Each segment runs with the batch's kernels
wrapped so that every batch's output tensor ``[B, width]`` is kept (the executor calls one
kernel per batch, in schedule order; the memory plan's ``row_order`` says which node each
row is). A node's value is then a row of one of those tensors: reading many values (the
operands a later segment takes over as inputs, or ``result.stack(handles)``) costs one
``index_select`` per source batch, not one autograd node per row, and gradients flow back
through them into the segment that computed them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import Kernel
from edbatch.memory import MemoryPlan

__all__ = ["MERGE_AT", "Capture", "Values"]

#: A gather whose rows lie in more source batches than this joins those batches first.
MERGE_AT = 4


class Capture:
    """Kernels that keep every batch's output (``outputs``, in call order)."""

    def __init__(self, kernels: Mapping[str, Kernel]) -> None:
        self.outputs: list[Tensor] = []
        self.originals = dict(kernels)
        self.kernels = {kind: self._wrap(k) for kind, k in kernels.items()}

    def _wrap(self, kernel: Kernel) -> Kernel:
        keep = self.outputs.append
        if getattr(kernel, "writes_out", False):  # fills the arena region it is given
            def run_out(op, inputs, params, attrs, out=None, save=None):  # type: ignore[no-untyped-def]
                out = kernel(op, inputs, params, attrs, out=out) if save is None else \
                    kernel(op, inputs, params, attrs, out=out, save=save)
                keep(out)
                return out
            run_out.writes_out = True  # type: ignore[attr-defined]
            return run_out

        def run(op, inputs, params, attrs):  # type: ignore[no-untyped-def]
            out = kernel(op, inputs, params, attrs)
            keep(out)
            return out
        return run


class Values:
    """Where each node's value lives: ``outputs[batch[v]][row[v]]``."""

    def __init__(self) -> None:
        self.outputs: list[Tensor] = []
        self.batch = np.full(0, -1, dtype=np.int64)
        self.row = np.zeros(0, dtype=np.int64)
        self.gathered: set[int] = set()  # the batches read by gathers of several so far

    def grow(self, n: int) -> None:
        """Make room for nodes ``0..n-1`` (and more: the room doubles, so a mini-batch of
        many segments does not copy every node's entry per segment)."""
        if n > len(self.batch):
            extra = max(n, 2 * len(self.batch)) - len(self.batch)
            self.batch = np.concatenate([self.batch, np.full(extra, -1, dtype=np.int64)])
            self.row = np.concatenate([self.row, np.zeros(extra, dtype=np.int64)])

    def add(self, plan: MemoryPlan, outputs: Sequence[Tensor], first: int, count: int,
            offset: int) -> None:
        """Keep a segment's batch ``outputs``; its graph nodes ``first..first+count-1`` are
        the recording's nodes ``offset..`` (the others are taken-over inputs or loss sums).

        Raises:
            ExecutionError: the executor did not make one kernel call per batch.
        """
        counts = plan.row_counts()
        sizes = counts.tolist()
        if len(outputs) != len(sizes) or any(o.shape[0] != s for o, s in zip(outputs, sizes)):
            raise ExecutionError(
                f"run_programs: the executor made {len(outputs)} kernel calls of sizes "
                f"{[o.shape[0] for o in outputs][:8]} for {len(sizes)} batches of sizes "
                f"{sizes[:8]}; values are read from one kernel call per batch")
        base = len(self.outputs)
        self.outputs.extend(outputs)
        if not sizes:
            return
        nodes = plan.flat_order().astype(np.int64)
        batch = np.repeat(np.arange(len(sizes), dtype=np.int64) + base, counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        row = np.arange(len(nodes), dtype=np.int64) - np.repeat(starts, counts)
        keep = (nodes >= first) & (nodes < first + count)
        ids = nodes[keep] - first + offset
        self.grow(int(ids.max()) + 1 if len(ids) else 0)
        self.batch[ids], self.row[ids] = batch[keep], row[keep]

    def gather(self, nodes: np.ndarray) -> Tensor:  # type: ignore[type-arg]
        """The values of ``nodes`` as ``[len(nodes), width]``: one ``index_select`` per
        source batch (and a ``cat`` and a reorder when there are several). Several sources
        that are row views of one arena, or more than :data:`MERGE_AT` of them, are first
        joined into one tensor (once: the nodes' locations are moved to it), so that
        reading the same rows again, as a parser does at every decision, is one
        ``index_select``."""
        nodes = np.asarray(nodes, dtype=np.int64)
        src = self.batch[nodes]
        first, last = int(src.min()), int(src.max())
        if first < 0:
            raise ExecutionError(f"node %{int(nodes[src < 0][0])} has no value yet")
        if first == last:
            row = self.row[nodes]
            out = self.outputs[first]
            k = len(row)
            if k == out.shape[0] and row[0] == 0 and row[-1] == k - 1 and \
                    (k < 3 or bool((row[1:] > row[:-1]).all())):  # rows 0..k-1 in order
                return out
            return out.index_select(0, _index(row, out.device))
        used = np.unique(src)
        if self._merge(used):
            src = self.batch[nodes]
            if np.all(src == src[0]):
                out = self.outputs[int(src[0])]
                return out.index_select(0, _index(self.row[nodes], out.device))
        row = self.row[nodes]
        order = np.argsort(src, kind="stable")
        bounds = np.flatnonzero(np.diff(src[order])) + 1
        parts = []
        for chunk in np.split(order, bounds):
            out = self.outputs[int(src[chunk[0]])]
            parts.append(out.index_select(0, _index(row[chunk], out.device)))
        joined = torch.cat(parts)
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return joined.index_select(0, _index(back, joined.device))

    def _merge(self, used: np.ndarray) -> bool:  # type: ignore[type-arg]
        """Join the source batches ``used`` (sorted, one row width) into one new output
        and point every node kept in them at its row there, if they are row views of one
        arena (an inference run's in-place outputs: no copy), more than :data:`MERGE_AT`
        or one of them was read with others before (one ``cat``: a parser reads its words'
        features and its root and pad vectors at every decision); whether it did."""
        parts = [self.outputs[int(b)] for b in used]
        shift = np.zeros(int(used[-1]) + 1, dtype=np.int64)
        joined, at = _common_rows(parts)
        listed = used.tolist()
        again = not self.gathered.isdisjoint(listed)
        self.gathered.update(listed)
        if joined is not None:
            shift[used] = at
        elif len(used) > MERGE_AT or again:
            sizes = np.array([p.shape[0] for p in parts], dtype=np.int64)
            shift[used] = np.cumsum(sizes) - sizes
            joined = torch.cat(parts)
        else:
            return False
        moved = np.isin(self.batch, used)
        self.row[moved] += shift[self.batch[moved]]
        self.batch[moved] = len(self.outputs)
        self.gathered.add(len(self.outputs))
        self.outputs.append(joined)
        return True


def _common_rows(parts: Sequence[Tensor]) -> tuple[Tensor | None, list[int]]:
    """``(arena, first row of each part)`` if every part is a block of whole rows of one
    2-d tensor (``arena``), else ``(None, [])``."""
    base = parts[0]._base
    if base is None or base.dim() != 2 or not base.is_contiguous():
        return None, []
    stride, origin, at = base.stride(0), base.storage_offset(), []
    for p in parts:
        off = p.storage_offset() - origin
        if p._base is not base or p.dim() != 2 or p.stride() != base.stride() or \
                p.shape[1] != base.shape[1] or off % stride:
            return None, []
        at.append(off // stride)
    return base, at


def _index(rows: np.ndarray, device: torch.device) -> Tensor:  # type: ignore[type-arg]
    index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    return index if device.type == "cpu" else index.to(device)
