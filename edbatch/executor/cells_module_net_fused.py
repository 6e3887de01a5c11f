"""Compiled bodies of the module network's scene-reading modules, forward and backward.

A ``filter`` batch is five torch calls forward and seven backward, a ``relate`` batch about
fifteen and twenty-five, each a few microseconds on ``B x 10 x F`` elements: at ``B = 8`` the
calls, not the arithmetic, are the cost. Here each batch is one numba ``@njit`` loop over
numpy views of the torch tensors (zero copy, as :mod:`edbatch.executor._fused`), with the
weight gradients summed inside the loop (an ``(F,)`` vector and a scalar per batch, for
``RoleGrads.add``).

**The scene arena.** The modules that read a scene name that operand in ``indexed_reads``,
so on the CPU the executor hands them :class:`~edbatch.executor._reads.ArenaRows` (the
scene arena and each node's row in it) instead of a gathered ``B x 10F`` copy; the loops read
the objects' features in the arena, and the scene gradient comes back as a
:class:`SceneGrad` that adds itself into the gradient arena's rows (no ``index_add_`` of a
dense ``B x 10F`` gradient): ``d f_{r,j,k} += a_{r,j} v_{r,k} (+ c_{r,j} at k = 0)``, the form
of every scene gradient here (``filter``: ``v = w``; ``relate``: ``v = u``, ``c`` the mask
term; ``query``: ``a = att``, ``v = d r`` per row; ``scene``: ``c`` only).

Same equations and saves as the torch bodies in :mod:`edbatch.executor.cells_module_net`
(which stay the reference and serve CUDA, autograd recording, ``fused=False`` and other
dtypes; :func:`rows` materialises an ``ArenaRows`` for them): the two paths are
interchangeable per batch. The sigmoid is :mod:`edbatch.executor._fused`'s (``float64``:
``1 / (1 + exp(-x))``, rounding-level from torch; ``float32``: its rational ``tanh``, a few
1e-7). Enabled with the other fused kernels (:func:`edbatch.executor._fused.use`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._fused import _jit, _sigmoid
from edbatch.executor._reads import ArenaRows

__all__ = ["LocalRows", "SceneGrad", "arena_rows", "filter_backward", "filter_forward",
           "query_backward", "query_rows", "relate_backward", "relate_forward", "rows",
           "scene_grad", "usable"]


_DTYPES = (torch.float32, torch.float64)
#: ``(data_ptr, dtype, numel)`` of a parameter -> a numpy view of it (the array keeps its
#: tensor alive, so the address cannot be reused while the entry exists); the executor hands
#: kernels fresh detached tensors every run, over the same storage.
_VIEWS: dict[tuple[int, torch.dtype, int], np.ndarray] = {}
_VIEWS_MAX = 1024
_ARANGE: list[Tensor] = [torch.arange(64)]


def rows(scene: Tensor | ArenaRows) -> Tensor:
    """The ``(B, N * F)`` scene rows of an operand (an ``ArenaRows`` gathered)."""
    return scene.rows() if isinstance(scene, ArenaRows) else scene


class LocalRows(ArenaRows):
    """A plain ``(B, N * F)`` scene operand as ``ArenaRows`` (rows ``0..B-1`` of itself):
    its gradient goes back dense (:meth:`SceneGrad.dense`), as its read expects."""

    __slots__ = ()


def arena_rows(scene: Tensor | ArenaRows) -> ArenaRows:
    """A scene operand as ``ArenaRows`` (a plain tensor as :class:`LocalRows`)."""
    if isinstance(scene, ArenaRows):
        return scene
    n = scene.shape[0]
    if n > len(_ARANGE[0]):
        _ARANGE[0] = torch.arange(2 * n)
    return LocalRows(scene, _ARANGE[0][:n])


def scene_grad(g: SceneGrad, scene: ArenaRows) -> SceneGrad | Tensor:
    """The gradient a scene operand's read takes: ``g`` itself for an ``IndexedRead``'s
    ``ArenaRows``, the dense rows for a plain tensor's :class:`LocalRows`."""
    return g.dense(scene.arena) if isinstance(scene, LocalRows) else g


def usable(a: Tensor, scene: Tensor | ArenaRows) -> bool:
    """Whether the compiled bodies serve a batch with attention (or gradient) ``a`` and
    scene operand ``scene``: fused kernels on (:func:`edbatch.executor._fused.use`), no
    autograd recording (the in-place inference run and the hand-backward training run),
    CPU, float32/64, the scene's dtype."""
    f = scene.arena if isinstance(scene, ArenaRows) else scene
    return _fused.enabled() and not torch.is_grad_enabled() and a.is_cpu and f.is_cpu and \
        a.dtype in _DTYPES and f.dtype is a.dtype and not (a.requires_grad or f.requires_grad)


