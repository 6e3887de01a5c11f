"""Cell kernels of the GGNN molecule workload (:mod:`edbatch.workloads.ggnn_molecules`).

Each kernel follows the equations of the workload's module docstring and reads its
parameters by position in ``op.params``. ``ggnn.update`` and ``ggnn.readout`` are batchable
*variadic* op types (``in_shapes is None``): for a batch of ``B`` nodes, ``inputs`` holds the
fixed operand slots, then repeated slot ``k`` with the ``k``-th repeated operand of every
node that has more than ``k`` of them (in the batch's row order), and each node's attr is
its number of repeated operands (the convention of :mod:`edbatch.api._variadic`; a batch of
one node gets its operands one by one, which is the same thing).

Every kernel has a hand-written backward (:func:`~edbatch.executor.kernels.with_backward`),
so cell-granularity programs train with :mod:`edbatch.executor._analytic` (a batch of one
variadic node is read operand by operand and falls back to autograd, as the executor does
for every variadic op); the gradients are checked against autograd through the reference
executor in ``tests/workloads/test_ggnn_molecules.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD
from edbatch.executor.kernels import KERNELS, ParamGrads, fast_tanh, op_params, with_backward
from edbatch.graph import OpType
from edbatch.workloads.ggnn_molecules import FEATURE_RANGES, OFFSETS, TARGET_SCALE

__all__ = ["ggnn_embed", "ggnn_loss", "ggnn_msg", "ggnn_readout", "ggnn_sq_err",
           "ggnn_update", "repeated_rows"]

_SIZES = tuple(hi - lo + 1 for lo, hi in FEATURE_RANGES)


def repeated_rows(slots: Sequence[Tensor], counts: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows [N, d], segment int64[N])``: the repeated operand slots stacked, and the node
    (``0..B-1``) each row belongs to, from the nodes' repeated-operand ``counts``."""
    segment = torch.cat([torch.nonzero(counts > k).reshape(-1) for k in range(len(slots))])
    return torch.cat(list(slots)), segment


def _embed_rows(attrs: Tensor) -> list[Tensor]:
    """The table rows each packed atom reads, one ``int64[B]`` per feature."""
    rows, code = [], attrs
    for offset, size in zip(OFFSETS, _SIZES, strict=True):
        rows.append(offset + torch.remainder(code, size))
        code = torch.div(code, size, rounding_mode="floor")
    return rows


def _embed_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                    params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                    ) -> list[Tensor | None]:
    for rows in _embed_rows(attrs):
        acc.rows(op.params[0], rows, grad)
    return []


@KERNELS.register("ggnn.embed")
@with_backward(_embed_backward)
def ggnn_embed(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``h0 = sum_f E[offset_f + x_f]``, the features unpacked from the attr (mixed radix)."""
    (table,) = op_params(op, params, 1)
    out = None
    for rows in _embed_rows(attrs):
        row = F.embedding(rows, table)
        out = row if out is None else out + row
    assert out is not None
    return out


def _msg_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                  params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                  ) -> list[Tensor | None]:
    (x,) = saved
    acc.linear(op.params, grad, x)
    return [grad @ params[op.params[0]]]


@KERNELS.register("ggnn.msg")
@with_backward(_msg_backward)
def ggnn_msg(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
             attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``m = A_b h + c_b`` (the bond type's weights are the op type's parameters)."""
    weight, bias = op_params(op, params, 2)
    if save is not None:
        save.append(inputs[0])
    return F.linear(inputs[0], weight, bias)


def _update_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                     params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                     ) -> list[Tensor | None]:
    xh, xc, rz, c, h = saved
    hidden = h.shape[1]
    r, z = rz[:, :hidden], rz[:, hidden:]
    w_rz, b_rz, w_c, b_c = op.params
    d_pre_c = TANH_GRAD(grad * (1.0 - z), c)
    acc.linear((w_c, b_c), d_pre_c, xc)
    d_xc = d_pre_c @ params[w_c]
    d_rh = d_xc[:, hidden:]
    d_rz = torch.cat([d_rh * h, grad * (h - c)], dim=1)
    SIGMOID_GRAD(d_rz, rz, grad_input=d_rz)
    acc.linear((w_rz, b_rz), d_rz, xh)
    d_xh = d_rz @ params[w_rz]
    d_h = grad * z + d_rh * r + d_xh[:, hidden:]
    d_a = d_xc[:, :hidden] + d_xh[:, :hidden]
    slots = int(attrs.max()) if attrs.numel() else 0
    return [d_h, *(d_a[torch.nonzero(attrs > k).reshape(-1)] for k in range(slots))]


