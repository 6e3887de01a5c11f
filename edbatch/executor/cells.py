"""Building blocks of the cell kinds: fused LSTM / GRU steps; the shared kinds (state
losses, zero states, lookups).

Each cell kind computes *exactly* what its workload's primitive-granularity graph computes
with the same parameters (same gate order, same operation order), only fused: one matmul for
all the gates that read the same input, then element-wise ops. The kinds are
:class:`~edbatch.executor.cell_kind.CellKind` classes, per workload family in
:mod:`edbatch.executor.cells_trees` (Tree-LSTM, Tree-GRU, MV-RNN) and
:mod:`edbatch.executor.cells_seq` (lattices, BiLSTM tagger, seq2seq); the kinds several
workloads share are here: :class:`StateLoss`, :class:`ZeroState` and :class:`Lookup`.

Cell states are flat rows: an LSTM state is ``[h; c]`` (``2H``), a GRU state is ``h``.
A hand-written backward reads what its forward saved by name (``saved.xh``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._attr_checks import embedding
from edbatch.executor._weights import linear_t
from edbatch.executor.cell_kind import HEAD_READS, CellKind, Param, RoleGrads
from edbatch.executor.kernels import (
    fast_tanh,
    new_zeros,
    pick_nll,
    pick_nll_backward,
    untracked,
)
from edbatch.graph import OpType

__all__ = ["LSTM_SAVES", "SIGMOID_GRAD", "TANH_GRAD", "TANH_GRAD_INTO", "Lookup", "StateLoss",
           "ZeroState", "gru_step", "lstm_step", "lstm_step_backward", "lstm_step_xh",
           "split_state", "state_loss", "zero_state"]

#: What :func:`lstm_step` saves for :func:`lstm_step_backward` (``xh``: the gate matmul's
#: input, ``gates``: ``sigmoid([i f o])``, ``u``, the old ``c`` and ``t = tanh(c')``).
LSTM_SAVES = ("xh", "gates", "u", "c", "t")


def split_state(state: Tensor) -> tuple[Tensor, Tensor]:
    """``(h, c)`` halves of LSTM states ``[B, 2H]``."""
    hidden = state.shape[1] // 2
    h, c = state.split_with_sizes((hidden, state.shape[1] - hidden), 1)
    return h, c


def lstm_step(x: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
              out: Tensor | None = None, save: dict[str, Tensor] | None = None,
              state: Tensor | None = None) -> Tensor:
    """One fused LSTM step; return the new states ``[h'; c']`` as ``[B, 2H]`` (into ``out``).

    ``[i f o u] = W [x; h] + b``; ``i, f, o = sigmoid(.)``, ``u = tanh(.)``;
    ``c' = f*c + i*u`` (one ``addcmul``); ``h' = o*tanh(c')`` (the order of
    :func:`~edbatch.workloads.primitives.emit_lstm`). With ``save``, puts what
    :func:`lstm_step_backward` reads under the names :data:`LSTM_SAVES`. ``state``: the
    ``[h; c]`` that ``h`` and ``c`` split (lets the fused kernel read ``c`` faster).
    """
    return lstm_step_xh(torch.cat([x, h], dim=1), c, weight, bias, out, save, state)


def lstm_step_xh(xh: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
                 out: Tensor | None = None, save: dict[str, Tensor] | None = None,
                 state: Tensor | None = None) -> Tensor:
    """:func:`lstm_step` from the concatenated input ``[x; h]`` (a caller that assembles
    its input from several operands builds it with one ``cat``)."""
    hidden = c.shape[1]
    g = linear_t(xh, weight, bias)
    if untracked(xh, c, weight, bias):  # the same arithmetic in place, into ``out``
        if out is None:
            out = torch.empty(g.shape[0], 2 * hidden, dtype=g.dtype, device=g.device)
        if _fused.cell_usable(g, c, out, state if state is not None else c):
            t = g.new_empty((g.shape[0], hidden))  # one compiled kernel, gates: all of g
            _fused.lstm_forward(g, c, out, t, state)
            if save is not None:
                save.update(xh=xh, gates=g, u=g[:, 3 * hidden:], c=c, t=t)
            return out
        gates, g_u = g.split_with_sizes((3 * hidden, hidden), 1)
        i, f, o = gates.sigmoid_().split_with_sizes((hidden, hidden, hidden), 1)
        u = fast_tanh(g_u)
        if out is None:
            out = torch.empty(g.shape[0], 2 * hidden, dtype=g.dtype, device=g.device)
        h_out, c_out = out.split_with_sizes((hidden, hidden), 1)
        c2 = torch.mul(f, c, out=c_out).addcmul_(i, u)
        t = fast_tanh(c2)
        torch.mul(o, t, out=h_out)
        if save is not None:
            save.update(xh=xh, gates=gates, u=u, c=c, t=t)
        return out
    gates = torch.sigmoid(g[:, :3 * hidden])
    i, f, o = gates.split_with_sizes((hidden, hidden, hidden), 1)
    u = fast_tanh(g[:, 3 * hidden:])
    c2 = torch.addcmul(f * c, i, u)
    t = fast_tanh(c2)
    if save is not None:
        save.update(xh=xh, gates=gates, u=u, c=c, t=t)
    return torch.cat([o * t, c2], dim=1, out=out)


#: Fused derivative kernels of the backwards: ``grad * y * (1 - y)`` and
#: ``grad * (1 - y * y)`` from the activation's output ``y``, in one launch each (the
#: ``grad_input`` overloads write into a given tensor, which may be ``grad`` itself).
SIGMOID_GRAD = torch.ops.aten.sigmoid_backward.grad_input
TANH_GRAD = torch.ops.aten.tanh_backward.default
TANH_GRAD_INTO = torch.ops.aten.tanh_backward.grad_input


def lstm_step_backward(saved: Any, grad: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of :func:`lstm_step` from its saved tensors (by the names
    :data:`LSTM_SAVES`) and ``d[h'; c']``.

    Returns ``(d_gates, d[x; h; c])``; the weight gradient is ``d_gates^T [x; h]``.
    """
    xh, gates, u, c, t = saved.xh, saved.gates, saved.u, saved.c, saved.t
    batch, hidden = u.shape
    width = xh.shape[1]
    if gates.shape[1] == 4 * hidden:  # a fused forward's: all of g (its last H are u)
        if _fused.cell_usable(grad, gates, c, t):  # one compiled kernel, then the matmul
            d_gates = torch.empty(batch, 4 * hidden, dtype=u.dtype, device=u.device)
            d_in = torch.empty(batch, width + hidden, dtype=u.dtype, device=u.device)
            _fused.lstm_backward(grad, gates, c, t, d_gates, d_in, width)
            torch.mm(d_gates, weight, out=d_in[:, :width])
            return d_gates, d_in
        gates = gates[:, :3 * hidden]
    i, f, o = gates.split_with_sizes((hidden, hidden, hidden), 1)
    dh, d_c = grad.split_with_sizes((hidden, hidden), 1)
    dc2 = TANH_GRAD(dh * o, t).add_(d_c)
    d_gates = torch.empty(batch, 4 * hidden, dtype=u.dtype, device=u.device)
    d_sig, d_u = d_gates.split_with_sizes((3 * hidden, hidden), 1)
    d_i, d_f, d_o = d_sig.split_with_sizes((hidden, hidden, hidden), 1)
    torch.mul(dc2, u, out=d_i)
    torch.mul(dc2, c, out=d_f)
    torch.mul(dh, t, out=d_o)
    SIGMOID_GRAD(d_sig, gates, grad_input=d_sig)
    TANH_GRAD_INTO(dc2 * i, u, grad_input=d_u)
    d_in = torch.empty(batch, width + hidden, dtype=u.dtype, device=u.device)
    d_x, d_cin = d_in.split_with_sizes((width, hidden), 1)
    torch.mm(d_gates, weight, out=d_x)
    torch.mul(dc2, f, out=d_cin)
    return d_gates, d_in


