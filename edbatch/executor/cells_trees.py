"""Cell kernels of the SST tree workloads: Tree-LSTM, Tree-GRU and MV-RNN.

Each kernel follows the equations in its workload's module docstring
(:mod:`edbatch.workloads.tree_lstm`, :mod:`~edbatch.workloads.tree_gru`,
:mod:`~edbatch.workloads.mvrnn`) and reads its parameters by position in ``op.params``.
The ``*.loss`` kinds use :func:`~edbatch.executor.cells.state_loss`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor._weights import linear_t
from edbatch.executor.cells import (
    SIGMOID_GRAD,
    TANH_GRAD,
    TANH_GRAD_INTO,
    split_state,
    state_loss,
)
from edbatch.executor.kernels import (
    KERNELS,
    ParamGrads,
    affine_rows_of,
    fast_tanh,
    op_params,
    untracked,
    with_backward,
    writes_out,
)
from edbatch.graph import OpType

__all__ = ["mvrnn_internal", "mvrnn_leaf", "tree_gru_internal", "tree_gru_leaf",
           "tree_lstm_internal", "tree_lstm_leaf"]

for _kind in ("tree_lstm.loss", "tree_gru.loss", "mvrnn.loss"):
    KERNELS.register(_kind)(state_loss)


# ---------------------------------------------------------------------- Tree-LSTM
def _gates_backward(grad: Tensor, io: Tensor, u: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """Shared head of both Tree-LSTM backwards: ``(d[i; o; u] pre-activation, d c)`` from
    ``d[h; c]``, with ``h = o*tanh(c)``, ``c = i*u + ...``; the gate gradients are written
    into one ``[B, 3H]`` buffer, so no ``cat`` is needed."""
    batch, hidden = u.shape
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


def _tree_lstm_leaf_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                             params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                             ) -> list[Tensor | None]:
    x, io, u, t = saved
    d_g, _ = _gates_backward(grad, io, u, t)
    acc.linear(op.params[1:], d_g, x)
    acc.rows(op.params[0], attrs, d_g @ params[op.params[1]])
    return []


@KERNELS.register("tree_lstm.leaf")
@with_backward(_tree_lstm_leaf_backward)
@writes_out
def tree_lstm_leaf(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                   attrs: Tensor, out: Tensor | None = None,
                   save: list[Tensor] | None = None) -> Tensor:
    """``x = E[w]``; ``[i; o; u] = W_iou x + b``; ``c = i*u``; ``h = o*tanh(c)``; ``[h; c]``."""
    emb, weight, bias = op_params(op, params, 3)
    x = F.embedding(attrs, emb)
    g = linear_t(x, weight, bias)
    hidden = g.shape[1] // 3
    if untracked(x, weight, bias):  # the same arithmetic in place, into ``out``
        io = g[:, :2 * hidden].sigmoid_()
        u = fast_tanh(g[:, 2 * hidden:])
        if out is None:
            out = g.new_empty(g.shape[0], 2 * hidden)
        c = torch.mul(io[:, :hidden], u, out=out[:, hidden:])
        t = fast_tanh(c)
        torch.mul(io[:, hidden:], t, out=out[:, :hidden])
        if save is not None:
            save += [x, io, u, t]
        return out
    io = torch.sigmoid(g[:, :2 * hidden])
    u = fast_tanh(g[:, 2 * hidden:])
    c = io[:, :hidden] * u
    t = fast_tanh(c)
    if save is not None:
        save += [x, io, u, t]
    return torch.cat([io[:, hidden:] * t, c], dim=1, out=out)


def _tree_lstm_internal_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                                 params: Mapping[str, Tensor], attrs: Tensor,
                                 acc: ParamGrads) -> list[Tensor | None]:
    x, io, u, f1, f2, c1, c2, t = saved
    batch, hidden = u.shape
    d_iou, dc = _gates_backward(grad, io, u, t)
    u_iou, b_iou, u_f1, u_f2, b_f = op.params
    acc.linear((u_iou, b_iou), d_iou, x)
    dx = d_iou @ params[u_iou]
    operands: list[Tensor | None] = []
    for k, (f, c, weight) in enumerate(((f1, c1, u_f1), (f2, c2, u_f2))):
        d_f = dc * c
        SIGMOID_GRAD(d_f, f, grad_input=d_f)
        acc.linear((weight, b_f), d_f, x[:, k * hidden:(k + 1) * hidden])  # b_f: summed
        d_state = torch.empty(batch, 2 * hidden, dtype=u.dtype, device=u.device)
        torch.addmm(dx[:, k * hidden:(k + 1) * hidden], d_f, params[weight],
                    out=d_state[:, :hidden])
        torch.mul(dc, f, out=d_state[:, hidden:])
        operands.append(d_state)
    return operands


@KERNELS.register("tree_lstm.internal")
@with_backward(_tree_lstm_internal_backward)
@writes_out
def tree_lstm_internal(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                       attrs: Tensor, out: Tensor | None = None,
                       save: list[Tensor] | None = None) -> Tensor:
    """Binary Tree-LSTM node: ``[i; o; u] = U_iou [h1; h2] + b`` (one matmul for the three
    gates), ``f_k = sigmoid(U_fk h_k + b_f)``; ``c = i*u + f1*c1 + f2*c2``; ``h = o*tanh(c)``.

    The forget gates are their own matmuls rather than a block diagonal next to ``U_iou``:
    the zero blocks would cost a fifth of the cell's multiply-adds, forward and backward.
    """
    u_iou, b_iou, u_f1, u_f2, b_f = op_params(op, params, 5)
    (h1, c1), (h2, c2) = split_state(inputs[0]), split_state(inputs[1])
    hidden = h1.shape[1]
    x = torch.cat([h1, h2], dim=1)
    if untracked(x, c1, c2, u_iou, b_iou, u_f1, u_f2, b_f):
        return _tree_lstm_internal_inplace(x, (h1, c1, h2, c2),
                                           (u_iou, b_iou, u_f1, u_f2, b_f), out, save)
    g = linear_t(x, u_iou, b_iou)
    io = torch.sigmoid(g[:, :2 * hidden])
    u = fast_tanh(g[:, 2 * hidden:])
    f1, f2 = torch.sigmoid(linear_t(h1, u_f1, b_f)), torch.sigmoid(linear_t(h2, u_f2, b_f))
    c = torch.addcmul(torch.addcmul(io[:, :hidden] * u, f1, c1), f2, c2)
    t = fast_tanh(c)
    if save is not None:
        save += [x, io, u, f1, f2, c1, c2, t]
    return torch.cat([io[:, hidden:] * t, c], dim=1, out=out)


def _tree_lstm_internal_inplace(x: Tensor, states: Sequence[Tensor], weights: Sequence[Tensor],
                                out: Tensor | None, save: list[Tensor] | None) -> Tensor:
    """:func:`tree_lstm_internal` without autograd: activations in place, ``c`` and ``h``
    written straight into ``out``. The same arithmetic on the same memory layouts, so the
    same floats (both paths add ``f_k c_k`` with ``addcmul``; an activation over a wider
    or narrower block would take its vectorised and scalar paths on other elements)."""
    u_iou, b_iou, u_f1, u_f2, b_f = weights
    h1, c1, h2, c2 = states
    hidden = c1.shape[1]
    g = linear_t(x, u_iou, b_iou)
    io = g[:, :2 * hidden].sigmoid_()
    u = fast_tanh(g[:, 2 * hidden:])
    f1 = linear_t(h1, u_f1, b_f).sigmoid_()
    f2 = linear_t(h2, u_f2, b_f).sigmoid_()
    if out is None:
        out = g.new_empty(g.shape[0], 2 * hidden)
    c = torch.mul(io[:, :hidden], u, out=out[:, hidden:])
    c.addcmul_(f1, c1).addcmul_(f2, c2)
    t = fast_tanh(c)
    torch.mul(io[:, hidden:], t, out=out[:, :hidden])
    if save is not None:
        save += [x, io, u, f1, f2, c1, c2, t]
    return out


# ---------------------------------------------------------------------- Tree-GRU
@KERNELS.register("tree_gru.leaf")
def tree_gru_leaf(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                  attrs: Tensor) -> Tensor:
    """``x = E[w]``; ``[a_z; a_c] = W_zc x + b``; ``h = (1 - sigmoid(a_z)) * tanh(a_c)``."""
    emb, weight, bias = op_params(op, params, 3)
    zc = F.linear(F.embedding(attrs, emb), weight, bias)
    hidden = zc.shape[1] // 2
    return (1.0 - torch.sigmoid(zc[:, :hidden])) * fast_tanh(zc[:, hidden:])


@KERNELS.register("tree_gru.internal")
def tree_gru_internal(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                      attrs: Tensor) -> Tensor:
    """Binary Tree-GRU node: one reset gate per child, one update gate.

    ``[r1; r2; z] = sigmoid(U_rz [h1; h2] + b)``; ``c~ = tanh(U_c [r1*h1; r2*h2] + b_c)``;
    ``h = z * ((h1 + h2) * 0.5) + (1 - z) * c~``.
    """
    u_rz, b_rz, u_c, b_c = op_params(op, params, 4)
    h1, h2 = inputs[0], inputs[1]
    hidden = h1.shape[1]
    gates = torch.sigmoid(F.linear(torch.cat([h1, h2], dim=1), u_rz, b_rz))
    r1, r2 = gates[:, :hidden], gates[:, hidden:2 * hidden]
    z = gates[:, 2 * hidden:]
    cand = fast_tanh(F.linear(torch.cat([r1 * h1, r2 * h2], dim=1), u_c, b_c))
    return z * ((h1 + h2) * 0.5) + (1.0 - z) * cand


# ---------------------------------------------------------------------- MV-RNN
@KERNELS.register("mvrnn.leaf")
def mvrnn_leaf(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
    """``[E_v[w]; E_M[w]]``: the word's vector and its row-major matrix."""
    e_v, e_m = op_params(op, params, 2)
    return torch.cat([F.embedding(attrs, e_v), F.embedding(attrs, e_m)], dim=1)


@KERNELS.register("mvrnn.internal")
def mvrnn_internal(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                   attrs: Tensor) -> Tensor:
    """``v = tanh(W [M_r v_l; M_l v_r] + b)``; ``M = W_M [M_l; M_r] + b_M`` (per column).

    Both matrix-vector products run as one ``bmm`` over the stacked batch.
    """
    weight, bias, w_m, b_m = op_params(op, params, 4)
    left, right = inputs[0], inputs[1]
    batch, hidden = left.shape[0], weight.shape[0]
    mats = torch.cat([right[:, hidden:], left[:, hidden:]], dim=0)  # M_r then M_l
    vecs = torch.cat([left[:, :hidden], right[:, :hidden]], dim=0)  # v_l then v_r
    prods = torch.bmm(mats.reshape(2 * batch, hidden, hidden), vecs.unsqueeze(2)).squeeze(2)
    v = fast_tanh(F.linear(torch.cat([prods[:batch], prods[batch:]], dim=1), weight, bias))
    m = affine_rows_of(torch.cat([left[:, hidden:], right[:, hidden:]], dim=1), w_m, b_m)
    return torch.cat([v, m], dim=1)
