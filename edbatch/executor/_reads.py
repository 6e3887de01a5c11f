"""Operand reads of the batched executor (arena views, gathers, training-mode reads).

A read is a callable over the arenas (inference and hand-written-backward training) or the
per-batch outputs (autograd training) that returns one operand tensor, with a ``route`` that
adds the operand's gradient back where it came from; reads that copy rows have the class
attribute ``gather = True`` so a profiled run can time them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.memory.plan import MemoryPlan, Operand, Region

__all__ = ["PAD_MIN_ROWS", "ArenaRows", "CatRead", "IndexedRead", "Read", "RowLocator", "RowsRead",
           "SelectRead", "SliceRead", "WholeRead", "indexed_reads", "inplace_read",
           "inplace_reads", "merged", "to_device", "whole_rows"]

#: Gradient rows from which :meth:`RowsRead.route` pads a narrow gradient to the full width
#: (measured on the CPU, 1 thread, 150 of 300 columns: 48 rows 26 -> 22 us, 400 rows
#: 187 -> 80 us, 2324 rows 1149 -> 560 us; 25 rows 16 -> 18 us).
PAD_MIN_ROWS = 40

#: A compiled operand read: called with the arenas (inference) or batch outputs (training).
Read = Callable[[Sequence[Tensor]], Tensor]


def to_device(array: NDArray, device: torch.device) -> Tensor:  # type: ignore[type-arg]
    """Host index array -> device tensor; on CUDA through pinned memory, non-blocking."""
    array = np.ascontiguousarray(array)
    host = torch.from_numpy(array if array.flags.writeable else array.copy())
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def merged(arena: int, rows: NDArray[np.int64]) -> Operand:
    """All operands of a variadic node as one read (a view when consecutive)."""
    if len(rows) == 1 or bool(np.all(np.diff(rows) == 1)):
        return Operand.of_view(Region(arena, int(rows[0]), int(rows[-1]) + 1))
    return Operand.of_gather(arena, rows)


def inplace_read(operand: Operand, device: torch.device, counts: list[int]) -> Read:
    """Inference read: an arena slice or an ``index_select`` of arena rows (both also route
    a gradient into a gradient arena of the same layout, for the analytic training mode)."""
    return inplace_reads([(operand,)], device, counts)[0][0]


def inplace_reads(operands: Sequence[Sequence[Operand]], device: torch.device,
                  counts: list[int]) -> list[tuple[Read, ...]]:
    """:func:`inplace_read` of every operand of every batch; the gathers' row indices are
    slices of one index tensor (one host-to-device copy for the whole program)."""
    gathers = [o.gather for ops in operands for o in ops if o.view is None]
    # one split_with_sizes call for every gather's index view (one dispatch, against one
    # slice of about 0.8 us per gather)
    lengths = [len(g) for g in gathers]  # type: ignore[arg-type]
    parts = to_device(np.concatenate(gathers).astype(np.int64, copy=False), device) \
        .split_with_sizes(lengths) if gathers else ()
    take = iter(parts).__next__
    out = []
    total = 0
    for ops in operands:
        reads: list[Read] = []
        total += len(ops)
        for o in ops:
            view = o.view
            if view is not None:
                reads.append(SliceRead(o.arena, view.start, view.stop))
            else:
                reads.append(RowsRead(o.arena, take()))  # type: ignore[misc]
        out.append(tuple(reads))
    counts[0] += total - len(gathers)
    counts[1] += len(gathers)
    counts[2] += sum(lengths)
    return out


class RowsRead:
    """Rows ``idx`` of tensor ``b`` (an ``index_select``); backward ``index_add_``s into them."""

    __slots__ = ("b", "idx")
    gather = True

    def __init__(self, b: int, idx: Tensor) -> None:
        self.b, self.idx = b, idx

    def __len__(self) -> int:
        return self.idx.shape[0]  # (len(tensor) is a Python-level call: 3x the time)

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return outs[self.b].index_select(0, self.idx)

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        """Add the read's gradient rows into the gradient tensor of ``b`` (a narrower
        gradient covers the leading columns)."""
        dst = bufs[self.b]
        if grad.shape[1] != dst.shape[1]:
            if grad.shape[0] < PAD_MIN_ROWS:
                dst[:, :grad.shape[1]].index_add_(0, self.idx, grad)
                return
            # index_add_ into a column slice is about 2x slower on the CPU than into the
            # whole rows: pad the gradient with zero columns instead
            full = grad.new_zeros(grad.shape[0], dst.shape[1])
            full[:, :grad.shape[1]] = grad
            grad = full
        dst.index_add_(0, self.idx, grad)


class ArenaRows(NamedTuple):
    """What an :class:`IndexedRead` hands its kernel: rows ``idx`` of ``arena``, not copied
    (``rows()`` copies them, for a body that needs the tensor)."""

    arena: Tensor
    idx: Tensor

    def rows(self) -> Tensor:
        return self.arena.index_select(0, self.idx)


class IndexedRead:
    """Rows ``idx`` of arena ``b`` passed to the kernel as :class:`ArenaRows` (no gather):
    for the operand slots a cell kind names in ``indexed_reads`` (CPU, see
    :func:`indexed_reads`), whose compiled bodies index the arena themselves. The backward's
    gradient is a tensor of the rows (``index_add_``) or an object whose ``add_to(buf, idx)``
    adds it into the gradient arena itself."""

    __slots__ = ("b", "idx")
    gather = False

    def __init__(self, b: int, idx: Tensor) -> None:
        self.b, self.idx = b, idx

    def __len__(self) -> int:
        return self.idx.shape[0]

    def __call__(self, outs: Sequence[Tensor]) -> ArenaRows:  # type: ignore[override]
        return ArenaRows(outs[self.b], self.idx)

    def route(self, grad: Any, bufs: Sequence[Tensor]) -> None:
        """Add the gradient rows into the gradient arena of ``b``."""
        if isinstance(grad, Tensor):
            bufs[self.b].index_add_(0, self.idx, grad)
        else:
            grad.add_to(bufs[self.b], self.idx)


def indexed_reads(kernels: Sequence[object], reads: list[tuple[Read, ...]],
                  device: torch.device) -> list[tuple[Read, ...]]:
    """``reads`` with the slots a kernel's cell kind names in ``indexed_reads`` (operand
    names) as :class:`IndexedRead` (CPU only; a view becomes the index range it covers)."""
    if device.type != "cpu":
        return reads
    out = reads
    found: dict[int, set[int] | None] = {}  # id(kernel) -> its slots (once per kernel)
    for b, kernel in enumerate(kernels):
        slots = found.get(id(kernel), ())
        if slots == ():
            cell = getattr(kernel, "cell", None)
            names = getattr(cell, "indexed_reads", ())  # operand names, or slot numbers
            slots = found[id(kernel)] = {  # (of a variadic kind: no names)
                n if isinstance(n, int) else cell.inputs.index(n)  # type: ignore[union-attr]
                for n in names} if names else None
        if not slots:
            continue
        new: list[Read] = []
        for k, read in enumerate(reads[b]):
            if k in slots and type(read) is RowsRead:
                read = IndexedRead(read.b, read.idx)
            elif k in slots and type(read) is SliceRead:
                read = IndexedRead(read.b, torch.arange(read.lo, read.hi))
            new.append(read)
        if out is reads:
            out = list(reads)
        out[b] = tuple(new)
    return out


class RowLocator:
    """Maps arena rows to (batch, batch-local row) and builds training-mode reads."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.batch_of = [np.full(rows, -1, dtype=np.int64) for rows, _ in plan.arenas]
        self.start = np.array([r.start for r in plan.outputs], dtype=np.int64)
        for b, r in enumerate(plan.outputs):
            self.batch_of[r.arena][r.start:r.stop] = b

    @staticmethod
    def _slice(b: int, lo: int, hi: int, counts: list[int]) -> Read:
        counts[0] += 1
        return SliceRead(b, lo, hi)

    def local(self, arena: int, row: int) -> tuple[int, int]:
        """(batch, row within the batch's output) of one arena row."""
        b = int(self.batch_of[arena][row])
        return b, row - int(self.start[b])

    def read(self, operand: Operand, device: torch.device, counts: list[int]) -> Read:
        """Training read over the batches' (detached) outputs, with a ``route`` that sends
        its gradient back to the producers' gradient buffers."""
        if operand.view is not None:
            first = self.batch_of[operand.arena]
            b = int(first[operand.view.start])
            if b == int(first[operand.view.stop - 1]):  # inside one batch's region
                lo = operand.view.start - int(self.start[b])
                return self._slice(b, lo, lo + len(operand.view), counts)
        rows = operand.rows()
        batches = self.batch_of[operand.arena][rows]
        local = rows - self.start[batches]
        cut = np.flatnonzero((np.diff(batches) != 0) | (np.diff(local) != 1)) + 1
        if not len(cut):
            return self._slice(int(batches[0]), int(local[0]), int(local[0]) + len(rows),
                               counts)
        counts[1] += 1
        counts[2] += len(rows)
        distinct = list(dict.fromkeys(batches.tolist()))
        if len(cut) + 1 <= 2 * len(distinct) + 2:  # few pieces (built only then)
            seg_lo = np.concatenate([[0], cut]).tolist()
            seg_hi = np.concatenate([cut, [len(rows)]]).tolist()
            return CatRead([(int(batches[i]), int(local[i]), int(local[i]) + j - i)
                            for i, j in zip(seg_lo, seg_hi, strict=True)])
        groups = []
        for b in distinct:
            pos = np.flatnonzero(batches == b)
            groups.append((b, to_device(local[pos].copy(), device), to_device(pos, device)))
        return SelectRead(groups, len(rows))


