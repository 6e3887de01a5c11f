"""Cell kernels of the GGNN molecule workload (:mod:`edbatch.workloads.ggnn_molecules`).

Each kernel follows the equations of the workload's module docstring and reads its
parameters by position in ``op.params``. ``ggnn.update`` and ``ggnn.readout`` are batchable
*variadic* op types (``in_shapes is None``): for a batch of ``B`` nodes, ``inputs`` holds the
fixed operand slots, then repeated slot ``k`` with the ``k``-th repeated operand of every
node that has more than ``k`` of them (in the batch's row order), and each node's attr is
its number of repeated operands (the convention of :mod:`edbatch.api._variadic`; a batch of
one node gets its operands one by one, which is the same thing).

There is no hand-written backward: programs using these kernels train through autograd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.cells import gru_step
from edbatch.executor.kernels import KERNELS, fast_tanh, op_params
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


@KERNELS.register("ggnn.embed")
def ggnn_embed(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
    """``h0 = sum_f E[offset_f + x_f]``, the features unpacked from the attr (mixed radix)."""
    (table,) = op_params(op, params, 1)
    code, out = attrs, None
    for offset, size in zip(OFFSETS, _SIZES, strict=True):
        row = F.embedding(offset + torch.remainder(code, size), table)
        out = row if out is None else out + row
        code = torch.div(code, size, rounding_mode="floor")
    assert out is not None
    return out


@KERNELS.register("ggnn.msg")
def ggnn_msg(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
             attrs: Tensor) -> Tensor:
    """``m = A_b h + c_b`` (the bond type's weights are the op type's parameters)."""
    weight, bias = op_params(op, params, 2)
    return F.linear(inputs[0], weight, bias)


@KERNELS.register("ggnn.update")
def ggnn_update(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    """GRU step with input ``a_v = sum of v's messages`` (zero if none) and state ``h_v``."""
    w_rz, b_rz, w_c, b_c = op_params(op, params, 4)
    h = inputs[0]
    if len(inputs) > 1:
        rows, segment = repeated_rows(inputs[1:], attrs)
        a = h.new_zeros(h.shape).index_add(0, segment, rows)
    else:
        a = h.new_zeros(h.shape)
    return gru_step(a, h, w_rz, b_rz, w_c, b_c)


@KERNELS.register("ggnn.readout")
def ggnn_readout(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                 attrs: Tensor) -> Tensor:
    """``g = sum_v sig(W_i h_v + b_i) * tanh(W_j h_v + b_j)`` over each node's atoms."""
    w_i, b_i, w_j, b_j = op_params(op, params, 4)
    rows, segment = repeated_rows(inputs, attrs)
    terms = torch.sigmoid(F.linear(rows, w_i, b_i)) * fast_tanh(F.linear(rows, w_j, b_j))
    return terms.new_zeros(attrs.shape[0], terms.shape[1]).index_add(0, segment, terms)


def _targets(attrs: Tensor, like: Tensor) -> Tensor:
    """The standardised targets ``attr / TARGET_SCALE`` as a ``[B, 1]`` column."""
    return (attrs.to(like.dtype) / TARGET_SCALE).unsqueeze(1)


@KERNELS.register("ggnn.loss")
def ggnn_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor) -> Tensor:
    """``(w_p^T tanh(W_h g + b_h) + b_p - z)^2`` with ``z = attr / TARGET_SCALE``."""
    w_h, b_h, w_p, b_p = op_params(op, params, 4)
    pred = F.linear(fast_tanh(F.linear(inputs[0], w_h, b_h)), w_p, b_p)
    return (pred - _targets(attrs, pred)) ** 2


@KERNELS.register("ggnn.sq_err")
def ggnn_sq_err(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    """``(p - z)^2`` with ``z = attr / TARGET_SCALE`` (the primitive granularity's loss)."""
    return (inputs[0] - _targets(attrs, inputs[0])) ** 2
