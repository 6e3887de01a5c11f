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

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.data.molecules import BOND_TYPES
from edbatch.executor import _fused
from edbatch.executor._fused_ggnn import (
    BucketGrad,
    bucket_sums,
    bucket_sums_at,
    compact_buckets,
    embed_backward,
    embed_forward,
    gru_backward_c,
    gru_backward_r,
    gru_gates,
    gru_output,
    scatter_messages,
)
from edbatch.executor._ggnn_checks import check_codes
from edbatch.executor._ggnn_rows import (
    compiled,
    neighbour_sums,
    per_attrs,
    repeated_rows,
    slot_rows,
    stacked,
)
from edbatch.executor._reads import ArenaRows
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD_INTO
from edbatch.executor.cells_ggnn_head import (
    GGNNLoss,
    GGNNReadout,
    GGNNSqErr,
    _hidden,
    _tanh_,
    ggnn_loss,
    ggnn_readout,
    ggnn_sq_err,
)
from edbatch.executor.kernels import fast_tanh, untracked
from edbatch.graph import OpType
from edbatch.workloads.ggnn_molecules import COUNT_BITS, FEATURE_RANGES, OFFSETS

__all__ = ["GGNNEmbed", "GGNNLoss", "GGNNReadout", "GGNNSqErr", "GGNNUpdate", "ggnn_embed",
           "ggnn_loss", "ggnn_readout", "ggnn_sq_err", "ggnn_update", "neighbour_sums",
           "repeated_rows", "slot_rows"]

_SIZES = tuple(hi - lo + 1 for lo, hi in FEATURE_RANGES)
_RADIX = tuple(math.prod(_SIZES[:f]) for f in range(len(_SIZES)))
_BONDS = len(BOND_TYPES)
#: Whether ``ggnn.update`` computes its messages in the compact form where it can (CPU,
#: fused kernels on, nothing recording autograd); ``False``: the dense form everywhere (an
#: ablation switch; both are checked equal in ``tests/workloads/test_ggnn_molecules.py``).
COMPACT = True
#: Whether ``ggnn.update`` adds its weight gradients in place (:meth:`RoleGrads.addmm`: no
#: per-batch result, ``cat`` or final stack-and-sum) and makes its message buckets once per
#: run for equal attrs (the rounds); ``False``: per batch, the form before 2026-11-28 (an
#: ablation switch for ``benchmarks/ggnn_ab.py``; both are checked equal in the tests).
REUSE = True
Grads = list[Tensor | None]


_EMBED_CODES: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}


