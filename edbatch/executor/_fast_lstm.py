"""The in-place executor's short path for hoisted LSTM recurrent batches (inference).

A BiLSTM mini-batch runs about 250 batches of the hoisted recurrent cell
(:class:`~edbatch.executor.cells_hoist.LSTMRecurrent`: ``g = projection + h W_h^T``, then the
fused element-wise kernel), each a small GEMM and a few microseconds of arithmetic. Through
the general kernel call a batch also pays the cell adapter (parameter binding, a named tuple
of parameters), ``split_state``, the fused path's per-call checks, an allocation for
``tanh(c')`` and four ``Tensor.numpy()`` conversions: several times the arithmetic at small
batch sizes. Here, where a run qualifies as a whole (fused kernels on, CPU arenas of float32
or float64, no profiling, nothing saved for a backward), such a batch runs as what remains:
its state read, ``addmm_`` into its projection rows, and the compiled kernel on numpy views
of the arenas taken once per run (:func:`_fused._lstm_fwd
<edbatch.executor._fused.lstm_forward>`, the same call the kernel makes). Same operations on
the same operands as the kernel path, so the values are bit-identical
(``tests/executor/test_fast_lstm.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fused, _fused_compiled
from edbatch.executor._program import given_steps, replace_steps
from edbatch.executor._reads import Read
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.kernels import KERNELS

__all__ = ["ENABLED", "FastStep", "bind_weight", "fast_steps", "install_short", "qualifies"]

#: Whether qualifying runs take the short path (``[False]``: every batch through its
#: kernel, the reference the tests compare with).
ENABLED = [True]


class FastStep:
    """One hoisted recurrent batch (made by :func:`~edbatch.executor._hoist.hoist_program`):
    its state read (whole ``[h; c]`` rows: an arena slice or gather), its projection rows
    ``lo:lo+n`` of arena ``pa`` and its output rows ``os:os+n`` of arena ``oa``; ``weight``
    names the gate weight parameter, ``hidden`` is ``H``."""

    __slots__ = ("hidden", "lo", "n", "name", "oa", "os", "pa", "state", "weight")

    def __init__(self, state: Read, pa: int, lo: int, n: int, oa: int, os: int, weight: str,
                 hidden: int, name: str = "") -> None:
        self.state, self.pa, self.lo, self.n, self.oa, self.os = state, pa, lo, n, oa, os
        self.weight, self.hidden, self.name = weight, hidden, name

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        """Put the contiguous ``W_h^T`` this batch reads into ``into`` (once per weight and
        run; call inside ``TRANSPOSED.run()``)."""
        bind_weight(params, into, self.weight, self.hidden)

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w_ht: Mapping[Any, Tensor]) -> None:
        n, lo, hidden = self.n, self.lo, self.hidden
        try:
            state = self.state(arenas)
            arenas[self.pa].narrow(0, lo, n).addmm_(state.narrow(1, 0, hidden),
                                                    w_ht[self.weight])
            g = views[self.pa][lo:lo + n]
            _fused._lstm_fwd(g, state.numpy(), hidden, views[self.oa][self.os:self.os + n],
                             np.empty((n, hidden), g.dtype))
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(f"batch of op type {self.name!r} ({n} nodes, hoisted LSTM "
                                 f"short path) failed: {type(e).__name__}: {e}") from e


def bind_weight(params: Mapping[str, Tensor], into: dict[Any, Tensor], weight: str,
                hidden: int) -> None:
    """Put the contiguous ``W_h^T`` of gate weight ``weight`` (``H = hidden``) into ``into``
    once per run (call inside ``TRANSPOSED.run()``)."""
    if weight not in into:
        w = params[weight]
        into[weight] = TRANSPOSED(w, w.shape[1] - hidden)


def fast_steps(program: Any, params: Mapping[str, Tensor], arenas: Sequence[Tensor],
               wanted: bool = True, chained: bool = False
               ) -> tuple[Sequence[Any], dict[Any, Tensor], list[np.ndarray]]:  # type: ignore[type-arg]
    """Per step of ``program`` its short-path step (a :class:`FastStep`, or a Tree-LSTM
    batch's :class:`~edbatch.executor._fast_tree.FastTreeStep`; with ``chained``, the
    program's ``chained`` steps where it has them: runs of hoisted batches as one
    :class:`~edbatch.executor._fast_chain.ChainStep`; ``None``: the general path; all
    ``None`` unless ``wanted``, the run :func:`qualifies` and ``program`` has any); the
    parameters they read (contiguous weight transposes made for this run: call inside
    ``TRANSPOSED.run()``); and numpy views of ``arenas``."""
    steps = (chained and getattr(program, "chained", None)) or getattr(program, "short", None)
    if not (steps and wanted and qualifies(arenas)):
        return _NONE * len(program.steps), {}, []
    weights: dict[Any, Tensor] = {}
    for f in steps:
        if f is not None:
            f.bind(params, weights)
    return steps, weights, [a.numpy() for a in arenas]


_NONE: tuple[None] = (None,)


def qualifies(arenas: Sequence[Tensor]) -> bool:
    """Whether a run over ``arenas`` takes the short path: fused kernels on (inside the
    executor's ``_fused.use``), CPU (unless the CPU is served by the compiled bodies, in
    tests), float32/float64, autograd not recording."""
    return ENABLED[0] and bool(arenas) and _fused.enabled() and arenas[0].device.type == "cpu" and \
        arenas[0].dtype in (torch.float32, torch.float64) and not torch.is_grad_enabled() and \
        "cpu" not in _fused_compiled.DEVICES


def install_short(program: Any, device: torch.device, kind: str,
                  make: Callable[[Any], Any]) -> Any:
    """Give ``program``'s batches of cell ``kind`` (its registered kernel, writing its own
    output region, not split, no short step yet) the short step ``make(step)`` returns
    (``None``: the general path) in ``program.short``, keeping its other entries; returns
    ``program``. Nothing off the CPU."""
    kernel = KERNELS.get(kind)
    if device.type != "cpu" or kernel is None:
        return program
    short = getattr(program, "short", ()) or ()
    new: dict[int, Any] = {}
    for i, step in given_steps(program.steps):  # (a hoisted program's deferred steps are
        if step.op.kind != kind or step.kernel is not kernel or step.split or \
                not step.writes_out or (short and short[i] is not None):  # hoisted cells)
            continue
        fast = make(step)
        if fast is not None:
            new[i] = fast
    if new:
        program.short = replace_steps(short or (None,) * len(program.steps), new)
    return program