class SliceRead:
    """Rows ``lo:hi`` of tensor ``b`` (an arena, or a batch's output in training; zero-copy);
    backward adds into that slice."""

    __slots__ = ("b", "hi", "lo", "n")
    gather = False

    def __init__(self, b: int, lo: int, hi: int) -> None:
        self.b, self.lo, self.hi, self.n = b, lo, hi, hi - lo

    def __len__(self) -> int:
        return self.n

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return outs[self.b].narrow(0, self.lo, self.n)  # cheaper to dispatch than [lo:hi]

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        """Add the read's gradient into its producer's gradient buffer (a narrower gradient
        covers the leading columns)."""
        dst = bufs[self.b].narrow(0, self.lo, self.n)
        if grad.shape[1] != dst.shape[1]:
            dst = dst.narrow(1, 0, grad.shape[1])
        dst.add_(grad)


class WholeRead(SliceRead):
    """Every row of batch ``b``'s output, in order: the output itself (no narrowed view,
    whose backward would zero-fill a gradient of the whole output and copy into it)."""

    __slots__ = ()

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return outs[self.b]


class CatRead:
    """A few row ranges of several batch outputs, concatenated."""

    __slots__ = ("pieces",)
    gather = True

    def __init__(self, pieces: list[tuple[int, int, int]]) -> None:
        self.pieces = pieces

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return torch.cat([outs[b][lo:hi] for b, lo, hi in self.pieces])

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        """Add each piece's gradient rows into its producer's buffer."""
        off = 0
        for b, lo, hi in self.pieces:
            bufs[b][lo:hi] += grad[off:off + hi - lo]
            off += hi - lo


