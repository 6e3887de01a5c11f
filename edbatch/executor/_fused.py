"""Fused cell bodies: each LSTM-family cell's element-wise part as one compiled kernel per batch.

An LSTM cell's element-wise part (gate sigmoids, ``tanh``, ``c' = f c + i u``,
``h' = o tanh(c')``) is about nine torch kernels per batch, its hand backward as many; here
each is one numba ``@njit`` loop over numpy views of the torch tensors (zero copy), row by
row, so the arithmetic of a batch stays in registers and the per-batch dispatch is one call.
Any batch size runs the same machine code (nothing is compiled per size); a kernel is
compiled once per dtype (``cache=True``: on disk, so a second process does not compile).

Numerics: in float32 ``tanh`` is a [13/6] rational approximation (the one Eigen uses for
float32, clamped at +-7.9053, within 2.5e-7 absolute of the exact value: the loops then
vectorise, which ``libm`` calls do not, as numba has no SVML here) and
``sigmoid(x) = 0.5 + 0.5 tanh(x / 2)``; so a fused float32 batch differs from the unfused
torch path (itself 1.8e-7 from ``torch.tanh``, :func:`~edbatch.executor.kernels.fast_tanh`)
by a few 1e-7. In float64 ``tanh`` and ``exp`` are exact (libm), so fused and unfused agree
to rounding (``tests/executor/test_fused.py`` checks 1e-10 on real workload graphs,
gradients included).

Scope: CPU tensors of float32 / float64 whose columns are contiguous (``stride(1) == 1``;
rows may be strided, e.g. the ``c`` half of a state ``[h; c]``), outside autograd (the
in-place inference path and the hand-backward training path). On CUDA, with
``EDBATCH_COMPILED_CELLS=cuda`` (opt-in: slower on an H200), the Tree-LSTM and LSTM cells
(:func:`cell_usable`) take the same bodies compiled by TorchInductor
(:mod:`~edbatch.executor._fused_compiled`; these four entry points dispatch there by
device). Anything else (autograd recording, other dtypes, a failed compile) runs the
unfused torch code, which stays the reference.
The switch: :func:`use` (a context manager; ``TorchExecutor(fused=...)`` wraps its runs in
it) and :data:`DEFAULT` (on: faster in every throughput row's median of three runs, 1.06-
1.13x end to end; docs/throughput.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from numba import njit, types
from numba.extending import overload
from torch import Tensor

from edbatch.executor import _fused_compiled

__all__ = ["DEFAULT", "cell_usable", "enabled", "lstm_backward", "lstm_forward",
           "tree_backward", "tree_forward", "tree_forward_rows", "use", "usable"]

#: Whether the fused kernels run where they apply, unless :func:`use` says otherwise.
DEFAULT = True
_STATE = [DEFAULT]
_DTYPES = (torch.float32, torch.float64)


def enabled() -> bool:
    """Whether fused kernels are on now (:func:`use`)."""
    return _STATE[0]


@contextlib.contextmanager
def use(flag: bool | None) -> Iterator[None]:
    """Turn the fused kernels on or off inside the block (``None``: leave as is)."""
    with _fused_compiled.settings():
        if flag is None:
            yield
            return
        old, _STATE[0] = _STATE[0], bool(flag)
        try:
            yield
        finally:
            _STATE[0] = old


def usable(*tensors: Tensor) -> bool:
    """Whether the fused path serves ``tensors`` (on, CPU, float32/64, unit column stride,
    nothing recording autograd)."""
    if not _STATE[0]:
        return False
    dtype = tensors[0].dtype
    for t in tensors:
        if t.device.type != "cpu" or t.dtype is not dtype or t.dim() != 2 or \
                (t.stride(1) != 1 and t.shape[1] > 1) or t.requires_grad:
            return False
    return dtype in _DTYPES


def cell_usable(*tensors: Tensor) -> bool:
    """Whether a fused body serves the Tree-LSTM and LSTM cells' ``tensors``: the numba
    kernels (:func:`usable`) or, on CUDA, the compiled ones
    (:mod:`~edbatch.executor._fused_compiled`)."""
    return (_STATE[0] and _fused_compiled.usable(*tensors)) or usable(*tensors)


def _compiled(t: Tensor) -> bool:
    """Whether ``t``'s device takes the compiled bodies (CUDA; tests add the CPU)."""
    return t.device.type in _fused_compiled.DEVICES


# ---------------------------------------------------------------------- activations
_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
      5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
      -2.76076847742355e-16)
_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
      1.19825839466702e-06)
