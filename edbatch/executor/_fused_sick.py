"""Fused element-wise bodies of the child-sum Tree-LSTM (SICK) beyond
:func:`~edbatch.executor._fused.sick_forward`: the inference short path's forward that reads
the children in place (:mod:`~edbatch.executor._fast_sick`) and the node's hand backward
(:class:`~edbatch.executor.cells_sick.SickNode`).

As :mod:`~edbatch.executor._fused`: numba loops over numpy views of the torch tensors (zero
copy), row by row, with its ``tanh`` and ``sigmoid`` (float64: libm, so fused and unfused
agree to rounding; ``tests/executor/test_fused.py`` and ``tests/executor/test_fast_sick.py``
check). Callers check :func:`~edbatch.executor._fused.usable` (or the short path's
``qualifies``) first.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from edbatch.executor._fused import _jit, _sick_out, _sigmoid

__all__ = ["sick_backward", "sick_forward_rows"]


@_jit
def _sick_fwd_rows(gw, f, states, kids, seg, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(gw.shape[0]):
        t[b, :] = 0
    for n in range(f.shape[0]):  # f_k = sigmoid(U_f h_k + (W_f x + b_f) of its node)
        fr, cr, acc, wr = f[n], states[kids[n]], t[seg[n]], gw[seg[n]]
        for j in range(h):
            acc[j] += _sigmoid(fr[j] + wr[3 * h + j]) * cr[h + j]
    _sick_out(gw, out, t)


def sick_forward_rows(gw: np.ndarray, f: np.ndarray, states: np.ndarray,  # type: ignore[type-arg]
                      kids: np.ndarray, seg: np.ndarray, out: np.ndarray,  # type: ignore[type-arg]
                      t: np.ndarray) -> None:  # type: ignore[type-arg]
    """:func:`~edbatch.executor._fused.sick_forward` reading the children in place: child
    row ``n`` is row ``kids[n]`` of ``states`` (an arena of ``[h; c]`` rows) and belongs to
    node ``seg[n]`` (``int64``); ``f`` (``[N, H]``) holds ``U_f h_k`` only: the kernel adds
    the node's ``W_f x + b_f``, columns ``3H:4H`` of ``gw`` (``[B, 4H]``), and leaves ``f``
    as it is; numpy arrays."""
    _sick_fwd_rows(gw, f, states, kids, seg, out, t)


@_jit
def _sick_bwd(grad, g, t, f, rows, seg, d, d_f, d_rows, dc):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    kids = f.shape[0] > 0
    for b in range(grad.shape[0]):
        grow, gr, tr, drow, dcr = grad[b], g[b], t[b], d[b], dc[b]
        for j in range(h):
            tj, ij, oj, uj = tr[j], gr[j], gr[h + j], gr[2 * h + j]
            dh = grow[j]
            dcj = dh * oj * (1 - tj * tj) + grow[h + j]
            dcr[j] = dcj
            drow[j] = dcj * uj * ij * (1 - ij)
            drow[h + j] = dh * tj * oj * (1 - oj)
            drow[2 * h + j] = dcj * ij * (1 - uj * uj)
        if kids:
            for j in range(h):
                drow[3 * h + j] = 0
    for n in range(f.shape[0]):  # the child rows, in order (as index_add sums them)
        fr, cr, dfr, drr, dcr, dwr = f[n], rows[n], d_f[n], d_rows[n], dc[seg[n]], d[seg[n]]
        for j in range(h):
            fj, dcj = fr[j], dcr[j]
            drr[h + j] = dcj * fj
            x = dcj * cr[h + j] * fj * (1 - fj)
            dfr[j] = x
            dwr[3 * h + j] += x


def sick_backward(grad: Tensor, g: Tensor, t: Tensor, d: Tensor,
                  kids: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None) -> None:
    """Child-sum Tree-LSTM node backward: ``d`` (``[B, 3H]``, or ``[B, 4H]`` with children)
    = pre-activation gradients of ``i o u`` from ``grad = d[h; c]`` and the forward's
    ``g = [sigmoid(i o); tanh(u)]`` (its first ``3H`` columns), ``t = tanh(c)``; with
    ``kids = (f, rows, segment, d_f, d_rows)`` (``f``: the child rows' forget gates
    ``[N, H]``, ``rows``: their states ``[N, 2H]``, ``segment``: the node of each) also the
    forget pre-activation gradients ``d_f`` (``[N, H]``), their sums per node in ``d``'s
    columns ``3H:4H`` (the gradient of ``W_f x + b_f``) and ``dc f_k`` into
    ``d_rows[:, H:]``."""
    gv, tv, dv = grad.numpy(), t.numpy(), d.numpy()
    dc = np.empty(tv.shape, tv.dtype)
    if kids is None:
        empty = np.empty((0, tv.shape[1]), tv.dtype)
        _sick_bwd(gv, g.numpy(), tv, empty, empty, np.empty(0, np.int64), dv, empty, empty, dc)
    else:
        f, rows, segment, d_f, d_rows = (x.numpy() for x in kids)
        _sick_bwd(gv, g.numpy(), tv, f, rows, segment, dv, d_f, d_rows, dc)
