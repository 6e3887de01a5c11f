"""Cell kinds of the GGNN molecule workload (:mod:`edbatch.workloads.ggnn_molecules`).

Each :class:`~edbatch.executor.cell_kind.CellKind` follows the equations of the workload's
module docstring and reads its parameters by their declared names (an op type lists them
in declaration order). ``ggnn.update`` and ``ggnn.readout`` are batchable *variadic* op
types (``in_shapes is None``): for a batch of ``B`` nodes, ``inputs`` holds the fixed operand
slots, then repeated slot ``k`` with the ``k``-th repeated operand of every node that has
more than ``k`` of them (in the batch's row order), and each node's attr is its number of
repeated operands (the convention of :mod:`edbatch.api._variadic`; a batch of one node gets
its operands one by one, which is the same thing).

Every kind but ``ggnn.sq_err`` has a hand-written backward reading its saves by name, so
cell-granularity programs train with :mod:`edbatch.executor._analytic` (a batch of one
variadic node is read operand by operand and falls back to autograd, as the executor does
for every variadic op); the gradients are checked against autograd through the reference
executor in ``tests/workloads/test_ggnn_molecules.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD
from edbatch.executor.kernels import fast_tanh
from edbatch.graph import OpType
from edbatch.workloads.ggnn_molecules import FEATURE_RANGES, OFFSETS, TARGET_SCALE

__all__ = ["GGNNEmbed", "GGNNLoss", "GGNNMsg", "GGNNReadout", "GGNNSqErr", "GGNNUpdate",
           "ggnn_embed", "ggnn_loss", "ggnn_msg", "ggnn_readout", "ggnn_sq_err",
           "ggnn_update", "repeated_rows"]

_SIZES = tuple(hi - lo + 1 for lo, hi in FEATURE_RANGES)
Grads = list[Tensor | None]


def _hidden(op: OpType) -> dict[str, int]:
    """``H``: the width of a GGNN state (the output of embed, msg, update and readout)."""
    return {"H": op.out_shape[0]}


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


class GGNNEmbed(CellKind):
    """``h0 = sum_f E[offset_f + x_f]``, the features unpacked from the attr (mixed radix)."""

    kind = "ggnn.embed"
    inputs = ()
    params = (Param("E", "V, H", init="embedding"),)
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        out = None
        for rows in _embed_rows(attrs):
            row = F.embedding(rows, p.E)
            out = row if out is None else out + row
        assert out is not None
        return out

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        for rows in _embed_rows(attrs):
            grads.rows("E", rows, grad)
        return []


class GGNNMsg(CellKind):
    """``m = A_b h + c_b`` (the bond type's weights are the op type's parameters)."""

    kind = "ggnn.msg"
    inputs = ("h",)
    params = (Param("W", "H, H"), Param("b", "H"))
    saves = ("x",)
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        if save is not None:
            save.update(x=inputs[0])
        return F.linear(inputs[0], p.W, p.b)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        grads.linear(("W", "b"), grad, saved.x)
        return [grad @ p.W]


class GGNNUpdate(CellKind):
    """GRU step with input ``a_v = sum of v's messages`` (zero if none) and state ``h_v``:
    ``[r z] = sig(W_rz [a; h] + b_rz)``; ``c = tanh(W_c [a; r*h] + b_c)``;
    ``h' = z*h + (1 - z)*c`` (as :func:`~edbatch.executor.cells.gru_step`)."""

    kind = "ggnn.update"
    params = (Param("W_rz", "2H, 2H"), Param("b_rz", "2H"), Param("W_c", "H, 2H"),
              Param("b_c", "H"))
    saves = ("xh", "xc", "rz", "c", "h")
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        h = inputs[0]
        hidden = h.shape[1]
        if len(inputs) > 1:
            rows, segment = repeated_rows(inputs[1:], attrs)
            a = h.new_zeros(h.shape).index_add(0, segment, rows)
        else:
            a = h.new_zeros(h.shape)
        xh = torch.cat([a, h], dim=1)
        rz = torch.sigmoid(F.linear(xh, p.W_rz, p.b_rz))
        xc = torch.cat([a, rz[:, :hidden] * h], dim=1)
        c = fast_tanh(F.linear(xc, p.W_c, p.b_c))
        if save is not None:
            save.update(xh=xh, xc=xc, rz=rz, c=c, h=h)
        z = rz[:, hidden:]
        return z * h + (1.0 - z) * c

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        rz, c, h = saved.rz, saved.c, saved.h
        hidden = h.shape[1]
        r, z = rz[:, :hidden], rz[:, hidden:]
        d_pre_c = TANH_GRAD(grad * (1.0 - z), c)
        grads.linear(("W_c", "b_c"), d_pre_c, saved.xc)
        d_xc = d_pre_c @ p.W_c
        d_rh = d_xc[:, hidden:]
        d_rz = torch.cat([d_rh * h, grad * (h - c)], dim=1)
        SIGMOID_GRAD(d_rz, rz, grad_input=d_rz)
        grads.linear(("W_rz", "b_rz"), d_rz, saved.xh)
        d_xh = d_rz @ p.W_rz
        d_h = grad * z + d_rh * r + d_xh[:, hidden:]
        d_a = d_xc[:, :hidden] + d_xh[:, :hidden]
        slots = int(attrs.max()) if attrs.numel() else 0
        return [d_h, *(d_a[torch.nonzero(attrs > k).reshape(-1)] for k in range(slots))]