_CLAMP = 7.90531110763549805


def _tanh(x):  # type: ignore[no-untyped-def]  # the overload below, in compiled code
    return np.tanh(x)


@overload(_tanh, inline="always")
def _tanh_impl(x):  # type: ignore[no-untyped-def]  # numba: no annotations here
    if x == types.float32:
        p = tuple(np.float32(v) for v in _P)
        q = tuple(np.float32(v) for v in _Q)
        hi, lo = np.float32(_CLAMP), np.float32(-_CLAMP)

        def rational(x):  # type: ignore[no-untyped-def]
            x = min(max(x, lo), hi)
            x2 = x * x
            num = ((((((x2 * p[6] + p[5]) * x2 + p[4]) * x2 + p[3]) * x2 + p[2]) * x2 + p[1])
                   * x2 + p[0]) * x
            den = ((x2 * q[3] + q[2]) * x2 + q[1]) * x2 + q[0]
            return num / den
        return rational
    return lambda x: np.tanh(x)


def _sigmoid(x):  # type: ignore[no-untyped-def]  # the overload below, in compiled code
    return 1.0 / (1.0 + np.exp(-x))


@overload(_sigmoid, inline="always")
def _sigmoid_impl(x):  # type: ignore[no-untyped-def]
    if x == types.float32:
        half = np.float32(0.5)
        return lambda x: half + half * _tanh(half * x)
    return lambda x: 1.0 / (1.0 + np.exp(-x))


_jit = njit(fastmath=True, error_model="numpy", cache=True, nogil=True)
#: As ``_jit``, inlined into the compiled caller (a row helper: no call per row).
_jit_inline = njit(fastmath=True, error_model="numpy", cache=True, nogil=True, inline="always")


# the per-row LSTM helpers are inlined into their callers (numba IR, no call per row:
# ``_lstm_bwd`` 125 -> 63 us, ``_lstm_fwd`` 96 -> 89 us on 200 rows of H=150, fp32); the same
# arithmetic. (Storing c', tanh(c') and h' in three loops instead of one was slower: 113 us.)
@_jit_inline
def _sig_(a):  # type: ignore[no-untyped-def]
    for j in range(a.shape[0]):
        a[j] = _sigmoid(a[j])


@_jit_inline
def _tanh_(a):  # type: ignore[no-untyped-def]
    for j in range(a.shape[0]):
        a[j] = _tanh(a[j])


# ---------------------------------------------------------------------- LSTM
# Operands are 2-D numpy views (``Tensor.numpy()``, zero copy). A block that is a column range
# of a wider contiguous tensor (``c`` of a state ``[h; c]``) is passed as that tensor and its
# first column: a contiguous array compiles to vector loops, a strided one to slower code.
@_jit_inline
def _lstm_row(i, f, o, u, c, h2, c2, t):  # type: ignore[no-untyped-def]
    for j in range(c.shape[0]):
        cj = f[j] * c[j] + i[j] * u[j]
        tj = _tanh(cj)
        c2[j] = cj
        h2[j] = o[j] * tj
        t[j] = tj


@_jit
def _lstm_fwd(g, cs, c0, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(g.shape[0]):
        gr, orow = g[b], out[b]
        _sig_(gr[:3 * h])
        _tanh_(gr[3 * h:4 * h])
        _lstm_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], gr[3 * h:4 * h], cs[b, c0:c0 + h],
                  orow[:h], orow[h:2 * h], t[b])


def lstm_forward(g: Tensor, c: Tensor, out: Tensor, t: Tensor,
                 state: Tensor | None = None) -> None:
    """In place: ``g`` (``[B, 4H]`` pre-activations ``i f o u``) becomes
    ``[sigmoid(i f o); tanh(u)]``; ``out = [h'; c']``, ``t = tanh(c')``. ``c`` is the old
    cell state; pass its state ``[h; c]`` as ``state`` where there is one (faster)."""
    if _compiled(g):
        _fused_compiled.lstm_forward(g, c, out, t)
    elif state is not None:
        _lstm_fwd(g.numpy(), state.numpy(), t.shape[1], out.numpy(), t.numpy())
    else:
        _lstm_fwd(g.numpy(), c.numpy(), 0, out.numpy(), t.numpy())