def gru_step(x: Tensor, h: Tensor, w_rz: Tensor, b_rz: Tensor, w_c: Tensor,
             b_c: Tensor) -> Tensor:
    """One GRU step; return ``h'`` as ``[B, H]``.

    ``[r z] = sigmoid(W_rz [x; h] + b_rz)``; ``c = tanh(W_c [x; r*h] + b_c)``;
    ``h' = z*h + (1 - z)*c`` (the order of :func:`~edbatch.workloads.primitives.emit_gru`).
    """
    hidden = h.shape[1]
    rz = torch.sigmoid(F.linear(torch.cat([x, h], dim=1), w_rz, b_rz))
    r, z = rz[:, :hidden], rz[:, hidden:]
    cand = fast_tanh(F.linear(torch.cat([x, r * h], dim=1), w_c, b_c))
    return z * h + (1.0 - z) * cand


class StateLoss(CellKind):
    """``-log_softmax(W h + b)[label]`` where ``h`` leads the state row.

    ``h`` is the first ``W.shape[1]`` entries of the operand, so one kind serves ``[h; c]``
    LSTM states, ``h`` GRU states and MV-RNN's ``[v; vec(M)]``.
    """

    kind = ("tree_lstm.loss", "tree_gru.loss", "mvrnn.loss", "lattice_lstm.loss",
            "lattice_gru.loss", "seq2seq.loss")
    inputs = ("state",)
    params = (Param("W", "C, K"), Param("b", "C"))
    saves = ("h", "logits")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        h = inputs[0][:, :p.W.shape[1]]
        logits = F.linear(h, p.W, p.b)
        if save is not None:
            save.update(h=h, logits=logits)
        return pick_nll(logits, attrs)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        d_logits = pick_nll_backward(saved.logits, attrs, grad)
        grads.linear(("W", "b"), d_logits, saved.h)
        return [d_logits @ p.W]  # the leading h of the state row


