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
from edbatch.executor.kernels import KERNELS, affine_rows_of, derived, op_params, writes_out
from edbatch.graph import OpType

__all__ = ["mvrnn_internal", "mvrnn_leaf", "tree_gru_internal", "tree_gru_leaf",
           "tree_lstm_internal", "tree_lstm_leaf"]

for _kind in ("tree_lstm.loss", "tree_gru.loss", "mvrnn.loss"):
    KERNELS.register(_kind)(state_loss)


# ---------------------------------------------------------------------- Tree-LSTM
@KERNELS.register("tree_lstm.leaf")
@writes_out
def tree_lstm_leaf(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                   attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """``x = E[w]``; ``[i; o; u] = W_iou x + b``; ``c = i*u``; ``h = o*tanh(c)``; ``[h; c]``."""
    emb, weight, bias = op_params(op, params, 3)
    g = F.linear(F.embedding(attrs, emb), weight, bias)
    hidden = g.shape[1] // 3
    io = torch.sigmoid(g[:, :2 * hidden])
    c = io[:, :hidden] * torch.tanh(g[:, 2 * hidden:])
    return torch.cat([io[:, hidden:] * torch.tanh(c), c], dim=1, out=out)


@KERNELS.register("tree_lstm.internal")
@writes_out
def tree_lstm_internal(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                       attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """Binary Tree-LSTM node with one fused matmul for ``i, o, u, f1, f2``.

    ``[i; o; u] = U_iou [h1; h2] + b``, ``f_k = sigmoid(U_fk h_k + b_f)``;
    ``c = i*u + f1*c1 + f2*c2``; ``h = o*tanh(c)``. The forget weights enter the fused
    matrix as the block diagonal ``diag(U_f1, U_f2)`` next to ``U_iou``.
    """
    u_iou, b_iou, u_f1, u_f2, b_f = op_params(op, params, 5)
    (h1, c1), (h2, c2) = split_state(inputs[0]), split_state(inputs[1])
    hidden = h1.shape[1]
    weight = derived(params, f"{op.name}.fused_weight", lambda: torch.cat([
        u_iou, F.pad(u_f1, (0, u_f2.shape[1])), F.pad(u_f2, (u_f1.shape[1], 0))]))
    bias = derived(params, f"{op.name}.fused_bias", lambda: torch.cat([b_iou, b_f, b_f]))
    g = F.linear(torch.cat([h1, h2], dim=1), weight, bias)
    io = torch.sigmoid(g[:, :2 * hidden])
    u = torch.tanh(g[:, 2 * hidden:3 * hidden])
    f = torch.sigmoid(g[:, 3 * hidden:])
    c = io[:, :hidden] * u + f[:, :hidden] * c1 + f[:, hidden:] * c2
    return torch.cat([io[:, hidden:] * torch.tanh(c), c], dim=1, out=out)


# ---------------------------------------------------------------------- Tree-GRU
@KERNELS.register("tree_gru.leaf")
def tree_gru_leaf(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                  attrs: Tensor) -> Tensor:
    """``x = E[w]``; ``[a_z; a_c] = W_zc x + b``; ``h = (1 - sigmoid(a_z)) * tanh(a_c)``."""
    emb, weight, bias = op_params(op, params, 3)
    zc = F.linear(F.embedding(attrs, emb), weight, bias)
    hidden = zc.shape[1] // 2
    return (1.0 - torch.sigmoid(zc[:, :hidden])) * torch.tanh(zc[:, hidden:])


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
    cand = torch.tanh(F.linear(torch.cat([r1 * h1, r2 * h2], dim=1), u_c, b_c))
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
    v = torch.tanh(F.linear(torch.cat([prods[:batch], prods[batch:]], dim=1), weight, bias))
    m = affine_rows_of(torch.cat([left[:, hidden:], right[:, hidden:]], dim=1), w_m, b_m)
    return torch.cat([v, m], dim=1)