class SelectRead:
    """Scattered rows of one or more batch outputs: per producer ``(batch, its rows, their
    positions in the read)``."""

    __slots__ = ("groups", "rows")
    gather = True

    def __init__(self, groups: list[tuple[int, Tensor, Tensor]], rows: int) -> None:
        self.groups, self.rows = groups, rows

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        if len(self.groups) == 1:
            b, idx, _ = self.groups[0]
            return outs[b].index_select(0, idx)
        first = outs[self.groups[0][0]]
        out = first.new_empty((self.rows, first.shape[1]))
        for b, idx, pos in self.groups:
            out[pos] = outs[b].index_select(0, idx)
        return out

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        """``index_add_`` each producer's rows of the gradient into its buffer."""
        if len(self.groups) == 1:
            b, idx, _ = self.groups[0]
            bufs[b].index_add_(0, idx, grad)
            return
        for b, idx, pos in self.groups:
            bufs[b].index_add_(0, idx, grad.index_select(0, pos))


def whole_rows(read: Read) -> tuple[int, np.ndarray] | None:  # type: ignore[type-arg]
    """``(arena, int64 rows)`` of a whole-row read (a gather or a slice), else ``None`` (the
    short paths' view of a read: rows they index in place)."""
    kind = type(read)
    if kind is RowsRead:
        return read.b, read.idx.numpy()  # type: ignore[attr-defined]
    if kind is SliceRead:
        return read.b, np.arange(read.lo, read.hi, dtype=np.int64)  # type: ignore[attr-defined]
    return None
