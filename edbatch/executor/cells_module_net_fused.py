"""Fused bodies of the module network's pairwise modules: ``relate`` as one compiled kernel
per batch, forward and backward.

A ``relate`` batch is about fifteen torch calls forward and twenty-five backward, each of a
few microseconds on ``B x 10 x 10`` elements: at ``B = 8`` the calls, not the arithmetic, are
the cost (its backward about 90 us). Here each is one numba ``@njit`` loop over numpy views of
the torch tensors (zero copy, as :mod:`edbatch.executor._fused`), with the weight gradients
summed inside the loop (an ``(F,)`` vector and a scalar per batch, for ``RoleGrads.add``).
``filter`` stays torch: five calls forward and seven backward, about what the ``numpy``
views and output allocations of a compiled body cost.

Same equations and saves as the torch bodies in :mod:`edbatch.executor.cells_module_net`
(which stay the reference and serve CUDA, autograd recording and other dtypes): the two paths
are interchangeable per batch. The sigmoid is :mod:`edbatch.executor._fused`'s (``float64``:
``1 / (1 + exp(-x))``, rounding-level from torch; ``float32``: its rational ``tanh``, a few
1e-7). Enabled with the other fused kernels (:func:`edbatch.executor._fused.use`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._fused import _jit, _sigmoid

__all__ = ["relate_backward", "relate_forward", "usable"]


_DTYPES = (torch.float32, torch.float64)
#: ``(data_ptr, dtype, numel)`` of a parameter -> a numpy view of it (the array keeps its
#: tensor alive, so the address cannot be reused while the entry exists); the executor hands
#: kernels fresh detached tensors every run, over the same storage.
_VIEWS: dict[tuple[int, torch.dtype, int], np.ndarray] = {}
_VIEWS_MAX = 1024


def usable(a: Tensor, b: Tensor) -> bool:
    """Whether the fused bodies serve a batch whose operands are ``a`` and ``b``: fused
    kernels on (:func:`edbatch.executor._fused.use`), no autograd recording (the in-place
    inference run and the hand-backward training run), CPU, float32/64."""
    return _fused.enabled() and not torch.is_grad_enabled() and a.is_cpu and \
        a.dtype in _DTYPES and not (a.requires_grad or b.requires_grad)


def _param(t: Tensor) -> np.ndarray:
    """A numpy view of parameter ``t`` (cached: ``Tensor.numpy`` costs about a torch call)."""
    key = (t.data_ptr(), t.dtype, t.numel())
    view = _VIEWS.get(key)
    if view is None:
        if len(_VIEWS) >= _VIEWS_MAX:
            _VIEWS.clear()
        view = _VIEWS[key] = t.detach().numpy().reshape(-1)
    return view


# ---------------------------------------------------------------------- relate
@_jit
def _relate_fwd(att, scene, u, c, out, sg, t):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], u.shape[0]
    proj = np.empty(n, dtype=sg.dtype)
    for r in range(att.shape[0]):
        for j in range(n):
            z = 0.0
            for k in range(f):
                z += scene[r, j * f + k] * u[k]
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
            out[r, j] = t[r, j] * scene[r, j * f]


@_jit
def _relate_bwd(grad, att, sg, t, scene, u, d_att, d_scene, du, dc):  # type: ignore[no-untyped-def]
    n, f = att.shape[1], u.shape[0]
    d_t = np.empty(n, dtype=sg.dtype)
    d_proj = np.empty(n, dtype=sg.dtype)
    du[:] = 0.0
    acc_c = 0.0
    for r in range(att.shape[0]):
        for j in range(n):
            d_t[j] = grad[r, j] * scene[r, j * f]
            d_proj[j] = 0.0
        for i in range(n):
            ai, da = att[r, i], 0.0
            for j in range(n):
                v = sg[r, i * n + j]
                da += v * d_t[j]
                ds = ai * d_t[j] * (v * (1.0 - v))
                acc_c += ds
                d_proj[j] += ds
                d_proj[i] -= ds
            d_att[r, i] = da
        for j in range(n):
            dp = d_proj[j]
            for k in range(f):
                du[k] += dp * scene[r, j * f + k]
                d_scene[r, j * f + k] = dp * u[k]
            d_scene[r, j * f] += grad[r, j] * t[r, j]
    dc[0] = acc_c


def relate_forward(att: Tensor, scene: Tensor, u: Tensor, c: Tensor, out: Tensor | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, sg, t)``: ``t_j = sum_{i != j} att_i sig(u . (f_j - f_i) + c)``, ``y = t mask``,
    ``sg`` the ``(B, N, N)`` sigmoids with a zero diagonal (the torch body's saves)."""
    rows, n = att.shape
    if out is None:
        out = torch.empty_like(att)
    sg, t = att.new_empty(rows, n, n), torch.empty_like(att)
    _relate_fwd(att.numpy(), scene.numpy(), _param(u), _param(c), out.numpy(),
                sg.view(rows, n * n).numpy(), t.numpy())
    return out, sg, t


def relate_backward(grad: Tensor, att: Tensor, sg: Tensor, t: Tensor, scene: Tensor,
                    u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(d att, d scene, d u, d c)`` of :func:`relate_forward`."""
    d_att, d_scene = torch.empty_like(grad), torch.empty_like(scene)
    du, dc = torch.empty_like(u), u.new_empty(1)
    _relate_bwd(grad.numpy(), att.numpy(), sg.view(len(sg), -1).numpy(), t.numpy(),
                scene.numpy(), _param(u), d_att.numpy(), d_scene.numpy(), du.numpy(),
                dc.numpy())
    return d_att, d_scene, du, dc
