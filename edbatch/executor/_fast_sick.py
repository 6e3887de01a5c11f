"""The in-place executor's short path for child-sum Tree-LSTM batches (SICK, inference).

A :class:`~edbatch.executor.cells_sick.SickNode` batch on the general path reads each child
slot with its own gather of whole ``[h; c]`` rows, concatenates the slots (a second copy),
gathers the ``W_f x + b_f`` row of each child's parent (a third) and goes through the cell
adapter. Here, where a run qualifies (:func:`~edbatch.executor._fast_lstm.qualifies`: fused
kernels on, CPU float32/64 arenas, nothing saved for a backward), such a batch gathers only
the children's ``h`` columns, all slots in one ``index_select`` (slot after slot, the general
path's row order), and the compiled kernel
(:func:`~edbatch.executor._fused_sick.sick_forward_rows`) adds each child's parent ``W_f x`` row
and reads its ``c`` in place from the state arena by row index. The same GEMMs on operands of
the same values (``[W_iou; W_f]^T`` stacked, ``h~`` summed by ``index_add_`` in the same
order) and the same element-wise arithmetic; the only reassociation is ``f_k``'s
pre-activation, ``(W_f x + b_f) + U_f h_k`` rather than the ``addmm`` of the general path
(``tests/executor/test_fast_sick.py`` checks 1e-10 in float64).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fused_sick
from edbatch.executor._fast_lstm import install_short
from edbatch.executor._reads import Read, RowsRead, SliceRead, whole_rows
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.cells_sick import stacked_weights

__all__ = ["KIND", "FastSickStep", "sick_short"]

#: The op kind this short path serves.
KIND = "tree_lstm_sick.node"


class FastSickStep:
    """One child-sum Tree-LSTM batch of ``n`` nodes: the word rows by ``x`` (a read of the
    embedding arena), the children's rows ``kids`` (``int64``, slot after slot; ``seg``:
    the node of each, ``0..n-1``; both also as torch indices) of state arena ``arena``
    (none: a batch of leaves), output rows ``os:os+n`` of arena ``oa``; ``names``: the
    parameters ``W_iou, b_iou, U_iou, W_f, b_f, U_f``; ``hidden`` is ``H``."""

    __slots__ = ("arena", "hidden", "kid_t", "kids", "n", "name", "names", "oa", "os",
                 "seg", "seg_t", "x")

    def __init__(self, x: Read, arena: int, kids: np.ndarray,  # type: ignore[type-arg]
                 seg: np.ndarray, oa: int, os: int, names: tuple[str, ...],  # type: ignore[type-arg]
                 hidden: int, n: int, name: str = "") -> None:
        self.x, self.arena, self.kids, self.seg, self.oa, self.os = x, arena, kids, seg, oa, os
        self.kid_t, self.seg_t = torch.from_numpy(kids), torch.from_numpy(seg)
        self.n, self.names, self.hidden, self.name = n, names, hidden, name

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        """Put what :meth:`__call__` reads into ``into`` (made once per run, inside
        ``TRANSPOSED.run()``; never across runs): ``[W_iou; W_f]^T`` and ``[b_iou; b_f]``
        under ``(W_iou, W_f)`` (a batch of leaves reads ``W_iou^T`` as its leading columns, a
        view: no copy of its own), ``U_iou^T``, ``U_f^T`` under ``(name, 0)``, the bias
        ``b_iou`` under its name."""
        w_iou, b_iou, u_iou, w_f, b_f, u_f = self.names
        if (w_iou, w_f) not in into:  # (the kernel path's copies, where it made them)
            w_t, bias = stacked_weights(params[w_iou], params[w_f], params[b_iou], params[b_f])
            into[(w_iou, w_f)], into[(b_iou, b_f)] = w_t, bias.detach()
            into[b_iou] = params[b_iou].detach()
        for name in (u_iou, u_f):
            if (name, 0) not in into:
                into[(name, 0)] = TRANSPOSED(params[name])

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w: Mapping[Any, Tensor]) -> None:
        n, hidden = self.n, self.hidden
        w_iou, b_iou, u_iou, w_f, b_f, u_f = self.names
        try:
            x = self.x(arenas)
            out = views[self.oa][self.os:self.os + n]
            if self.arena < 0:  # leaves
                g = torch.addmm(w[b_iou], x, w[(w_iou, w_f)].narrow(1, 0, 3 * hidden))
                gv = g.numpy()
                _fused_sick.sick_forward_rows(gv, np.empty((0, hidden), gv.dtype), out,
                                              self.kids, self.seg, out,
                                              np.empty((n, hidden), gv.dtype))
                return
            gw = torch.addmm(w[(b_iou, b_f)], x, w[(w_iou, w_f)])
            h_k = arenas[self.arena].narrow(1, 0, hidden).index_select(0, self.kid_t)
            h_sum = h_k.new_zeros(n, hidden).index_add_(0, self.seg_t, h_k)
            gw[:, :3 * hidden].addmm_(h_sum, w[(u_iou, 0)])
            f = torch.mm(h_k, w[(u_f, 0)])
            gv = gw.numpy()
            _fused_sick.sick_forward_rows(gv, f.numpy(), views[self.arena], self.kids,
                                          self.seg, out, np.empty((n, hidden), gv.dtype))
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(f"batch of op type {self.name!r} ({n} nodes, child-sum "
                                 f"Tree-LSTM short path) failed: {type(e).__name__}: {e}") from e


def _step(step: Any, arenas: Sequence[tuple[int, int]]) -> FastSickStep | None:
    """The short step of one child-sum batch, or ``None`` where its reads do not fit (not
    whole rows, children in several arenas, a slot longer than the nodes with that many
    children)."""
    hidden = step.width // 2
    if len(step.op.params) != 6 or not step.reads or type(step.reads[0]) not in \
            (RowsRead, SliceRead):
        return None
    slots = [whole_rows(r) for r in step.reads[1:]]
    if any(s is None for s in slots) or len({s[0] for s in slots}) > 1:  # type: ignore[index]
        return None
    if not slots:
        return FastSickStep(step.reads[0], -1, np.zeros(0, np.int64), np.zeros(0, np.int64),
                            step.out_arena, step.out_start, tuple(step.op.params), hidden,
                            step.size, step.op.name)
    arena = slots[0][0]  # type: ignore[index]
    if arenas[arena][1] != 2 * hidden:
        return None
    has = step.attrs.numpy() > np.arange(len(slots))[:, None]  # [slot, node]: node has it
    if has.sum(1).tolist() != [len(r[1]) for r in slots]:  # type: ignore[index]
        return None
    kids = np.concatenate([r[1] for r in slots]).astype(np.int64, copy=False)  # type: ignore[index]
    return FastSickStep(step.reads[0], arena, kids, np.nonzero(has)[1],
                        step.out_arena, step.out_start, tuple(step.op.params), hidden,
                        step.size, step.op.name)


def sick_short(program: Any, device: torch.device) -> Any:
    """Give ``program``'s child-sum Tree-LSTM batches (the registered kernel, children read
    as whole rows of one state arena) a :class:`FastSickStep` in ``program.short`` (its
    other entries are kept); returns ``program``. Nothing off the CPU."""
    return install_short(program, device, KIND, lambda step: _step(step, program.arenas))
