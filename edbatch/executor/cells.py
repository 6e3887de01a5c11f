"""Building blocks of the cell-level kernels: fused LSTM / GRU steps, state losses, zeros.

Each cell kernel computes *exactly* what its workload's primitive-granularity graph computes
with the same parameters (same gate order, same operation order), only fused: one matmul for
all the gates that read the same input, then element-wise ops. The kernels themselves are
registered per workload family in :mod:`edbatch.executor.cells_trees` (Tree-LSTM, Tree-GRU,
MV-RNN) and :mod:`edbatch.executor.cells_seq` (lattices, BiLSTM tagger, seq2seq).

Cell states are flat rows: an LSTM state is ``[h; c]`` (``2H``), a GRU state is ``h``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor._weights import linear_t
from edbatch.executor.kernels import (
    ParamGrads,
    fast_tanh,
    new_zeros,
    op_params,
    pick_nll,
    pick_nll_backward,
    untracked,
    with_backward,
)
from edbatch.graph import OpType

__all__ = ["SIGMOID_GRAD", "TANH_GRAD", "TANH_GRAD_INTO", "gru_step", "lstm_step",
           "lstm_step_backward", "lstm_step_xh", "split_state", "state_loss", "zero_state"]


def split_state(state: Tensor) -> tuple[Tensor, Tensor]:
    """``(h, c)`` halves of LSTM states ``[B, 2H]``."""
    hidden = state.shape[1] // 2
    h, c = state.split_with_sizes((hidden, state.shape[1] - hidden), 1)
    return h, c


def lstm_step(x: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
              out: Tensor | None = None, save: list[Tensor] | None = None) -> Tensor:
    """One fused LSTM step; return the new states ``[h'; c']`` as ``[B, 2H]`` (into ``out``).

    ``[i f o u] = W [x; h] + b``; ``i, f, o = sigmoid(.)``, ``u = tanh(.)``;
    ``c' = f*c + i*u`` (one ``addcmul``); ``h' = o*tanh(c')`` (the order of
    :func:`~edbatch.workloads.primitives.emit_lstm`). With ``save``, appends what
    :func:`lstm_step_backward` reads.
    """
    return lstm_step_xh(torch.cat([x, h], dim=1), c, weight, bias, out, save)


def lstm_step_xh(xh: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
                 out: Tensor | None = None, save: list[Tensor] | None = None) -> Tensor:
    """:func:`lstm_step` from the concatenated input ``[x; h]`` (a caller that assembles
    its input from several operands builds it with one ``cat``)."""
    hidden = c.shape[1]
    g = linear_t(xh, weight, bias)
    if untracked(xh, c, weight, bias):  # the same arithmetic in place, into ``out``
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
            save += [xh, gates, u, c, t]
        return out
    gates = torch.sigmoid(g[:, :3 * hidden])
    i, f, o = gates.split_with_sizes((hidden, hidden, hidden), 1)
    u = fast_tanh(g[:, 3 * hidden:])
    c2 = torch.addcmul(f * c, i, u)
    t = fast_tanh(c2)
    if save is not None:
        save += [xh, gates, u, c, t]
    return torch.cat([o * t, c2], dim=1, out=out)


#: Fused derivative kernels of the backwards: ``grad * y * (1 - y)`` and
#: ``grad * (1 - y * y)`` from the activation's output ``y``, in one launch each (the
#: ``grad_input`` overloads write into a given tensor, which may be ``grad`` itself).
SIGMOID_GRAD = torch.ops.aten.sigmoid_backward.grad_input
TANH_GRAD = torch.ops.aten.tanh_backward.default
TANH_GRAD_INTO = torch.ops.aten.tanh_backward.grad_input


def lstm_step_backward(saved: Sequence[Tensor], grad: Tensor, weight: Tensor
                       ) -> tuple[Tensor, Tensor]:
    """Backward of :func:`lstm_step` from its saved tensors and ``d[h'; c']``.

    Returns ``(d_gates, d[x; h; c])``; the weight gradient is ``d_gates^T [x; h]``.
    """
    xh, gates, u, c, t = saved
    batch, hidden = u.shape
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
    width = xh.shape[1]
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


def _state_loss_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                         params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                         ) -> list[Tensor | None]:
    h, logits = saved
    weight = params[op.params[0]]
    d_logits = pick_nll_backward(logits, attrs, grad)
    acc.linear(op.params, d_logits, h)
    return [d_logits @ weight]  # the leading h of the state row


@with_backward(_state_loss_backward)
def state_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``-log_softmax(W_out h + b_out)[label]`` where ``h`` leads the state row.

    ``h`` is the first ``W_out.shape[1]`` entries of the operand, so one kernel serves
    ``[h; c]`` LSTM states, ``h`` GRU states and MV-RNN's ``[v; vec(M)]``.
    """
    weight, bias = op_params(op, params, 2)
    h = inputs[0][:, :weight.shape[1]]
    logits = F.linear(h, weight, bias)
    if save is not None:
        save += [h, logits]
    return pick_nll(logits, attrs)


def _no_operands(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                 params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                 ) -> list[Tensor | None]:
    return []


@with_backward(_no_operands)
def zero_state(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """The zero initial state of a recurrence, one row per node."""
    return new_zeros(attrs.shape[0], math.prod(op.out_shape), params, attrs)