class ZeroState(CellKind):
    """The zero initial state of a recurrence, one row per node (in the parameters' dtype)."""

    kind = ("lattice_lstm.start", "lattice_gru.start", "bilstm.zero_state",
            "seq2seq.zero_state")
    inputs = ()

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None,
                params: Mapping[str, Tensor] | None = None) -> Tensor:
        return new_zeros(attrs.shape[0], math.prod(op.out_shape), params or {}, attrs)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        return []


class Lookup(CellKind):
    """Row ``attr`` of the embedding table (``ValueError`` naming an id outside it)."""

    kind = ("lookup", "bilstm.lookup")
    inputs = ()
    params = (Param("table", "V, D", init="embedding"),)

    @staticmethod
    def dims(op: OpType) -> dict[str, int]:
        return {"D": math.prod(op.out_shape)}

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        if out is None:
            return embedding(attrs, p.table)
        if untracked(p.table) and out.is_contiguous() and out.dtype == p.table.dtype:
            try:
                return torch.index_select(p.table, 0, attrs, out=out)
            except IndexError:
                return out.copy_(embedding(attrs, p.table))  # (its error names the id)
        return out.copy_(embedding(attrs, p.table))

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        grads.rows("table", attrs, grad)
        return []


#: The registered kernels of the shared kinds (the names the kernels had as functions).
state_loss = StateLoss.kernel

# Of StateLoss's kinds, the LSTM ones read only the leading h of their [h; c] state, half its
# width: the executor's inference reads gather just those columns (_hoist.head_reads). Not a
# class-wide ``head_reads``: the head reads take half the operand's width, which is the h of
# an LSTM state only (a GRU state is h alone, MV-RNN's [v; vec(M)] not two halves).
for _kind in ("tree_lstm.loss", "lattice_lstm.loss"):
    HEAD_READS[_kind] = (0,)
zero_state = ZeroState.kernel
lookup = Lookup.kernel
