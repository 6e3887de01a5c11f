"""Reads of only the ``h`` columns of LSTM ``[h; c]`` state rows (inference).

The BiLSTM's layer-2 cells and loss read layer-1 / layer-2 states of which they use only the
``h`` half: :func:`head_reads` gives those operands of the registered kernels reads of the
leading columns (a gather of half the bytes, no re-packing of strided halves), and the
layer-2 projection step of :mod:`~edbatch.executor._hoist` reads its ``(f1, b1)`` pair as
one :class:`HeadPairRead`. The kernels take either form; the training reads are unchanged.
An inference run (a short path, :mod:`~edbatch.executor._fast_pair`) reads the loss's
``(f2, b2)`` pair as one too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from edbatch.executor._program import Program, Step, given_steps, new_step, replace_steps
from edbatch.executor._reads import Read, RowsRead, SliceRead, to_device
from edbatch.executor.cells_hoist import HEAD_READS, HoistSpec, l2_project
from edbatch.executor.kernels import KERNELS
from edbatch.memory.plan import Operand

__all__ = ["HeadPairRead", "HeadRowsRead", "HeadSliceRead", "head_read", "head_reads", "pair_read"]


def pair_read(operands: tuple[Operand, ...], shapes: tuple[tuple[int, ...], ...],
              spec: HoistSpec, device: torch.device) -> HeadPairRead | None:
    """The layer-2 projection's ``(f1, b1)`` state gathers (one arena, one row each per
    node) as one :class:`HeadPairRead`; ``None`` for anything else."""
    if spec.project is not l2_project or len(operands) != 2 or len(shapes) != 2 or \
            shapes[0] != shapes[1] or len(shapes[0]) != 1 or \
            any(o.view is not None for o in operands) or \
            operands[0].arena != operands[1].arena:
        return None
    rows0, rows1 = (np.asarray(o.gather) for o in operands)
    if len(rows0) != len(rows1):
        return None
    idx = to_device(np.stack([rows0, rows1], 1).reshape(-1).astype(np.int64), device)
    return HeadPairRead(operands[0].arena, idx, shapes[0][0] // 2)



class HeadRowsRead(RowsRead):
    """Rows ``idx`` of arena ``b``, leading ``cols`` columns only (an ``index_select`` of
    the column view); the gradient routes back as a narrow one (:meth:`RowsRead.route`)."""

    __slots__ = ("cols",)

    def __init__(self, b: int, idx: torch.Tensor, cols: int) -> None:
        self.b, self.idx, self.cols = b, idx, cols  # RowsRead's fields, without its call

    def __call__(self, outs: Sequence[torch.Tensor]) -> torch.Tensor:
        return outs[self.b].narrow(1, 0, self.cols).index_select(0, self.idx)


class HeadPairRead(HeadRowsRead):
    """Rows ``idx`` (the ``f1, b1`` rows of each node, interleaved) of arena ``b``, leading
    ``cols`` columns, as ``[nodes, 2 cols]``: a layer-2 projection's input ``[h(f1); h(b1)]``
    from one ``index_select`` (instead of two and a ``cat``: the same values); the gradient
    ``[nodes, 2 cols]`` routes back as ``[2 nodes, cols]`` rows."""

    __slots__ = ()

    def __call__(self, outs: Sequence[torch.Tensor]) -> torch.Tensor:
        return super().__call__(outs).view(-1, 2 * self.cols)

    def route(self, grad: torch.Tensor, bufs: Sequence[torch.Tensor]) -> None:
        """Add each node's two gradient halves into its two rows' leading columns."""
        super().route(grad.reshape(-1, self.cols), bufs)


class HeadSliceRead(SliceRead):
    """Rows ``lo:hi`` of arena ``b``, leading ``cols`` columns only (a zero-copy view)."""

    __slots__ = ("cols",)

    def __init__(self, b: int, lo: int, hi: int, cols: int) -> None:
        self.b, self.lo, self.hi, self.n, self.cols = b, lo, hi, hi - lo, cols  # SliceRead's

    def __call__(self, outs: Sequence[torch.Tensor]) -> torch.Tensor:
        return outs[self.b].narrow(0, self.lo, self.n).narrow(1, 0, self.cols)


def head_read(read: Read, cols: int) -> Read:
    """``read`` restricted to the leading ``cols`` columns (unchanged if ``cols`` is 0)."""
    if cols <= 0:
        return read
    kind = type(read)  # by exact type: the Head* subclasses are already restricted
    if kind is RowsRead:
        return HeadRowsRead(read.b, read.idx, cols)  # type: ignore[attr-defined]
    if kind is SliceRead:
        return HeadSliceRead(read.b, read.lo, read.hi, cols)  # type: ignore[attr-defined]
    return read


def _head_step(step: Step) -> Step | None:
    """``step`` with its :data:`~edbatch.executor.cells_hoist.HEAD_READS` operands read as
    their ``h`` columns only, if it is a registered kernel's step of such a kind (``None``
    otherwise)."""
    slots = HEAD_READS.get(step.op.kind)
    if not (slots and step.op.in_shapes and not step.split and
            step.kernel is KERNELS.get(step.op.kind)):
        return None
    shapes = step.op.in_shapes
    return new_step(step.op, step.kernel, step.attrs, step.size, step.width, step.out_arena,
                    step.out_start, tuple([head_read(r, shapes[k][0] // 2) if k in slots else r
                                           for k, r in enumerate(step.reads)]),
                    step.split, step.stacked, step.writes_out)


def head_reads(program: Program) -> Program:
    """Read only the ``h`` columns of the LSTM-state operands of
    :data:`~edbatch.executor.cells_hoist.HEAD_READS` kinds (the BiLSTM's layer-2 cells and
    loss), in place in ``program``'s inference steps: a gather of half the bytes and no
    re-packing of strided halves. The training reads (``grad_steps``) are unchanged; the
    kernels take either form. A hoisted program's deferred steps (its recurrent batches,
    the hoisted cell's kernel, not their kind's registered one) stay deferred. Returns
    ``program``."""
    new = {}
    for i, step in given_steps(program.steps):
        if step.op.kind in HEAD_READS:
            headed = _head_step(step)
            if headed is not None:
                new[i] = headed
    if new:
        program.steps = replace_steps(program.steps, new)  # type: ignore[assignment]
    return program
