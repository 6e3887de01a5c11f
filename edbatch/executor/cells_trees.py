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

from edbatch.executor.cells import split_state, state_loss
from edbatch.executor.kernels import (
    KERNELS,
    ParamGrads,
    affine_rows_of,
    fast_tanh,
    op_params,
    with_backward,
    writes_out,
)
from edbatch.graph import OpType

__all__ = ["mvrnn_internal", "mvrnn_leaf", "tree_gru_internal", "tree_gru_leaf",
           "tree_lstm_internal", "tree_lstm_leaf"]

for _kind in ("tree_lstm.loss", "tree_gru.loss", "mvrnn.loss"):
    KERNELS.register(_kind)(state_loss)


# ---------------------------------------------------------------------- Tree-LSTM
def _gates_backward(grad: Tensor, io: Tensor, u: Tensor, t: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Shared head of both Tree-LSTM backwards: ``(d[i; o] pre-activation, d u
    pre-activation, d c)`` from ``d[h; c]``, with ``h = o*tanh(c)``, ``c = i*u + ...``."""
    hidden = u.shape[1]
    i, o = io[:, :hidden], io[:, hidden:]
    dh = grad[:, :hidden]
    dc = torch.addcmul(grad[:, hidden:], dh * o, 1.0 - t * t)
    d_io = torch.cat([dc * u, dh * t], dim=1) * io * (1.0 - io)
    return d_io, dc * i * (1.0 - u * u), dc


def _tree_lstm_leaf_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                             params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                             ) -> list[Tensor | None]:
    x, io, u, t = saved
    d_io, d_u, _ = _gates_backward(grad, io, u, t)
    d_g = torch.cat([d_io, d_u], dim=1)
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
    g = F.linear(x, weight, bias)
    hidden = g.shape[1] // 3
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
    hidden = u.shape[1]
    d_io, d_u, dc = _gates_backward(grad, io, u, t)
    d_iou = torch.cat([d_io, d_u], dim=1)
    d_f1, d_f2 = dc * c1 * f1 * (1.0 - f1), dc * c2 * f2 * (1.0 - f2)
    u_iou, b_iou, u_f1, u_f2, b_f = op.params
    h1, h2 = x[:, :hidden], x[:, hidden:]
    acc.linear((u_iou, b_iou), d_iou, x)
    acc.linear((u_f1, b_f), d_f1, h1)  # b_f's two gradients are summed
    acc.linear((u_f2, b_f), d_f2, h2)
    dx = d_iou @ params[u_iou]
    return [torch.cat([torch.addmm(dx[:, :hidden], d_f1, params[u_f1]), dc * f1], dim=1),
            torch.cat([torch.addmm(dx[:, hidden:], d_f2, params[u_f2]), dc * f2], dim=1)]


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
    g = F.linear(x, u_iou, b_iou)
    io = torch.sigmoid(g[:, :2 * hidden])
    u = fast_tanh(g[:, 2 * hidden:])
    f1, f2 = torch.sigmoid(F.linear(h1, u_f1, b_f)), torch.sigmoid(F.linear(h2, u_f2, b_f))
    c = io[:, :hidden] * u + f1 * c1 + f2 * c2
    t = fast_tanh(c)
    if save is not None:
        save += [x, io, u, f1, f2, c1, c2, t]
    return torch.cat([io[:, hidden:] * t, c], dim=1, out=out)


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
