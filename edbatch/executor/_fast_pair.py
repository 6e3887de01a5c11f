"""The in-place executor's short path for the BiLSTM loss's input (inference).

The loss reads the ``h`` columns of its two operands, the layer-2 states ``f2`` and ``b2``
(two ``index_select`` gathers, :func:`~edbatch.executor._head_reads.head_reads`), and its
kernel concatenates them into ``x = [h(f2); h(b2)]`` (a third copy) before its hidden layer.
Where both are gathers of one arena (the naive plan), an inference run that qualifies
(:func:`~edbatch.executor._fast_lstm.qualifies`) reads them as one
:class:`~edbatch.executor._head_reads.HeadPairRead` instead: one ``index_select`` of their
rows interleaved, viewed as ``[n, 2H]``, is ``x`` itself, which the kernel takes as its one
operand. The same values in the same layout: bit-identical outputs
(``tests/executor/test_hoist_reads.py``). Training keeps the two reads (the hand backward
routes one gradient per operand).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor._head_reads import HeadPairRead, HeadRowsRead
from edbatch.executor._program import given_steps, replace_steps
from edbatch.executor.kernels import KERNELS

__all__ = ["PAIRED", "PairStep", "pair_short"]

#: Kinds whose kernel takes its two ``h`` operands as one ``[h; h']`` operand (it
#: concatenates two otherwise).
PAIRED = frozenset({"bilstm.loss"})


class PairStep:
    """Batch ``step`` (its kernel, attrs and output region) with its two operands read as
    one pair ``read``."""

    __slots__ = ("read", "step")

    def __init__(self, step: Any, read: HeadPairRead) -> None:
        self.step, self.read = step, read

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Any]) -> None:
        """Keep the run's parameters (under this step: the kernel reads them by name)."""
        into[self] = params

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w: Mapping[Any, Any]) -> None:
        step = self.step
        region = arenas[step.out_arena].narrow(0, step.out_start, step.size)
        try:
            x = self.read(arenas)
            if step.writes_out:
                step.kernel(step.op, [x], w[self], step.attrs, out=region)
            else:
                region.copy_(step.kernel(step.op, [x], w[self], step.attrs))
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(f"batch of op type {step.op.name!r} ({step.size} nodes, "
                                 f"pair-read short path) failed: {type(e).__name__}: {e}"
                                 ) from e


def pair_short(program: Any, device: torch.device) -> Any:
    """Give ``program``'s :data:`PAIRED` batches (their registered kernel, not split) whose
    two operands are ``h``-column gathers of one arena, as wide and as long, a
    :class:`PairStep` in ``program.short`` (its other entries kept); returns ``program``.
    Nothing off the CPU."""
    if device.type != "cpu":
        return program
    short = getattr(program, "short", ()) or ()
    new: dict[int, PairStep] = {}
    for i, step in given_steps(program.steps):
        if step.op.kind not in PAIRED or step.kernel is not KERNELS.get(step.op.kind) or \
                step.split or (short and short[i] is not None) or len(step.reads) != 2 or \
                any(type(r) is not HeadRowsRead for r in step.reads):
            continue
        a, b = step.reads
        if a.b == b.b and a.cols == b.cols and a.idx.shape == b.idx.shape:
            new[i] = PairStep(step, HeadPairRead(a.b, torch.stack([a.idx, b.idx], 1).reshape(-1),
                                                 a.cols))
    if new:
        program.short = replace_steps(short or (None,) * len(program.steps), new)
    return program