@KERNELS.register("ggnn.update")
@with_backward(_update_backward)
def ggnn_update(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """GRU step with input ``a_v = sum of v's messages`` (zero if none) and state ``h_v``:
    ``[r z] = sig(W_rz [a; h] + b_rz)``; ``c = tanh(W_c [a; r*h] + b_c)``;
    ``h' = z*h + (1 - z)*c`` (as :func:`~edbatch.executor.cells.gru_step`)."""
    w_rz, b_rz, w_c, b_c = op_params(op, params, 4)
    h = inputs[0]
    hidden = h.shape[1]
    if len(inputs) > 1:
        rows, segment = repeated_rows(inputs[1:], attrs)
        a = h.new_zeros(h.shape).index_add(0, segment, rows)
    else:
        a = h.new_zeros(h.shape)
    xh = torch.cat([a, h], dim=1)
    rz = torch.sigmoid(F.linear(xh, w_rz, b_rz))
    xc = torch.cat([a, rz[:, :hidden] * h], dim=1)
    c = fast_tanh(F.linear(xc, w_c, b_c))
    if save is not None:
        save += [xh, xc, rz, c, h]
    z = rz[:, hidden:]
    return z * h + (1.0 - z) * c


def _readout_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                      params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                      ) -> list[Tensor | None]:
    rows, segment, s, t = saved
    w_i, b_i, w_j, b_j = op.params
    g = grad[segment]
    d_i = g * t
    SIGMOID_GRAD(d_i, s, grad_input=d_i)
    d_j = TANH_GRAD(g * s, t)
    acc.linear((w_i, b_i), d_i, rows)
    acc.linear((w_j, b_j), d_j, rows)
    d_rows = torch.addmm(d_i @ params[w_i], d_j, params[w_j])
    sizes = [int(n) for n in (attrs.unsqueeze(1) > torch.arange(
        int(attrs.max()), device=attrs.device)).sum(0).tolist()]
    return list(d_rows.split(sizes))


@KERNELS.register("ggnn.readout")
@with_backward(_readout_backward)
def ggnn_readout(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                 attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``g = sum_v sig(W_i h_v + b_i) * tanh(W_j h_v + b_j)`` over each node's atoms."""
    w_i, b_i, w_j, b_j = op_params(op, params, 4)
    rows, segment = repeated_rows(inputs, attrs)
    s, t = torch.sigmoid(F.linear(rows, w_i, b_i)), fast_tanh(F.linear(rows, w_j, b_j))
    if save is not None:
        save += [rows, segment, s, t]
    terms = s * t
    return terms.new_zeros(attrs.shape[0], terms.shape[1]).index_add(0, segment, terms)


def _targets(attrs: Tensor, like: Tensor) -> Tensor:
    """The standardised targets ``attr / TARGET_SCALE`` as a ``[B, 1]`` column."""
    return (attrs.to(like.dtype) / TARGET_SCALE).unsqueeze(1)


def _loss_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                   params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                   ) -> list[Tensor | None]:
    g, u, err = saved
    w_h, b_h, w_p, b_p = op.params
    d_pred = grad * (err + err)
    acc.linear((w_p, b_p), d_pred, u)
    d_pre = TANH_GRAD(d_pred @ params[w_p], u)
    acc.linear((w_h, b_h), d_pre, g)
    return [d_pre @ params[w_h]]


@KERNELS.register("ggnn.loss")
@with_backward(_loss_backward)
def ggnn_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``(w_p^T tanh(W_h g + b_h) + b_p - z)^2`` with ``z = attr / TARGET_SCALE``."""
    w_h, b_h, w_p, b_p = op_params(op, params, 4)
    u = fast_tanh(F.linear(inputs[0], w_h, b_h))
    pred = F.linear(u, w_p, b_p)
    err = pred - _targets(attrs, pred)
    if save is not None:
        save += [inputs[0], u, err]
    return err * err


@KERNELS.register("ggnn.sq_err")
def ggnn_sq_err(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    """``(p - z)^2`` with ``z = attr / TARGET_SCALE`` (the primitive granularity's loss)."""
    return (inputs[0] - _targets(attrs, inputs[0])) ** 2