@_jit_inline
def _lstm_bwd_row(dh, dcn, i, f, o, u, c, t, di, df, do, du, dcin):  # type: ignore[no-untyped-def]
    for j in range(u.shape[0]):
        tj, oj, ij, fj, uj = t[j], o[j], i[j], f[j], u[j]
        dc = dh[j] * oj * (1 - tj * tj) + dcn[j]
        di[j] = dc * uj * ij * (1 - ij)
        df[j] = dc * c[j] * fj * (1 - fj)
        do[j] = dh[j] * tj * oj * (1 - oj)
        du[j] = dc * ij * (1 - uj * uj)
        dcin[j] = dc * fj


@_jit
def _lstm_bwd(grad, g, c, t, dg, dc, d0):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(grad.shape[0]):
        grow, gr, drow = grad[b], g[b], dg[b]
        _lstm_bwd_row(grow[:h], grow[h:2 * h], gr[:h], gr[h:2 * h], gr[2 * h:3 * h],
                      gr[3 * h:4 * h], c[b], t[b], drow[:h], drow[h:2 * h],
                      drow[2 * h:3 * h], drow[3 * h:4 * h], dc[b, d0:d0 + h])


def lstm_backward(grad: Tensor, g: Tensor, c: Tensor, t: Tensor, d_gates: Tensor,
                  d_in: Tensor, d0: int) -> None:
    """``d_gates`` (``[B, 4H]`` pre-activation gradients ``i f o u``) and, in the columns
    ``d0:d0+H`` of ``d_in``, ``dc' f``, from ``grad = d[h'; c']`` and the forward's
    ``g = [sigmoid(i f o); tanh(u)]`` (``[B, 4H]``, as :func:`lstm_forward` leaves it), old
    ``c`` and ``t = tanh(c')``."""
    if _compiled(g):
        _fused_compiled.lstm_backward(grad, g, c, t, d_gates, d_in, d0)
        return
    _lstm_bwd(grad.numpy(), g.numpy(), c.numpy(), t.numpy(), d_gates.numpy(), d_in.numpy(), d0)


# ---------------------------------------------------------------------- Tree-LSTM
# inlined into its callers (numba IR): a call per row cost 1.3x the row's arithmetic
# (``_tree_fwd_rows`` 151 -> 125 us on 200 rows of H=150, fp32); the same arithmetic
@_jit_inline
def _tree_row(i, o, u, f1, c1, f2, c2, kids, h2, cn, t):  # type: ignore[no-untyped-def]
    for j in range(u.shape[0]):
        cj = i[j] * u[j]
        if kids:
            cj = cj + f1[j] * c1[j]
            cj = cj + f2[j] * c2[j]
        tj = _tanh(cj)
        cn[j] = cj
        h2[j] = o[j] * tj
        t[j] = tj


@_jit
def _tree_leaf(g, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(g.shape[0]):
        gr, orow = g[b], out[b]
        _sig_(gr[:2 * h])
        _tanh_(gr[2 * h:3 * h])
        _tree_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], t[b], t[b], t[b], t[b], False,
                  orow[:h], orow[h:2 * h], t[b])


# leaves and internal nodes are two kernels, each with ``kids`` a constant: with a run-time
# flag the leaf loop did not vectorise (0.75 -> 0.34 us a row of H=150, fp32, 1254 rows)
@_jit
def _tree_fwd(g, f1, s1, f2, s2, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(g.shape[0]):
        gr, orow = g[b], out[b]
        _sig_(gr[:2 * h])
        _tanh_(gr[2 * h:3 * h])
        _sig_(f1[b])
        _sig_(f2[b])
        _tree_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], f1[b], s1[b, h:2 * h], f2[b],
                  s2[b, h:2 * h], True, orow[:h], orow[h:2 * h], t[b])


def tree_forward(g: Tensor, kids: tuple[Tensor, Tensor, Tensor, Tensor] | None, out: Tensor,
                 t: Tensor) -> None:
    """Tree-LSTM node in place: ``g`` (``[B, 3H]``: ``i o u``) becomes
    ``[sigmoid(i o); tanh(u)]``; with ``kids = (f1, state1, f2, state2)`` the forget
    pre-activations become ``sigmoid`` in place and ``c = i u + f1 c1 + f2 c2`` (``c_k``:
    the second half of the child state ``[h; c]``), else ``c = i u``;
    ``out = [o tanh(c); c]``, ``t = tanh(c)``."""
    if _compiled(g):
        _fused_compiled.tree_forward(g, kids, out, t)
        return
    gv, ov, tv = g.numpy(), out.numpy(), t.numpy()
    if kids is None:
        _tree_leaf(gv, ov, tv)
    else:
        f1, s1, f2, s2 = kids
        _tree_fwd(gv, f1.numpy(), s1.numpy(), f2.numpy(), s2.numpy(), ov, tv)


