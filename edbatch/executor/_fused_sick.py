"""Fused element-wise bodies of the child-sum Tree-LSTM (SICK): the node's forward
(:func:`sick_forward`, on gathered child rows), the inference short path's forward that reads
the children in place (:func:`sick_forward_rows`, :mod:`~edbatch.executor._fast_sick`) and
the node's hand backward (:class:`~edbatch.executor.cells_sick.SickNode`).

As :mod:`~edbatch.executor._fused`: numba loops over numpy views of the torch tensors (zero
copy), row by row, with its ``tanh`` and ``sigmoid`` (float64: libm, so fused and unfused
agree to rounding; ``tests/executor/test_fused.py`` and ``tests/executor/test_fast_sick.py``
check). Callers check :func:`~edbatch.executor._fused.usable` (or the short path's
``qualifies``) first.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from edbatch.executor._fused import _jit, _jit_inline, _sig_, _sigmoid, _tanh, _tanh_

__all__ = ["sick_backward", "sick_forward", "sick_forward_rows"]


@_jit
def _sick_fwd(gw, f, rows, seg, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(gw.shape[0]):  # t holds fc = sum_k f_k c_k until the last loop
        t[b, :] = 0
    for n in range(f.shape[0]):  # the child rows, in order (as index_add sums them)
        fr, cr, acc = f[n], rows[n], t[seg[n]]
        _sig_(fr)
        for j in range(h):
            acc[j] += fr[j] * cr[h + j]
    _sick_out(gw, out, t)


@_jit_inline
def _state_out(o, c, h2, t):  # type: ignore[no-untyped-def]
    """``t = tanh(c)``, ``h2 = o t``: one loop per store (each vectorises)."""
    for j in range(c.shape[0]):
        t[j] = _tanh(c[j])
    for j in range(c.shape[0]):
        h2[j] = o[j] * t[j]


@_jit
def _sick_out(gw, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(gw.shape[0]):  # t holds fc on entry, tanh(c) on exit
        gr, orow, tr = gw[b], out[b], t[b]
        _sig_(gr[:2 * h])
        _tanh_(gr[2 * h:3 * h])
        i, u, c = gr[:h], gr[2 * h:3 * h], orow[h:]
        for j in range(h):  # one store per loop: each vectorises (a loop storing c, h and
            c[j] = i[j] * u[j] + tr[j]  # tanh(c) at once did not; the same arithmetic)
        _state_out(gr[h:2 * h], c, orow[:h], tr)


def sick_forward(gw: Tensor, f: Tensor, rows: Tensor, segment: Tensor, out: Tensor,
                 t: Tensor) -> None:
    """Child-sum Tree-LSTM node in place: ``gw`` (``[B, >= 3H]``, contiguous; its first
    ``3H`` columns the pre-activations ``i o u``) becomes ``[sigmoid(i o); tanh(u)]``; the
    child rows' forget pre-activations ``f`` (``[N, H]``) become ``sigmoid``;
    ``c = i u + sum_k f_k c_k`` over the child rows ``n`` with ``segment[n] == b`` (``c_k``:
    the second half of ``rows[n]``, ``[N, 2H]``), ``out = [o tanh(c); c]``,
    ``t = tanh(c)``. No children: ``N = 0``."""
    _sick_fwd(gw.numpy(), f.numpy(), rows.numpy(), segment.numpy(), out.numpy(), t.numpy())


@_jit
def _sick_fwd_rows(gw, f, states, kids, seg, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(gw.shape[0]):
        t[b, :] = 0
    s = np.empty(h, t.dtype)
    for n in range(f.shape[0]):  # f_k = sigmoid(U_f h_k + (W_f x + b_f) of its node)
        fr, cr, acc, wr = f[n], states[kids[n]][h:], t[seg[n]], gw[seg[n]][3 * h:]
        for j in range(h):
            s[j] = _sigmoid(fr[j] + wr[j])
        for j in range(h):
            acc[j] += s[j] * cr[j]
    _sick_out(gw, out, t)


def sick_forward_rows(gw: np.ndarray, f: np.ndarray, states: np.ndarray,  # type: ignore[type-arg]
                      kids: np.ndarray, seg: np.ndarray, out: np.ndarray,  # type: ignore[type-arg]
                      t: np.ndarray) -> None:  # type: ignore[type-arg]
    """:func:`sick_forward` reading the children in place: child
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