class GGNNReadout(CellKind):
    """``g = sum_v sig(W_i h_v + b_i) * tanh(W_j h_v + b_j)`` over each node's atoms."""

    kind = "ggnn.readout"
    params = (Param("W_i", "H, H"), Param("b_i", "H"), Param("W_j", "H, H"), Param("b_j", "H"))
    saves = ("rows", "segment", "s", "t")
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        rows, segment = repeated_rows(inputs, attrs)
        s, t = torch.sigmoid(F.linear(rows, p.W_i, p.b_i)), fast_tanh(F.linear(rows, p.W_j, p.b_j))
        if save is not None:
            save.update(rows=rows, segment=segment, s=s, t=t)
        terms = s * t
        return terms.new_zeros(attrs.shape[0], terms.shape[1]).index_add(0, segment, terms)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        s, t = saved.s, saved.t
        g = grad[saved.segment]
        d_i = g * t
        SIGMOID_GRAD(d_i, s, grad_input=d_i)
        d_j = TANH_GRAD(g * s, t)
        grads.linear(("W_i", "b_i"), d_i, saved.rows)
        grads.linear(("W_j", "b_j"), d_j, saved.rows)
        d_rows = torch.addmm(d_i @ p.W_i, d_j, p.W_j)
        sizes = [int(n) for n in (attrs.unsqueeze(1) > torch.arange(
            int(attrs.max()), device=attrs.device)).sum(0).tolist()]
        return list(d_rows.split(sizes))


def _targets(attrs: Tensor, like: Tensor) -> Tensor:
    """The standardised targets ``attr / TARGET_SCALE`` as a ``[B, 1]`` column."""
    return (attrs.to(like.dtype) / TARGET_SCALE).unsqueeze(1)


class GGNNLoss(CellKind):
    """``(w_p^T tanh(W_h g + b_h) + b_p - z)^2`` with ``z = attr / TARGET_SCALE``."""

    kind = "ggnn.loss"
    inputs = ("g",)
    params = (Param("W_h", "H, H"), Param("b_h", "H"), Param("W_p", "1, H"), Param("b_p", "1"))
    saves = ("g", "u", "err")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        u = fast_tanh(F.linear(inputs[0], p.W_h, p.b_h))
        pred = F.linear(u, p.W_p, p.b_p)
        err = pred - _targets(attrs, pred)
        if save is not None:
            save.update(g=inputs[0], u=u, err=err)
        return err * err

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        err = saved.err
        d_pred = grad * (err + err)
        grads.linear(("W_p", "b_p"), d_pred, saved.u)
        d_pre = TANH_GRAD(d_pred @ p.W_p, saved.u)
        grads.linear(("W_h", "b_h"), d_pre, saved.g)
        return [d_pre @ p.W_h]


class GGNNSqErr(CellKind):
    """``(p - z)^2`` with ``z = attr / TARGET_SCALE`` (the primitive granularity's loss)."""

    kind = "ggnn.sq_err"
    inputs = ("pred",)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return (inputs[0] - _targets(attrs, inputs[0])) ** 2


#: The registered kernels, under the names they had as functions.
ggnn_embed, ggnn_msg, ggnn_update = GGNNEmbed.kernel, GGNNMsg.kernel, GGNNUpdate.kernel
ggnn_readout, ggnn_loss, ggnn_sq_err = GGNNReadout.kernel, GGNNLoss.kernel, GGNNSqErr.kernel
