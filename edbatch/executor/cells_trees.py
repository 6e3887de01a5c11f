"""Cell kernels of the SST tree workloads: Tree-LSTM, Tree-GRU and MV-RNN.

Each :class:`~edbatch.executor.cell_kind.CellKind` follows the equations in its workload's
module docstring (:mod:`edbatch.workloads.tree_lstm`, :mod:`~edbatch.workloads.tree_gru`,
:mod:`~edbatch.workloads.mvrnn`) and reads its parameters by their declared names (an op
type lists them in declaration order). The ``*.loss`` kinds are
:class:`~edbatch.executor.cells.StateLoss`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._attr_checks import embedding
from edbatch.executor._weights import linear_t
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD, TANH_GRAD_INTO, split_state
from edbatch.executor.kernels import affine_rows_of, fast_tanh, untracked
from edbatch.graph import OpType

__all__ = ["MVRNNInternal", "MVRNNLeaf", "TreeGRUInternal", "TreeGRULeaf", "TreeLSTMInternal",
           "TreeLSTMLeaf", "mvrnn_internal", "mvrnn_leaf", "tree_gru_internal",
           "tree_gru_leaf", "tree_lstm_internal", "tree_lstm_leaf"]


def _state_dims(op: OpType) -> dict[str, int]:
    """``H`` of an LSTM cell whose output is ``[h; c]``."""
    return {"H": math.prod(op.out_shape) // 2}


def _hidden_dims(op: OpType) -> dict[str, int]:
    """``H`` of a cell whose output is ``h``."""
    return {"H": math.prod(op.out_shape)}


# ---------------------------------------------------------------------- Tree-LSTM
def _gates_backward(grad: Tensor, io: Tensor, u: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """Shared head of both Tree-LSTM backwards: ``(d[i; o; u] pre-activation, d c)`` from
    ``d[h; c]``, with ``h = o*tanh(c)``, ``c = i*u + ...``; the gate gradients are written
    into one ``[B, 3H]`` buffer, so no ``cat`` is needed."""
    batch, hidden = u.shape
    if io.shape[1] != 2 * hidden:  # a fused forward's: all of g
        io = io[:, :2 * hidden]
    i, o = io.split_with_sizes((hidden, hidden), 1)
    dh, d_c = grad.split_with_sizes((hidden, hidden), 1)
    dc = TANH_GRAD(dh * o, t).add_(d_c)
    d = torch.empty(batch, 3 * hidden, dtype=u.dtype, device=u.device)
    d_io, d_u = d.split_with_sizes((2 * hidden, hidden), 1)
    d_i, d_o = d_io.split_with_sizes((hidden, hidden), 1)
    torch.mul(dc, u, out=d_i)
    torch.mul(dh, t, out=d_o)
    SIGMOID_GRAD(d_io, io, grad_input=d_io)
    TANH_GRAD_INTO(dc * i, u, grad_input=d_u)
    return d, dc


class TreeLSTMLeaf(CellKind):
    """``x = E[w]``; ``[i; o; u] = W x + b``; ``c = i*u``; ``h = o*tanh(c)``; ``[h; c]``."""

    kind = "tree_lstm.leaf"
    inputs = ()
    params = (Param("E", "V, D", init="embedding"), Param("W", "3H, D"), Param("b", "3H"))
    saves = ("x", "io", "u", "t")
    dims = staticmethod(_state_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        x = embedding(attrs, p.E)
        g = linear_t(x, p.W, p.b)
        hidden = g.shape[1] // 3
        if untracked(x, p.W, p.b):  # the same arithmetic in place, into ``out``
            if out is None:
                out = g.new_empty(g.shape[0], 2 * hidden)
            if _fused.cell_usable(g, out):  # one compiled kernel for the element-wise part
                t = g.new_empty(g.shape[0], hidden)
                _fused.tree_forward(g, None, out, t)
                if save is not None:  # io: all of g (the fused backward reads it)
                    save.update(x=x, io=g, u=g[:, 2 * hidden:], t=t)
                return out
            io = g[:, :2 * hidden].sigmoid_()
            u = fast_tanh(g[:, 2 * hidden:])
            if out is None:
                out = g.new_empty(g.shape[0], 2 * hidden)
            c = torch.mul(io[:, :hidden], u, out=out[:, hidden:])
            t = fast_tanh(c)
            torch.mul(io[:, hidden:], t, out=out[:, :hidden])
            if save is not None:
                save.update(x=x, io=io, u=u, t=t)
            return out
        io = torch.sigmoid(g[:, :2 * hidden])
        u = fast_tanh(g[:, 2 * hidden:])
        c = io[:, :hidden] * u
        t = fast_tanh(c)
        if save is not None:
            save.update(x=x, io=io, u=u, t=t)
        return torch.cat([io[:, hidden:] * t, c], dim=1, out=out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        if saved.io.shape[1] == 3 * saved.u.shape[1] and \
                _fused.cell_usable(grad, saved.io, saved.t):
            d_g = grad.new_empty(grad.shape[0], 3 * saved.u.shape[1])
            _fused.tree_backward(grad, saved.io, saved.t, d_g)
        else:
            d_g, _ = _gates_backward(grad, saved.io, saved.u, saved.t)
        grads.linear(("W", "b"), d_g, saved.x)
        grads.rows("E", attrs, d_g @ p.W)
        return []


class TreeLSTMInternal(CellKind):
    """Binary Tree-LSTM node: ``[i; o; u] = U_iou [h1; h2] + b_iou`` (one matmul for the three
    gates), ``f_k = sigmoid(U_fk h_k + b_f)``; ``c = i*u + f1*c1 + f2*c2``; ``h = o*tanh(c)``.

    The forget gates are their own matmuls rather than a block diagonal next to ``U_iou``:
    the zero blocks would cost a fifth of the cell's multiply-adds, forward and backward.
    """

    kind = "tree_lstm.internal"
    inputs = ("left", "right")
    params = (Param("U_iou", "3H, 2H"), Param("b_iou", "3H"), Param("U_f1", "H, H"),
              Param("U_f2", "H, H"), Param("b_f", "H"))
    saves = ("x", "io", "u", "f1", "f2", "c1", "c2", "t")
    dims = staticmethod(_state_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        (h1, c1), (h2, c2) = split_state(inputs[0]), split_state(inputs[1])
        hidden = h1.shape[1]
        x = torch.cat([h1, h2], dim=1)
        if untracked(x, c1, c2, *p):
            return _tree_lstm_internal_inplace(x, (h1, c1, h2, c2, *inputs[:2]), p, out, save)
        g = linear_t(x, p.U_iou, p.b_iou)
        io = torch.sigmoid(g[:, :2 * hidden])
        u = fast_tanh(g[:, 2 * hidden:])
        f1 = torch.sigmoid(linear_t(h1, p.U_f1, p.b_f))
        f2 = torch.sigmoid(linear_t(h2, p.U_f2, p.b_f))
        c = torch.addcmul(torch.addcmul(io[:, :hidden] * u, f1, c1), f2, c2)
        t = fast_tanh(c)
        if save is not None:
            save.update(x=x, io=io, u=u, f1=f1, f2=f2, c1=c1, c2=c2, t=t)
        return torch.cat([io[:, hidden:] * t, c], dim=1, out=out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        x, u = saved.x, saved.u
        batch, hidden = u.shape
        if saved.io.shape[1] == 3 * hidden and \
                _fused.cell_usable(grad, saved.io, saved.t, saved.f1, saved.c1, saved.f2, saved.c2):
            return _tree_internal_backward_fused(saved, grad, p, grads)
        d_iou, dc = _gates_backward(grad, saved.io, u, saved.t)
        grads.linear(("U_iou", "b_iou"), d_iou, x)
        dx = d_iou @ p.U_iou
        operands: list[Tensor | None] = []
        for k, (f, c, weight) in enumerate(((saved.f1, saved.c1, "U_f1"),
                                            (saved.f2, saved.c2, "U_f2"))):
            d_f = dc * c
            SIGMOID_GRAD(d_f, f, grad_input=d_f)
            grads.linear((weight, "b_f"), d_f, x[:, k * hidden:(k + 1) * hidden])  # b_f: summed
            d_state = torch.empty(batch, 2 * hidden, dtype=u.dtype, device=u.device)
            torch.addmm(dx[:, k * hidden:(k + 1) * hidden], d_f, getattr(p, weight),
                        out=d_state[:, :hidden])
            torch.mul(dc, f, out=d_state[:, hidden:])
            operands.append(d_state)
        return operands


def _tree_lstm_internal_inplace(x: Tensor, states: Sequence[Tensor], p: Any,
                                out: Tensor | None, save: dict[str, Tensor] | None) -> Tensor:
    """:class:`TreeLSTMInternal` without autograd: activations in place, ``c`` and ``h``
    written straight into ``out``. The same arithmetic on the same memory layouts, so the
    same floats (both paths add ``f_k c_k`` with ``addcmul``; an activation over a wider
    or narrower block would take its vectorised and scalar paths on other elements)."""
    h1, c1, h2, c2 = states[:4]
    hidden = c1.shape[1]
    g = linear_t(x, p.U_iou, p.b_iou)
    if out is None:
        out = g.new_empty(g.shape[0], 2 * hidden)
    s1, s2 = states[4], states[5]
    if _fused.cell_usable(g, s1, s2, out):  # one compiled kernel for the element-wise part
        f1, f2 = linear_t(h1, p.U_f1, p.b_f), linear_t(h2, p.U_f2, p.b_f)
        t = g.new_empty(g.shape[0], hidden)
        _fused.tree_forward(g, (f1, s1, f2, s2), out, t)
        if save is not None:  # io: all of g (the fused backward reads it)
            save.update(x=x, io=g, u=g[:, 2 * hidden:], f1=f1, f2=f2, c1=c1, c2=c2, t=t)
        return out
    io = g[:, :2 * hidden].sigmoid_()
    u = fast_tanh(g[:, 2 * hidden:])
    f1 = linear_t(h1, p.U_f1, p.b_f).sigmoid_()
    f2 = linear_t(h2, p.U_f2, p.b_f).sigmoid_()
    c = torch.mul(io[:, :hidden], u, out=out[:, hidden:])
    c.addcmul_(f1, c1).addcmul_(f2, c2)
    t = fast_tanh(c)
    torch.mul(io[:, hidden:], t, out=out[:, :hidden])
    if save is not None:
        save.update(x=x, io=io, u=u, f1=f1, f2=f2, c1=c1, c2=c2, t=t)
    return out


def _tree_internal_backward_fused(saved: Any, grad: Tensor, p: Any, grads: RoleGrads
                                  ) -> list[Tensor | None]:
    """:meth:`TreeLSTMInternal.backward` with its element-wise part as one compiled kernel
    (:func:`~edbatch.executor._fused.tree_backward`); the same matmuls."""
    x, u = saved.x, saved.u
    batch, hidden = u.shape
    d_iou = grad.new_empty(batch, 3 * hidden)
    d_f = grad.new_empty(2, batch, hidden)
    d_states = grad.new_empty(2, batch, 2 * hidden)
    _fused.tree_backward(grad, saved.io, saved.t, d_iou,
                         (saved.f1, saved.c1, saved.f2, saved.c2, d_f, d_states))
    grads.linear(("U_iou", "b_iou"), d_iou, x)
    dx = d_iou @ p.U_iou
    for k, weight in enumerate(("U_f1", "U_f2")):
        grads.linear((weight, "b_f"), d_f[k], x[:, k * hidden:(k + 1) * hidden])
        torch.addmm(dx[:, k * hidden:(k + 1) * hidden], d_f[k], getattr(p, weight),
                    out=d_states[k, :, :hidden])
    return [d_states[0], d_states[1]]


# ---------------------------------------------------------------------- Tree-GRU
class TreeGRULeaf(CellKind):
    """``x = E[w]``; ``[a_z; a_c] = W x + b``; ``h = (1 - sigmoid(a_z)) * tanh(a_c)``."""

    kind = "tree_gru.leaf"
    inputs = ()
    params = (Param("E", "V, D", init="embedding"), Param("W", "2H, D"), Param("b", "2H"))
    dims = staticmethod(_hidden_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        zc = F.linear(embedding(attrs, p.E), p.W, p.b)
        hidden = zc.shape[1] // 2
        return (1.0 - torch.sigmoid(zc[:, :hidden])) * fast_tanh(zc[:, hidden:])


class TreeGRUInternal(CellKind):
    """Binary Tree-GRU node: one reset gate per child, one update gate.

    ``[r1; r2; z] = sigmoid(U_rz [h1; h2] + b_rz)``; ``c~ = tanh(U_c [r1*h1; r2*h2] + b_c)``;
    ``h = z * ((h1 + h2) * 0.5) + (1 - z) * c~``.
    """

    kind = "tree_gru.internal"
    inputs = ("left", "right")
    params = (Param("U_rz", "3H, 2H"), Param("b_rz", "3H"), Param("U_c", "H, 2H"),
              Param("b_c", "H"))
    dims = staticmethod(_hidden_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        h1, h2 = inputs[0], inputs[1]
        hidden = h1.shape[1]
        gates = torch.sigmoid(F.linear(torch.cat([h1, h2], dim=1), p.U_rz, p.b_rz))
        r1, r2 = gates[:, :hidden], gates[:, hidden:2 * hidden]
        z = gates[:, 2 * hidden:]
        cand = fast_tanh(F.linear(torch.cat([r1 * h1, r2 * h2], dim=1), p.U_c, p.b_c))
        return z * ((h1 + h2) * 0.5) + (1.0 - z) * cand


# ---------------------------------------------------------------------- MV-RNN
def _mvrnn_dims(op: OpType) -> dict[str, int]:
    """``H`` of MV-RNN's ``[v; vec(M)]`` states (``H + H*H`` wide)."""
    return {"H": (math.isqrt(1 + 4 * math.prod(op.out_shape)) - 1) // 2}


class MVRNNLeaf(CellKind):
    """``[E_v[w]; E_M[w]]``: the word's vector and its row-major matrix."""

    kind = "mvrnn.leaf"
    inputs = ()
    params = (Param("E_v", "V, H", init="embedding"), Param("E_M", "V, H*H", init="embedding"))
    dims = staticmethod(_mvrnn_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return torch.cat([embedding(attrs, p.E_v), embedding(attrs, p.E_M)], dim=1)


class MVRNNInternal(CellKind):
    """``v = tanh(W [M_r v_l; M_l v_r] + b)``; ``M = W_M [M_l; M_r] + b_M`` (per column).

    Both matrix-vector products run as one ``bmm`` over the stacked batch.
    """

    kind = "mvrnn.internal"
    inputs = ("left", "right")
    params = (Param("W", "H, 2H"), Param("b", "H"), Param("W_M", "H, 2H"), Param("b_M", "H"))
    dims = staticmethod(_mvrnn_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        left, right = inputs[0], inputs[1]
        batch, hidden = left.shape[0], p.W.shape[0]
        mats = torch.cat([right[:, hidden:], left[:, hidden:]], dim=0)  # M_r then M_l
        vecs = torch.cat([left[:, :hidden], right[:, :hidden]], dim=0)  # v_l then v_r
        prods = torch.bmm(mats.reshape(2 * batch, hidden, hidden),
                          vecs.unsqueeze(2)).squeeze(2)
        v = fast_tanh(F.linear(torch.cat([prods[:batch], prods[batch:]], dim=1), p.W, p.b))
        m = affine_rows_of(torch.cat([left[:, hidden:], right[:, hidden:]], dim=1),
                           p.W_M, p.b_M)
        return torch.cat([v, m], dim=1)


#: The registered kernels, under the names they had as functions.
tree_lstm_leaf = TreeLSTMLeaf.kernel
tree_lstm_internal = TreeLSTMInternal.kernel
tree_gru_leaf = TreeGRULeaf.kernel
tree_gru_internal = TreeGRUInternal.kernel
mvrnn_leaf = MVRNNLeaf.kernel
mvrnn_internal = MVRNNInternal.kernel
