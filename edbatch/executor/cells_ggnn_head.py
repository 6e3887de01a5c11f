"""Cell kinds of the GGNN molecule workload's head (:mod:`edbatch.workloads.ggnn_molecules`):
``ggnn.readout`` (a batchable *variadic* op type, the convention of
:mod:`~edbatch.executor.cells_ggnn`), ``ggnn.loss`` and ``ggnn.sq_err``; with hand-written
backwards (``ggnn.sq_err``: autograd), checked against autograd through the reference
executor in ``tests/workloads/test_ggnn_molecules.py``. :mod:`~edbatch.executor.cells_ggnn`
holds the embedding and the message-passing update and re-exports these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._fused_ggnn import gate_backward, gate_forward
from edbatch.executor._ggnn_rows import repeated_rows, stacked
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD, TANH_GRAD_INTO
from edbatch.executor.kernels import FAST_TANH_MIN, fast_tanh, untracked
from edbatch.graph import OpType
from edbatch.workloads.ggnn_molecules import TARGET_SCALE

__all__ = ["GGNNLoss", "GGNNReadout", "GGNNSqErr", "ggnn_loss", "ggnn_readout", "ggnn_sq_err"]

Grads = list[Tensor | None]


def _hidden(op: OpType) -> dict[str, int]:
    """``H``: the width of a GGNN state (the output of embed, msg, update and readout)."""
    return {"H": op.out_shape[0]}


def _tanh_(x: Tensor) -> Tensor:
    """``x = tanh(x)`` in place, as :func:`~edbatch.executor.kernels.fast_tanh` computes it."""
    if x.numel() < FAST_TANH_MIN or x.device.type != "cpu":
        return x.tanh_()
    return x.add_(x).sigmoid_().mul_(2.0).sub_(1.0)



class GGNNReadout(CellKind):
    """``g = sum_v sig(W_i h_v + b_i) * tanh(W_j h_v + b_j)`` over each node's atoms (one
    GEMM of the atoms' states by ``[W_i; W_j]``, the gate in place: one compiled kernel where
    :func:`~edbatch.executor._fused.usable`)."""

    kind = "ggnn.readout"
    params = (Param("W_i", "H, H"), Param("b_i", "H"), Param("W_j", "H, H"), Param("b_j", "H"))
    saves = ("rows", "segment", "gates", "sizes")
    merge_repeated = 0  # (CPU) every atom state as one read: see _program
    counts_attr = (0, 0)  # the attr: the molecule's atom count
    dims = staticmethod(_hidden)

    @staticmethod
    def _weights(p: Any) -> tuple[Tensor, Tensor]:
        """``([W_i; W_j] [2H, H], [b_i; b_j] [2H])``."""
        return stacked("ggnn.readout", (p.W_i, p.W_j, p.b_i, p.b_j),  # type: ignore[no-any-return]
                        lambda w_i, w_j, b_i, b_j: (torch.cat([w_i, w_j]), torch.cat([b_i, b_j])))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        rows, segment = repeated_rows(inputs, attrs)
        hidden = rows.shape[1]
        weight, bias = self._weights(p)
        g = torch.addmm(bias, rows, weight.t())
        if untracked(rows, g):
            terms = torch.empty_like(rows)
            if _fused.usable(g, terms):
                gate_forward(g, terms)
            else:
                torch.mul(g[:, :hidden].sigmoid_(), _tanh_(g[:, hidden:]), out=terms)
            out = terms.new_zeros(attrs.shape[0], hidden) if out is None else out.zero_()
            out.index_add_(0, segment, terms)
        else:
            g = torch.cat([torch.sigmoid(g[:, :hidden]), fast_tanh(g[:, hidden:])], dim=1)
            terms = g[:, :hidden] * g[:, hidden:]
            y = terms.new_zeros(attrs.shape[0], hidden).index_add(0, segment, terms)
            out = y if out is None else out.copy_(y)
        if save is not None:
            save.update(rows=rows, segment=segment, gates=g, sizes=[x.shape[0] for x in inputs])
        return out

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        g, rows = saved.gates, saved.rows
        hidden = rows.shape[1]
        d = torch.empty_like(g)
        if _fused.usable(grad, g, d):
            gate_backward(grad, saved.segment, g, d)
        else:
            x, (s, t) = grad.index_select(0, saved.segment), g.split(hidden, 1)
            d_i, d_j = d[:, :hidden], d[:, hidden:]
            SIGMOID_GRAD(torch.mul(x, t, out=d_i), s, grad_input=d_i)
            TANH_GRAD_INTO(x.mul_(s), t, grad_input=d_j)
        g_w, bias = d.t() @ rows, d.sum(0)
        grads.add("W_i", g_w[:hidden])
        grads.add("W_j", g_w[hidden:])
        grads.add("b_i", bias[:hidden])
        grads.add("b_j", bias[hidden:])
        d_rows = d @ self._weights(p)[0]
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
ggnn_readout, ggnn_loss, ggnn_sq_err = GGNNReadout.kernel, GGNNLoss.kernel, GGNNSqErr.kernel
