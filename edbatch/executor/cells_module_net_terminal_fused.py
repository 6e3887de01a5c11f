"""Compiled bodies of the module network's terminal modules, forward and backward.

``count`` / ``exist`` is seven torch calls forward (sum, arange, sub, pow, exp, linear,
tanh) and five backward, ``compare`` four and five, the answer's loss five and five, each
on a few rows: per mini-batch of 64 CLEVR questions about ten such batches, run once each
per step, so their torch calls run cold (measured in a training run: a ``count`` batch of
37 rows 157 us on its first call against 48 us repeated at once). Here each batch is one
numba ``@njit`` loop over numpy views of the torch tensors (zero copy, as
:mod:`edbatch.executor.cells_module_net_fused`), forward and backward.

Same equations and the same saves as the torch bodies in
:mod:`edbatch.executor.cells_module_net_terminal` (which stay the reference and serve
autograd recording, ``fused=False``, CUDA and other dtypes): the two paths are
interchangeable per batch, a compiled forward's saves read by the torch backward and back.
The weight gradients stay the torch path's batched ``dY^T X`` (``RoleGrads.linear``: the
compiled backward hands back ``dz`` and the saved input). Float64: the sums in another
order, so rounding-level from torch; float32: ``tanh`` is :mod:`edbatch.executor._fused`'s
rational one (a few 1e-7).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._fused import _jit, _tanh
from edbatch.executor.cells_module_net_fused import _EMPTY, SceneGrad, _param, _weighted

__all__ = ["answer_backward", "answer_forward", "compare_backward", "compare_forward",
           "count_backward", "count_forward", "query_backward", "query_forward", "usable"]

_DTYPES = (torch.float32, torch.float64)


def usable(*tensors: Tensor) -> bool:
    """Whether the compiled bodies serve a batch of ``tensors`` (operands, gradient and
    parameters): fused kernels on, CPU, one dtype of float32/64, nothing requiring grad (so
    nothing records autograd). Any strides (the loops index rows and columns)."""
    if not _fused.enabled():
        return False
    dtype = tensors[0].dtype
    if dtype not in _DTYPES:
        return False
    for t in tensors:
        if not t.is_cpu or t.dtype is not dtype or t.requires_grad:
            return False
    return True


def _mat(t: Tensor) -> np.ndarray:
    """A numpy view of a 2-D parameter (cached, as :func:`cells_module_net_fused._param`)."""
    key = (t.data_ptr(), t.dtype, t.shape)
    view = _MATS.get(key)
    if view is None:
        if len(_MATS) >= 256:
            _MATS.clear()
        view = _MATS[key] = t.detach().numpy()
    return view


_MATS: dict[tuple[int, torch.dtype, torch.Size], np.ndarray] = {}


def _out(out: Tensor | None, rows: int, width: int, like: Tensor) -> Tensor:
    return like.new_empty(rows, width) if out is None else out


@_jit
def _dense_tanh(x, w, b, out):  # type: ignore[no-untyped-def]
    """``out = tanh(x W^T + b)`` row by row (count's bins, query's weighted rows)."""
    h, m = w.shape[0], w.shape[1]
    for r in range(x.shape[0]):
        for o in range(h):
            z = b[o]
            for j in range(m):
                z += w[o, j] * x[r, j]
            out[r, o] = _tanh(z)


@_jit
def _tanh_back_row(grad, y, w, r, dz, acc):  # type: ignore[no-untyped-def]
    """Row ``r`` of a ``tanh`` layer's backward: ``dz[r] = grad[r] (1 - y[r]^2)`` and
    ``acc = dz[r] W`` (the gradient of its input row; ``acc`` is overwritten)."""
    acc[:] = 0.0
    for o in range(w.shape[0]):
        v = y[r, o]
        d = grad[r, o] * (1.0 - v * v)
        dz[r, o] = d
        for c in range(w.shape[1]):
            acc[c] += d * w[o, c]


# ---------------------------------------------------------------------- count / exist
@_jit
def _count_fwd(att, w, b, bins, out, diff, k):  # type: ignore[no-untyped-def]
    n, nk = att.shape[1], w.shape[1]
    for r in range(att.shape[0]):
        s = att[r, 0]
        for j in range(1, n):
            s += att[r, j]
        for m in range(nk):
            d = s - bins[m]
            diff[r, m] = d
            k[r, m] = np.exp(d * d * -2.0)
    _dense_tanh(k, w, b, out)


@_jit
def _count_bwd(grad, y, k, diff, w, dz, d_att):  # type: ignore[no-untyped-def]
    nk, n = w.shape[1], d_att.shape[1]
    dk = np.empty(nk, dz.dtype)
    for r in range(grad.shape[0]):
        _tanh_back_row(grad, y, w, r, dz, dk)
        ds = dk[0] * k[r, 0] * diff[r, 0]
        for m in range(1, nk):
            ds += dk[m] * k[r, m] * diff[r, m]
        ds *= -4.0
        for j in range(n):
            d_att[r, j] = ds


_BINS: dict[tuple[torch.dtype, int], np.ndarray] = {}


def count_forward(att: Tensor, w: Tensor, b: Tensor, out: Tensor | None
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, diff, k)``: ``diff = sum(att) - m``, ``k = exp(-2 diff^2)``, ``y = tanh(W k + b)``."""
    key = (att.dtype, w.shape[1])
    bins = _BINS.get(key)
    if bins is None:
        bins = _BINS[key] = torch.arange(w.shape[1], dtype=att.dtype).numpy()
    out = _out(out, att.shape[0], w.shape[0], att)
    diff, k = att.new_empty(att.shape[0], w.shape[1]), att.new_empty(att.shape[0], w.shape[1])
    _count_fwd(att.numpy(), _mat(w), _param(b), bins, out.numpy(), diff.numpy(), k.numpy())
    return out, diff, k