def _param(t: Tensor) -> np.ndarray:
    """A numpy view of parameter ``t`` (cached: ``Tensor.numpy`` costs about a torch call)."""
    key = (t.data_ptr(), t.dtype, t.numel())
    view = _VIEWS.get(key)
    if view is None:
        if len(_VIEWS) >= _VIEWS_MAX:
            _VIEWS.clear()
        view = _VIEWS[key] = t.detach().numpy().reshape(-1)
    return view


class SceneGrad:
    """A scene gradient ``d f_{r,j,k} = a_{r,j} v_{r,k} + [k = 0] c_{r,j}`` (``v``: one row
    for all nodes or one per node; ``a`` or ``c`` may be empty), added into the gradient
    arena rows of the nodes' scenes by :meth:`add_to` (what an ``IndexedRead`` routes)."""

    __slots__ = ("a", "c", "v")

    def __init__(self, a: np.ndarray, v: np.ndarray, c: np.ndarray) -> None:
        self.a, self.v, self.c = a, v, c

    def add_to(self, buf: Tensor, idx: Tensor) -> None:
        _scene_add(buf.numpy(), idx.numpy(), self.a, self.v, self.c)

    def dense(self, like: Tensor) -> Tensor:
        """The ``(B, N * F)`` gradient as a tensor (tests, other routes)."""
        out = like.new_zeros(max(len(self.a), len(self.c)), like.shape[1])
        self.add_to(out, torch.arange(len(out)))
        return out


@_jit
def _scene_add(buf, idx, a, v, c):  # type: ignore[no-untyped-def]
    f = v.shape[1]
    for r in range(idx.shape[0]):
        row, vr = idx[r], r if v.shape[0] > 1 else 0
        for j in range(a.shape[1]):
            aj = a[r, j]
            for k in range(f):
                buf[row, j * f + k] += aj * v[vr, k]
        for j in range(c.shape[1]):
            buf[row, j * f] += c[r, j]


# ---------------------------------------------------------------------- filter
@_jit
def _filter_fwd(att, arena, idx, w, b, out, s):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], w.shape[0]
    for r in range(att.shape[0]):
        row = idx[r]
        for j in range(n):
            z = 0.0
            for k in range(f):
                z += arena[row, j * f + k] * w[k]
            v = _sigmoid(z + b[0])
            s[r, j] = v
            out[r, j] = att[r, j] * v


@_jit
def _filter_bwd(grad, att, s, arena, idx, d_att, dz, dw, db):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], dw.shape[0]
    dw[:] = 0.0
    acc = 0.0
    for r in range(att.shape[0]):
        row = idx[r]
        for j in range(n):
            v, g = s[r, j], grad[r, j]
            d_att[r, j] = g * v
            d = g * att[r, j] * (v * (1.0 - v))
            dz[r, j] = d
            acc += d
            for k in range(f):
                dw[k] += d * arena[row, j * f + k]
    db[0] = acc


def filter_forward(att: Tensor, scene: ArenaRows, w: Tensor, b: Tensor, out: Tensor | None
                   ) -> tuple[Tensor, Tensor]:
    """``(y, s)``: ``s = sig(f w + b)`` per object, ``y = att s``."""
    if out is None:
        out = torch.empty_like(att)
    s = torch.empty_like(att)
    _filter_fwd(att.numpy(), scene.arena.numpy(), scene.idx.numpy(), _param(w), _param(b),
                out.numpy(), s.numpy())
    return out, s


def filter_backward(grad: Tensor, att: Tensor, s: Tensor, scene: ArenaRows, w: Tensor
                    ) -> tuple[Tensor, SceneGrad, Tensor, Tensor]:
    """``(d att, d scene, d w, d b)`` of :func:`filter_forward`."""
    d_att, dz = torch.empty_like(grad), np.empty(grad.shape, _np(grad))
    dw, db = torch.empty_like(w), w.new_empty(1)
    _filter_bwd(grad.numpy(), att.numpy(), s.numpy(), scene.arena.numpy(), scene.idx.numpy(),
                d_att.numpy(), dz, dw.numpy(), db.numpy())
    return d_att, SceneGrad(dz, _param(w).reshape(1, -1), _EMPTY[dz.dtype]), dw, db


def _np(t: Tensor) -> Any:
    return np.float64 if t.dtype is torch.float64 else np.float32


_EMPTY = {np.dtype(np.float32): np.zeros((0, 0), np.float32),
          np.dtype(np.float64): np.zeros((0, 0), np.float64)}


