"""Cell kinds of the GGNN molecule workload (:mod:`edbatch.workloads.ggnn_molecules`).

Each :class:`~edbatch.executor.cell_kind.CellKind` follows the equations of the workload's
module docstring and reads its parameters by their declared names (an op type lists them
in declaration order). ``ggnn.update`` and ``ggnn.readout`` are batchable *variadic* op
types (``in_shapes is None``): for a batch of ``B`` nodes, ``inputs`` holds the fixed operand
slots, then repeated slot ``k`` with the ``k``-th repeated operand of every node that has
more than ``k`` of them (in the batch's row order), and each node's attr is its number of
repeated operands (the convention of :mod:`edbatch.api._variadic`; a batch of one node gets
its operands one by one, which is the same thing); ``ggnn.update``'s attr also carries the
bond type of each repeated operand above the count's bits
(:func:`~edbatch.workloads.ggnn_molecules.update_attr`).

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

from edbatch.data.molecules import BOND_TYPES
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD
from edbatch.executor.kernels import fast_tanh, slot_nodes
from edbatch.graph import OpType
from edbatch.workloads.ggnn_molecules import COUNT_BITS, FEATURE_RANGES, OFFSETS, TARGET_SCALE

__all__ = ["GGNNEmbed", "GGNNLoss", "GGNNReadout", "GGNNSqErr", "GGNNUpdate", "ggnn_embed",
           "ggnn_loss", "ggnn_readout", "ggnn_sq_err", "ggnn_update", "neighbour_sums",
           "repeated_rows"]

_SIZES = tuple(hi - lo + 1 for lo, hi in FEATURE_RANGES)
_COUNT_MASK = (1 << COUNT_BITS) - 1
Grads = list[Tensor | None]


def _hidden(op: OpType) -> dict[str, int]:
    """``H``: the width of a GGNN state (the output of embed, msg, update and readout)."""
    return {"H": op.out_shape[0]}


def repeated_rows(slots: Sequence[Tensor], counts: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows [N, d], segment int64[N])``: the repeated operand slots stacked, and the node
    (``0..B-1``) each row belongs to, from the nodes' repeated-operand ``counts``."""
    segment = torch.cat(slot_nodes(counts, [t.shape[0] for t in slots]))
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