def count_backward(grad: Tensor, y: Tensor, k: Tensor, diff: Tensor, w: Tensor,
                   objects: int) -> tuple[Tensor, Tensor]:
    """``(dz, d att)``: ``dz = grad (1 - y^2)``, ``d att_j = -4 sum_m (dz W)_m k_m diff_m``."""
    dz, d_att = torch.empty_like(grad), grad.new_empty(grad.shape[0], objects)
    _count_bwd(grad.numpy(), y.numpy(), k.numpy(), diff.numpy(), _mat(w), dz.numpy(),
               d_att.numpy())
    return dz, d_att


# ---------------------------------------------------------------------- compare
@_jit
def _compare_fwd(x, y, w, b, xy, out):  # type: ignore[no-untyped-def]
    h, o_n = x.shape[1], w.shape[0]
    for r in range(x.shape[0]):
        for c in range(h):
            xy[r, c] = x[r, c]
            xy[r, h + c] = y[r, c]
            xy[r, 2 * h + c] = x[r, c] * y[r, c]
        for o in range(o_n):
            z = b[o]
            for c in range(3 * h):
                z += w[o, c] * xy[r, c]
            out[r, o] = _tanh(z)


@_jit
def _compare_bwd(grad, out, x, y, w, dz, dx, dy):  # type: ignore[no-untyped-def]
    h = x.shape[1]
    dxy = np.empty(3 * h, dz.dtype)
    for r in range(grad.shape[0]):
        _tanh_back_row(grad, out, w, r, dz, dxy)
        for c in range(h):
            dx[r, c] = dxy[c] + dxy[2 * h + c] * y[r, c]
            dy[r, c] = dxy[h + c] + dxy[2 * h + c] * x[r, c]


def compare_forward(x: Tensor, y: Tensor, w: Tensor, b: Tensor, out: Tensor | None
                    ) -> tuple[Tensor, Tensor]:
    """``(out, xy)``: ``xy = [x; y; x * y]``, ``out = tanh(W xy + b)``."""
    out = _out(out, x.shape[0], w.shape[0], x)
    xy = x.new_empty(x.shape[0], 3 * x.shape[1])
    _compare_fwd(x.numpy(), y.numpy(), _mat(w), _param(b), xy.numpy(), out.numpy())
    return out, xy