# ---------------------------------------------------------------------- relate
@_jit
def _relate_fwd(att, arena, idx, u, c, out, sg, t):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], u.shape[0]
    proj = np.empty(n, dtype=sg.dtype)
    for r in range(att.shape[0]):
        row = idx[r]
        for j in range(n):
            z = 0.0
            for k in range(f):
                z += arena[row, j * f + k] * u[k]
            proj[j] = z
        for j in range(n):
            t[r, j] = 0.0
        for i in range(n):
            ai = att[r, i]
            for j in range(n):
                if i == j:
                    sg[r, i * n + j] = 0.0
                else:
                    v = _sigmoid(proj[j] - proj[i] + c[0])
                    sg[r, i * n + j] = v
                    t[r, j] += ai * v
        for j in range(n):
            out[r, j] = t[r, j] * arena[row, j * f]


@_jit
def _relate_bwd(grad, att, sg, t, arena, idx, d_att, d_proj, mask_grad, du, dc):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], du.shape[0]
    d_t = np.empty(n, dtype=sg.dtype)
    du[:] = 0.0
    acc_c = 0.0
    for r in range(att.shape[0]):
        row = idx[r]
        for j in range(n):
            d_t[j] = grad[r, j] * arena[row, j * f]
            d_proj[r, j] = 0.0
            mask_grad[r, j] = grad[r, j] * t[r, j]
        for i in range(n):
            ai, da = att[r, i], 0.0
            for j in range(n):
                v = sg[r, i * n + j]
                da += v * d_t[j]
                ds = ai * d_t[j] * (v * (1.0 - v))
                acc_c += ds
                d_proj[r, j] += ds
                d_proj[r, i] -= ds
            d_att[r, i] = da
        for j in range(n):
            dp = d_proj[r, j]
            for k in range(f):
                du[k] += dp * arena[row, j * f + k]
    dc[0] = acc_c


def relate_forward(att: Tensor, scene: ArenaRows, u: Tensor, c: Tensor, out: Tensor | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, sg, t)``: ``t_j = sum_{i != j} att_i sig(u . (f_j - f_i) + c)``, ``y = t mask``,
    ``sg`` the ``(B, N, N)`` sigmoids with a zero diagonal (the torch body's saves)."""
    rows_, n = att.shape
    if out is None:
        out = torch.empty_like(att)
    sg, t = att.new_empty(rows_, n, n), torch.empty_like(att)
    _relate_fwd(att.numpy(), scene.arena.numpy(), scene.idx.numpy(), _param(u), _param(c),
                out.numpy(), sg.view(rows_, n * n).numpy(), t.numpy())
    return out, sg, t


def relate_backward(grad: Tensor, att: Tensor, sg: Tensor, t: Tensor, scene: ArenaRows,
                    u: Tensor) -> tuple[Tensor, SceneGrad, Tensor, Tensor]:
    """``(d att, d scene, d u, d c)`` of :func:`relate_forward`."""
    d_att = torch.empty_like(grad)
    d_proj, mask_grad = np.empty(grad.shape, _np(grad)), np.empty(grad.shape, _np(grad))
    du, dc = torch.empty_like(u), u.new_empty(1)
    _relate_bwd(grad.numpy(), att.numpy(), sg.view(len(sg), -1).numpy(), t.numpy(),
                scene.arena.numpy(), scene.idx.numpy(), d_att.numpy(), d_proj, mask_grad,
                du.numpy(), dc.numpy())
    return d_att, SceneGrad(d_proj, _param(u).reshape(1, -1), mask_grad), du, dc


# ---------------------------------------------------------------------- query
@_jit
def _weighted(att, arena, idx, r_out):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], r_out.shape[1]
    for r in range(att.shape[0]):
        row = idx[r]
        for k in range(f):
            r_out[r, k] = 0.0
        for j in range(n):
            a = att[r, j]
            for k in range(f):
                r_out[r, k] += a * arena[row, j * f + k]


@_jit
def _dot_rows(d_r, arena, idx, d_att):  # type: ignore[no-untyped-def]
    n, f = d_att.shape[1], d_r.shape[1]
    for r in range(d_att.shape[0]):
        row = idx[r]
        for j in range(n):
            z = 0.0
            for k in range(f):
                z += d_r[r, k] * arena[row, j * f + k]
            d_att[r, j] = z


def query_rows(att: Tensor, scene: ArenaRows) -> Tensor:
    """``r = sum_j att_j f_j`` (``(B, F)``)."""
    width = scene.arena.shape[1] // att.shape[1]
    r = att.new_empty(att.shape[0], width)
    _weighted(att.numpy(), scene.arena.numpy(), scene.idx.numpy(), r.numpy())
    return r


def query_backward(d_r: Tensor, att: Tensor, scene: ArenaRows) -> tuple[Tensor, SceneGrad]:
    """``(d att, d scene)`` of :func:`query_rows` given ``d r``."""
    d_att = torch.empty_like(att)
    d_r_np = np.ascontiguousarray(d_r.numpy())
    _dot_rows(d_r_np, scene.arena.numpy(), scene.idx.numpy(), d_att.numpy())
    a = np.ascontiguousarray(att.numpy())
    return d_att, SceneGrad(a, d_r_np, _EMPTY[a.dtype])