def _mixed(device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``(offset, radix, size)`` (``int64[6]``) of the packed atom features."""
    if device not in _EMBED_CODES:
        _EMBED_CODES[device] = tuple(  # type: ignore[assignment]
            torch.tensor(v, dtype=torch.int64, device=device) for v in (OFFSETS, _RADIX, _SIZES))
    return _EMBED_CODES[device]


def _embed_rows(attrs: Tensor) -> Tensor:
    """``int64[6, B]``: the table row each packed atom reads, one row per feature."""
    offset, radix, size = (t.unsqueeze(1) for t in _mixed(attrs.device))
    return torch.div(attrs.unsqueeze(0), radix, rounding_mode="floor").remainder_(size) \
        .add_(offset)


def _embed_fused(attrs: Tensor, *tensors: Tensor) -> bool:
    """Whether the embedding runs as one compiled loop (:func:`embed_forward`, CPU attrs)."""
    return compiled(attrs) and attrs.is_contiguous() and _fused.usable(*tensors)


class GGNNEmbed(CellKind):
    """``h0 = sum_f E[offset_f + x_f]``, the features unpacked from the attr (mixed radix).
    With the compiled kernels (CPU) the rows are summed in one loop and the backward sums
    each table row's gradient once (a sparse gradient of the rows read, not ``6 B`` rows);
    elsewhere a ``[6, B, H]`` lookup and its sum."""

    kind = "ggnn.embed"
    inputs = ()
    params = (Param("E", "V, H", init="embedding"),)
    dims = staticmethod(_hidden)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        if _embed_fused(attrs, p.E) and (out is None or _fused.usable(p.E, out)):
            out = p.E.new_empty(attrs.shape[0], p.E.shape[1]) if out is None else out
            embed_forward(attrs, _mixed(attrs.device), p.E, out)
            return out
        check_codes(attrs, _mixed(attrs.device))  # (CPU only: no host sync elsewhere)
        rows = F.embedding(_embed_rows(attrs), p.E)  # [6, B, H]
        if out is None:
            return rows.sum(0)
        return torch.sum(rows, 0, out=out) if untracked(rows) else out.copy_(rows.sum(0))

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        if _embed_fused(attrs, grad, p.E):
            grads.rows("E", *embed_backward(attrs, _mixed(attrs.device), grad, p.E.shape[0]))
            return []
        for rows in _embed_rows(attrs):
            grads.rows("E", rows, grad)
        return []


class GGNNUpdate(CellKind):
    """One round at an atom ``v``: messages ``a_v = sum_b A_b S_vb + deg_vb c_b`` with
    ``S_vb`` the sum of the neighbour states over v's bonds of type ``b`` (``= sum over
    in-edges of A_b h_u + c_b``, all bond types in one GEMM of ``[S_v1 .. S_v4]``), then the
    GRU with input ``a_v`` and state ``h_v``: ``[r z] = sig(W_rz [a; h] + b_rz)``;
    ``c = tanh(W_c [a; r*h] + b_c)``; ``h' = z*h + (1 - z)*c`` (as
    :func:`~edbatch.executor.cells.gru_step`). Operands: ``h_v``, then the neighbour
    states; attr: :func:`~edbatch.workloads.ggnn_molecules.update_attr` of their bond types.

    The GRU's weights are read as column blocks (no ``[a; h]`` is built): one GEMM of ``a``
    by the stacked ``a`` blocks of ``W_rz`` and ``W_c`` gives ``[r z | c]``'s input part
    (``G``, ``[B, 3H]``), the ``h`` and ``r*h`` blocks are added into it in place, and the
    element-wise part runs in place in ``G`` (two compiled kernels where
    :func:`~edbatch.executor._fused.usable`, else torch kernels); the backward mirrors it
    with one ``[B, 3H]`` pre-activation gradient and per-batch weight gradients.

    Messages: on the CPU with the compiled kernels (:data:`COMPACT`) only the non-empty
    ``(atom, bond type)`` buckets are summed and multiplied (one GEMM by ``A_b`` per bond
    type, about a third of the dense ``[S_1 .. S_4]`` block on ESOL); elsewhere (CUDA: no
    host sync for the bucket counts; autograd) the dense GEMM. ``merge_repeated``: on the
    CPU the executor reads the neighbour states as one operand after ``h`` (one gather and
    one gradient route per batch); the kernels take the slots from the attrs' counts."""

    kind = "ggnn.update"
    params = (*(Param(f"{w}{b}", shape) for b in range(_BONDS)
                for w, shape in (("A", "H, H"), ("c", "H"))),
              Param("W_rz", "2H, 2H"), Param("b_rz", "2H"), Param("W_c", "H, 2H"),
              Param("b_c", "H"))
    saves = ("a", "h", "gates", "rh", "s", "deg", "index", "nodes", "bounds", "sizes",
             "in_place")
    merge_repeated = 1  # (CPU) the neighbour states as one read after h: see _program
    counts_attr = (1, COUNT_BITS)  # the neighbours, counted in the attr's low bits
    indexed_reads = (1,)  # (CPU) that read as arena rows, summed in place: no gather
    dims = staticmethod(_hidden)

    @staticmethod
    def _message_weights(p: Any) -> tuple[Tensor, Tensor]:
        """``([A_1 .. A_4] [H, 4H], [c_1; ..; c_4] [4, H])``."""
        parts = [getattr(p, f"{w}{b}") for w in "Ac" for b in range(_BONDS)]
        return stacked("ggnn.update/messages", parts, lambda *t: (
            torch.cat(t[:_BONDS], dim=1), torch.stack(t[_BONDS:])))

    @staticmethod
    def _input_weights(p: Any, hidden: int) -> tuple[Tensor, Tensor]:
        """``([W_rz; W_c][:, :H] [3H, H], [b_rz; b_c] [3H])``: the ``a`` blocks, stacked."""
        return stacked("ggnn.update/inputs", (p.W_rz, p.W_c, p.b_rz, p.b_c),  # type: ignore[no-any-return]
                        lambda w_rz, w_c, b_rz, b_c: (
                            torch.cat([w_rz[:, :hidden], w_c[:, :hidden]]),
                            torch.cat([b_rz, b_c])))

    @staticmethod
    def _compact_messages(slots: Sequence[Tensor], attrs: Tensor, p: Any,
                          at: ArenaRows | None = None
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, list[int]]:
        """``(a, s, deg [B, 4], bucket, nodes, bounds)``: the messages over the non-empty
        ``(node, bond type)`` buckets only (CPU, fused kernels on; about a third of the
        ``B x 4`` blocks of the dense form): ``s`` sums each bucket's rows (buckets of bond
        type ``t`` at ``bounds[t]:bounds[t + 1]``, their nodes ``nodes``), one GEMM by
        ``A_t`` per bond type, scattered onto ``deg C``; ``at``: the repeated rows as arena
        rows (one merged read), summed where they lie."""
        like = slots[0] if at is None else at.arena
        rows = sum(t.shape[0] for t in slots) if at is None else at.idx.shape[0]
        slots_ = max(len(slots), 1)  # the buckets: once per run for equal attrs (rounds)
        make = lambda: compact_buckets(attrs, rows, slots_, _BONDS, COUNT_BITS, like.dtype)  # noqa: E731
        bucket, deg, nodes, bounds = per_attrs(
            ("ggnn.update/buckets", rows, slots_, like.dtype), attrs, make) if REUSE else make()
        s = bucket_sums(list(slots), bucket, bounds[-1]) if at is None else \
            bucket_sums_at(at.arena, at.idx, bucket, bounds[-1])
        m = torch.empty_like(s)
        for b in range(_BONDS):
            if bounds[b + 1] > bounds[b]:
                torch.mm(s[bounds[b]:bounds[b + 1]], getattr(p, f"A{b}").t(),
                         out=m[bounds[b]:bounds[b + 1]])
        c = GGNNUpdate._message_weights(p)[1]
        if REUSE and _fused.usable(m, c):  # deg C and the scatter in one compiled loop
            a = scatter_messages(m, nodes, deg, c, m.new_empty(attrs.shape[0], m.shape[1]))
        else:
            a = torch.mm(deg.view(-1, _BONDS), c).index_add_(0, nodes, m)
        return a, s, deg.view(-1, _BONDS), bucket, nodes, bounds

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        h = inputs[0]
        hidden = h.shape[1]
        nodes, bounds, at = None, None, None
        compact = COMPACT and compiled(attrs) and \
            untracked(*(getattr(p, f"A{b}") for b in range(_BONDS)))
        if len(inputs) == 2 and type(inputs[1]) is ArenaRows and compact and \
                untracked(inputs[1].arena) and _fused.usable(inputs[1].arena, h):
            at = inputs[1]  # the neighbour rows summed where they lie
            a, s, deg, index, nodes, bounds = self._compact_messages((), attrs, p, at)
        elif any(type(x) is ArenaRows for x in inputs):  # anything else: gathered
            inputs = [x.rows() if type(x) is ArenaRows else x for x in inputs]  # type: ignore[union-attr]
        if at is None and len(inputs) > 1 and compact and untracked(*inputs[1:]):
            a, s, deg, index, nodes, bounds = self._compact_messages(inputs[1:], attrs, p)
        elif at is None and len(inputs) > 1:
            s, deg, index = neighbour_sums(inputs[1:], attrs, _BONDS)
            weight, bias = self._message_weights(p)
            a = torch.addmm(deg @ bias, s, weight.t())
        elif at is None:
            s, deg, index = neighbour_sums(inputs[1:], attrs, _BONDS)
            a = h.new_zeros(h.shape)
        w_a, b_a = self._input_weights(p, hidden)
        w_rh, w_ch = p.W_rz[:, hidden:], p.W_c[:, hidden:]
        if untracked(h, a, w_a, b_a):  # in place, into ``out``
            g = torch.addmm(b_a, a, w_a.t())
            g[:, :2 * hidden].addmm_(h, w_rh.t())
            rh = torch.empty_like(h)
            out = torch.empty_like(h) if out is None else out
            fused = _fused.usable(g, h, rh, out)
            if fused:
                gru_gates(g, h, rh)
            else:
                torch.mul(g[:, :2 * hidden].sigmoid_()[:, :hidden], h, out=rh)
            g[:, 2 * hidden:].addmm_(rh, w_ch.t())
            if fused:
                gru_output(g, h, out)
            else:
                c = _tanh_(g[:, 2 * hidden:])
                torch.addcmul(c, g[:, hidden:2 * hidden], h - c, out=out)
        else:  # autograd records: out of place
            rz = torch.sigmoid(torch.addmm(b_a[:2 * hidden], a, w_a[:2 * hidden].t())
                               + h @ w_rh.t())
            rh = rz[:, :hidden] * h
            c = fast_tanh(torch.addmm(b_a[2 * hidden:], a, w_a[2 * hidden:].t())
                          + rh @ w_ch.t())
            g = torch.cat([rz, c], dim=1)
            y = torch.addcmul(c, rz[:, hidden:], h - c)
            out = y if out is None else out.copy_(y)
        if save is not None:
            save.update(a=a, h=h, gates=g, rh=rh, s=s, deg=deg, index=index, nodes=nodes,
                        bounds=bounds, sizes=[t.shape[0] for t in inputs[1:]] if at is None
                        else [at.idx.shape[0]],
                        in_place=at is not None)
        return out

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        g, h, rh, a = saved.gates, saved.h, saved.rh, saved.a
        hidden = h.shape[1]
        w_a = self._input_weights(p, hidden)[0]
        d = torch.empty_like(g)  # [d_r d_z d_c]: pre-activation gradients
        d_h = torch.empty_like(h)
        d_c = d[:, 2 * hidden:]
        if _fused.usable(grad, g, h, d, d_h):
            gru_backward_c(grad, g, h, d, d_h)
            d_rh = d_c @ p.W_c[:, hidden:]
            gru_backward_r(d_rh, g, h, d, d_h)
        else:
            r, z, c = g.split(hidden, 1)
            torch.mul(grad, z, out=d_h)
            TANH_GRAD_INTO(grad - d_h, c, grad_input=d_c)
            d_z = d[:, hidden:2 * hidden]
            SIGMOID_GRAD(torch.mul(grad, h - c, out=d_z), z, grad_input=d_z)
            d_rh = d_c @ p.W_c[:, hidden:]
            d_r = d[:, :hidden]
            SIGMOID_GRAD(torch.mul(d_rh, h, out=d_r), r, grad_input=d_r)
            d_h.addcmul_(d_rh, r)
        d_rz = d[:, :2 * hidden]
        d_h.addmm_(d_rz, p.W_rz[:, hidden:])
        d_a = d @ w_a
        if REUSE:  # weight gradients added in place by column block (no result or cat)
            d_rz_t, d_c_t = d_rz.t(), d_c.t()
            grads.addmm("W_rz", d_rz_t, a, p.W_rz)
            grads.addmm("W_rz", d_rz_t, h, p.W_rz, hidden)
            grads.addmm("W_c", d_c_t, a, p.W_c)
            grads.addmm("W_c", d_c_t, rh, p.W_c, hidden)
        else:
            g_a = d.t() @ a
            grads.add("W_rz", torch.cat([g_a[:2 * hidden], d_rz.t() @ h], dim=1))
            grads.add("W_c", torch.cat([g_a[2 * hidden:], d_c.t() @ rh], dim=1))
        bias = d.sum(0)
        grads.add("b_rz", bias[:2 * hidden])
        grads.add("b_c", bias[2 * hidden:])
        if not saved.index.numel():
            return [d_h]
        g_bias = saved.deg.t() @ d_a
        for b in range(_BONDS):
            grads.add(f"c{b}", g_bias[b])
        if saved.bounds is not None:  # the compact form: one GEMM per bond type each way
            bounds, s = saved.bounds, saved.s
            d_m, d_s = d_a.index_select(0, saved.nodes), torch.empty_like(s)
            for b in range(_BONDS):
                lo, hi = bounds[b], bounds[b + 1]
                if REUSE:
                    grads.addmm(f"A{b}", d_m[lo:hi].t(), s[lo:hi], getattr(p, f"A{b}"))
                else:
                    grads.add(f"A{b}", d_m[lo:hi].t() @ s[lo:hi])
                if hi > lo:
                    torch.mm(d_m[lo:hi], getattr(p, f"A{b}"), out=d_s[lo:hi])
            if saved.in_place:  # routed by bucket straight into the gradient arena
                return [d_h, BucketGrad(d_s, saved.index)]  # type: ignore[list-item]
            return [d_h, *d_s.index_select(0, saved.index).split(saved.sizes)]
        g_weight = d_a.t() @ saved.s
        for b in range(_BONDS):
            grads.add(f"A{b}", g_weight[:, b * hidden:(b + 1) * hidden])
        weight = self._message_weights(p)[0]
        d_rows = (d_a @ weight).view(-1, hidden).index_select(0, saved.index)
        return [d_h, *d_rows.split(saved.sizes)]


#: The registered kernels, under the names they had as functions.
ggnn_embed, ggnn_update = GGNNEmbed.kernel, GGNNUpdate.kernel