@_jit
def _tree_fwd_rows(g, f1, f2, states, left, right, out, t):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(g.shape[0]):
        gr, orow = g[b], out[b]
        _sig_(gr[:2 * h])
        _tanh_(gr[2 * h:3 * h])
        _sig_(f1[b])
        _sig_(f2[b])
        _tree_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], f1[b], states[left[b], h:2 * h],
                  f2[b], states[right[b], h:2 * h], True, orow[:h], orow[h:2 * h], t[b])


def tree_forward_rows(g: np.ndarray, f1: np.ndarray, f2: np.ndarray,  # type: ignore[type-arg]
                      states: np.ndarray, left: np.ndarray, right: np.ndarray,  # type: ignore[type-arg]
                      out: np.ndarray, t: np.ndarray) -> None:  # type: ignore[type-arg]
    """:func:`tree_forward` with children, reading each child's ``c`` in place: rows
    ``left[b]`` and ``right[b]`` (``int64``) of ``states`` (an arena of ``[h; c]`` rows,
    ``[rows, 2H]``) instead of gathered copies; numpy arrays (the same arithmetic, so the
    same floats)."""
    _tree_fwd_rows(g, f1, f2, states, left, right, out, t)


@_jit_inline
def _tree_bwd_row(dh, dcn, i, o, u, t, kids, f1, c1, f2, c2,  # type: ignore[no-untyped-def]
                  di, do, du, df1, df2, dc1, dc2):
    for j in range(u.shape[0]):
        tj, oj, ij, uj = t[j], o[j], i[j], u[j]
        dc = dh[j] * oj * (1 - tj * tj) + dcn[j]
        di[j] = dc * uj * ij * (1 - ij)
        do[j] = dh[j] * tj * oj * (1 - oj)
        du[j] = dc * ij * (1 - uj * uj)
        if kids:
            a, b = f1[j], f2[j]
            df1[j] = dc * c1[j] * a * (1 - a)
            df2[j] = dc * c2[j] * b * (1 - b)
            dc1[j] = dc * a
            dc2[j] = dc * b


# as the forward: leaves and internal nodes apart, ``kids`` a constant of each (the row
# helper inlined: no call per row)
@_jit
def _tree_bwd_leaf(grad, g, t, d):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(grad.shape[0]):
        grow, gr, drow, tb = grad[b], g[b], d[b], t[b]
        _tree_bwd_row(grow[:h], grow[h:2 * h], gr[:h], gr[h:2 * h], gr[2 * h:3 * h], tb,
                      False, tb, tb, tb, tb, drow[:h], drow[h:2 * h], drow[2 * h:3 * h],
                      tb, tb, tb, tb)


@_jit
def _tree_bwd(grad, g, t, d, f1, c1, f2, c2, df, ds):  # type: ignore[no-untyped-def]
    h = t.shape[1]
    for b in range(grad.shape[0]):
        grow, gr, drow = grad[b], g[b], d[b]
        _tree_bwd_row(grow[:h], grow[h:2 * h], gr[:h], gr[h:2 * h], gr[2 * h:3 * h], t[b],
                      True, f1[b], c1[b], f2[b], c2[b], drow[:h], drow[h:2 * h],
                      drow[2 * h:3 * h], df[0, b], df[1, b], ds[0, b, h:2 * h],
                      ds[1, b, h:2 * h])


def tree_backward(grad: Tensor, g: Tensor, t: Tensor, d: Tensor,
                  kids: tuple[Tensor, ...] | None = None) -> None:
    """Tree-LSTM node backward: ``d`` (``[B, 3H]``) = pre-activation gradients of
    ``i o u`` from ``grad = d[h; c]`` and the forward's ``g = [sigmoid(i o); tanh(u)]``,
    ``t``; with ``kids = (f1, c1, f2, c2, d_f, d_states)`` also the forget pre-activation
    gradients ``d_f[k]`` (``[2, B, H]``) and the child states' ``c`` gradients
    ``dc f_k`` into ``d_states[k, :, H:]`` (``[2, B, 2H]``)."""
    if _compiled(g):
        _fused_compiled.tree_backward(grad, g, t, d, kids)
        return
    gv, tv, dv = grad.numpy(), t.numpy(), d.numpy()
    if kids is None:
        _tree_bwd_leaf(gv, g.numpy(), tv, dv)
    else:
        f1, c1, f2, c2, d_f, d_states = (x.numpy() for x in kids)
        _tree_bwd(gv, g.numpy(), tv, dv, f1, c1, f2, c2, d_f, d_states)