def compare_backward(grad: Tensor, out: Tensor, x: Tensor, y: Tensor, w: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``(dz, d x, d y)`` of :func:`compare_forward`."""
    dz, dx, dy = torch.empty_like(grad), torch.empty_like(x), torch.empty_like(y)
    _compare_bwd(grad.numpy(), out.numpy(), x.numpy(), y.numpy(), _mat(w), dz.numpy(),
                 dx.numpy(), dy.numpy())
    return dz, dx, dy


# ---------------------------------------------------------------------- answer
@_jit
def _answer_fwd(h, w, b, gold, logits, lse, out):  # type: ignore[no-untyped-def]
    a_n, m = w.shape[0], w.shape[1]
    for r in range(h.shape[0]):
        for a in range(a_n):  # logits = h W^T + b (a batch's one torch GEMM ran cold)
            z = 0.0
            for k in range(m):
                z += h[r, k] * w[a, k]
            logits[r, a] = z + b[a]
        top = logits[r, 0]
        for a in range(1, a_n):
            top = max(top, logits[r, a])
        s = 0.0
        for a in range(a_n):
            s += np.exp(logits[r, a] - top)
        v = top + np.log(s)
        lse[r, 0] = v
        out[r, 0] = v - logits[r, gold[r]]


@_jit
def _answer_bwd(grad, logits, lse, gold, w, d, d_h):  # type: ignore[no-untyped-def]
    for r in range(grad.shape[0]):
        g, top = grad[r, 0], lse[r, 0]
        for k in range(w.shape[1]):
            d_h[r, k] = 0.0
        for a in range(logits.shape[1]):
            p = np.exp(logits[r, a] - top)
            if a == gold[r]:
                p -= 1.0
            d[r, a] = p * g
            for k in range(w.shape[1]):  # d h = d W
                d_h[r, k] += d[r, a] * w[a, k]


def answer_forward(h: Tensor, w: Tensor, b: Tensor, gold: Tensor, out: Tensor | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """``(loss, logits, lse)``: ``logits = W h + b``, ``loss = logsumexp(logits) -
    logits[gold]``, one compiled call (a torch GEMM of 64 rows of 28 x H, the step's only
    one of its shape, cost more run cold than the loop)."""
    out = _out(out, h.shape[0], 1, h)
    logits = h.new_empty(h.shape[0], w.shape[0])
    lse = h.new_empty(h.shape[0], 1)
    _answer_fwd(h.numpy(), _mat(w), _param(b), gold.reshape(-1).numpy(), logits.numpy(),
                lse.numpy(), out.numpy())
    return out, logits, lse


def answer_backward(grad: Tensor, logits: Tensor, lse: Tensor, gold: Tensor, w: Tensor
                    ) -> tuple[Tensor, Tensor]:
    """``(d logits, d h)``: ``d logits = grad (softmax - onehot(gold))``, ``d h = d W``
    (one compiled call)."""
    d = torch.empty_like(logits)
    d_h = logits.new_empty(logits.shape[0], w.shape[1])
    _answer_bwd(grad.numpy(), logits.numpy(), lse.numpy(), gold.reshape(-1).numpy(), _mat(w),
                d.numpy(), d_h.numpy())
    return d, d_h


# ---------------------------------------------------------------------- query
@_jit
def _query_fwd(att, arena, idx, w, b, r_out, out):  # type: ignore[no-untyped-def]
    _weighted(att, arena, idx, r_out)  # the attention-weighted object rows
    _dense_tanh(r_out, w, b, out)


@_jit
def _query_bwd(grad, y, arena, idx, w, dz, d_r, d_att):  # type: ignore[no-untyped-def]
    n, f = d_att.shape[1], w.shape[1]
    for r in range(grad.shape[0]):
        row = idx[r]
        _tanh_back_row(grad, y, w, r, dz, d_r[r])
        for j in range(n):
            z = 0.0
            for k in range(f):
                z += d_r[r, k] * arena[row, j * f + k]
            d_att[r, j] = z


def query_forward(att: Tensor, arena: Tensor, idx: Tensor, w: Tensor, b: Tensor,
                  out: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(y, r)``: ``r = sum_j att_j f_j`` (objects of rows ``idx`` of the scene arena),
    ``y = tanh(W r + b)``."""
    out = _out(out, att.shape[0], w.shape[0], att)
    r = att.new_empty(att.shape[0], w.shape[1])
    _query_fwd(att.numpy(), arena.numpy(), idx.numpy(), _mat(w), _param(b), r.numpy(),
               out.numpy())
    return out, r


def query_backward(grad: Tensor, y: Tensor, att: Tensor, arena: Tensor, idx: Tensor,
                   w: Tensor) -> tuple[Tensor, Tensor, SceneGrad]:
    """``(dz, d att, d scene)`` of :func:`query_forward` (``d f_j = att_j d r``)."""
    dz, d_att = torch.empty_like(grad), torch.empty_like(att)
    d_r = np.empty((grad.shape[0], w.shape[1]), d_att.numpy().dtype)
    _query_bwd(grad.numpy(), y.numpy(), arena.numpy(), idx.numpy(), _mat(w), dz.numpy(), d_r,
               d_att.numpy())
    a = np.ascontiguousarray(att.numpy())
    empty: np.ndarray = _EMPTY[a.dtype]  # type: ignore[assignment]
    return dz, d_att, SceneGrad(a, d_r, empty)