def neighbour_sums(slots: Sequence[Tensor], attrs: Tensor, bonds: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """``(s [B, bonds*H], deg [B, bonds], index int64[N])``: each node's neighbour states
    summed per bond type (``s[v, b*H:(b+1)*H] = sum of h_u over v's in-edges of type b``),
    its in-degree per bond type, and the ``node * bonds + bond`` bucket of every repeated
    operand row (in :func:`repeated_rows` order), from the attrs of
    :func:`~edbatch.workloads.ggnn_molecules.update_attr`."""
    counts = torch.bitwise_and(attrs, _COUNT_MASK)
    size, hidden = attrs.shape[0], slots[0].shape[1] if slots else 0
    if not slots:
        return (attrs.new_zeros(0), attrs.new_zeros(0), attrs.new_zeros(0))
    codes = torch.bitwise_right_shift(attrs, COUNT_BITS)
    nodes = slot_nodes(counts, [t.shape[0] for t in slots])
    index = torch.cat([n * bonds + torch.bitwise_and(
        torch.bitwise_right_shift(codes[n], 2 * k), 3) for k, n in enumerate(nodes)])
    rows = torch.cat(list(slots))
    s = rows.new_zeros(size * bonds, hidden).index_add_(0, index, rows)
    deg = rows.new_zeros(size * bonds).index_add_(0, index, rows.new_ones(len(index)))
    return s.view(size, bonds * hidden), deg.view(size, bonds), index


class GGNNUpdate(CellKind):
    """One round at an atom ``v``: messages ``a_v = sum_b A_b S_vb + deg_vb c_b`` with
    ``S_vb`` the sum of the neighbour states over v's bonds of type ``b`` (``= sum over
    in-edges of A_b h_u + c_b``, all bond types in one GEMM of ``[S_v1 .. S_v4]``), then the
    GRU with input ``a_v`` and state ``h_v``: ``[r z] = sig(W_rz [a; h] + b_rz)``;
    ``c = tanh(W_c [a; r*h] + b_c)``; ``h' = z*h + (1 - z)*c`` (as
    :func:`~edbatch.executor.cells.gru_step`). Operands: ``h_v``, then the neighbour
    states; attr:
    :func:`~edbatch.workloads.ggnn_molecules.update_attr` of their bond types."""

    kind = "ggnn.update"
    params = (*(Param(f"{w}{b}", shape) for b in range(len(BOND_TYPES))
                for w, shape in (("A", "H, H"), ("c", "H"))),
              Param("W_rz", "2H, 2H"), Param("b_rz", "2H"), Param("W_c", "H, 2H"),
              Param("b_c", "H"))
    saves = ("xh", "xc", "rz", "c", "h", "s", "deg", "index", "sizes")
    dims = staticmethod(_hidden)

    @staticmethod
    def _message_weights(p: Any) -> tuple[Tensor, Tensor]:
        """``([A_1 .. A_4] [H, 4H], [c_1; ..; c_4] [4, H])``."""
        bonds = range(len(BOND_TYPES))
        return (torch.cat([getattr(p, f"A{b}") for b in bonds], dim=1),
                torch.stack([getattr(p, f"c{b}") for b in bonds]))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        h = inputs[0]
        hidden = h.shape[1]
        s, deg, index = neighbour_sums(inputs[1:], attrs, len(BOND_TYPES))
        if len(inputs) > 1:
            weight, bias = self._message_weights(p)
            a = torch.addmm(deg @ bias, s, weight.t())
        else:
            a = h.new_zeros(h.shape)
        xh = torch.cat([a, h], dim=1)
        rz = torch.sigmoid(F.linear(xh, p.W_rz, p.b_rz))
        xc = torch.cat([a, rz[:, :hidden] * h], dim=1)
        c = fast_tanh(F.linear(xc, p.W_c, p.b_c))
        if save is not None:
            save.update(xh=xh, xc=xc, rz=rz, c=c, h=h, s=s, deg=deg, index=index,
                        sizes=[t.shape[0] for t in inputs[1:]])
        return torch.addcmul(c, rz[:, hidden:], h - c)  # z*h + (1 - z)*c in two kernels

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        rz, c, h = saved.rz, saved.c, saved.h
        hidden = h.shape[1]
        r, z = rz[:, :hidden], rz[:, hidden:]
        d_pre_c = TANH_GRAD(grad * (1.0 - z), c)
        grads.linear(("W_c", "b_c"), d_pre_c, saved.xc)
        d_xc = d_pre_c @ p.W_c
        d_rh = d_xc[:, hidden:]
        d_rz = torch.empty_like(rz)  # [d_r d_z] written in place, no cat
        torch.mul(d_rh, h, out=d_rz[:, :hidden])
        torch.mul(grad, h - c, out=d_rz[:, hidden:])
        SIGMOID_GRAD(d_rz, rz, grad_input=d_rz)
        grads.linear(("W_rz", "b_rz"), d_rz, saved.xh)
        d_xh = d_rz @ p.W_rz
        d_h = torch.addcmul(d_xh[:, hidden:], grad, z).addcmul_(d_rh, r)
        if not saved.index.numel():
            return [d_h]
        d_a = d_xc[:, :hidden] + d_xh[:, :hidden]
        g_weight, g_bias = d_a.t() @ saved.s, saved.deg.t() @ d_a
        for b in range(len(BOND_TYPES)):
            grads.add(f"A{b}", g_weight[:, b * hidden:(b + 1) * hidden])
            grads.add(f"c{b}", g_bias[b])
        weight = self._message_weights(p)[0]
        d_rows = (d_a @ weight).view(-1, hidden)[saved.index]
        return [d_h, *d_rows.split(saved.sizes)]


class GGNNReadout(CellKind):
    """``g = sum_v sig(W_i h_v + b_i) * tanh(W_j h_v + b_j)`` over each node's atoms."""

    kind = "ggnn.readout"
    params = (Param("W_i", "H, H"), Param("b_i", "H"), Param("W_j", "H, H"), Param("b_j", "H"))
    saves = ("rows", "segment", "s", "t", "sizes")
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        rows, segment = repeated_rows(inputs, attrs)
        s, t = torch.sigmoid(F.linear(rows, p.W_i, p.b_i)), fast_tanh(F.linear(rows, p.W_j, p.b_j))
        if save is not None:
            save.update(rows=rows, segment=segment, s=s, t=t,
                        sizes=[x.shape[0] for x in inputs])
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
        return list(d_rows.split(saved.sizes))


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
ggnn_embed, ggnn_update = GGNNEmbed.kernel, GGNNUpdate.kernel
ggnn_readout, ggnn_loss, ggnn_sq_err = GGNNReadout.kernel, GGNNLoss.kernel, GGNNSqErr.kernel
