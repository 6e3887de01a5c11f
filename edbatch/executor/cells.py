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

__all__ = ["gru_step", "lstm_step", "lstm_step_backward", "split_state", "state_loss",
           "zero_state"]


def split_state(state: Tensor) -> tuple[Tensor, Tensor]:
    """``(h, c)`` halves of LSTM states ``[B, 2H]``."""
    hidden = state.shape[1] // 2
    return state[:, :hidden], state[:, hidden:]


def lstm_step(x: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
              out: Tensor | None = None, save: list[Tensor] | None = None) -> Tensor:
    """One fused LSTM step; return the new states ``[h'; c']`` as ``[B, 2H]`` (into ``out``).

    ``[i f o u] = W [x; h] + b``; ``i, f, o = sigmoid(.)``, ``u = tanh(.)``;
    ``c' = f*c + i*u``; ``h' = o*tanh(c')`` (the order of
    :func:`~edbatch.workloads.primitives.emit_lstm`). With ``save``, appends what
    :func:`lstm_step_backward` reads.
    """
    hidden = h.shape[1]
    xh = torch.cat([x, h], dim=1)
    g = F.linear(xh, weight, bias)
    if untracked(xh, c, weight, bias):  # the same arithmetic in place, into ``out``
        gates = g[:, :3 * hidden].sigmoid_()
        u = fast_tanh(g[:, 3 * hidden:])
        if out is None:
            out = torch.empty(h.shape[0], 2 * hidden, dtype=g.dtype, device=g.device)
        c2 = torch.mul(gates[:, hidden:2 * hidden], c, out=out[:, hidden:])
        c2.add_(gates[:, :hidden] * u)  # not addcmul_: it fuses (FMA), other floats
        t = fast_tanh(c2)
        torch.mul(gates[:, 2 * hidden:], t, out=out[:, :hidden])
        if save is not None:
            save += [xh, gates, u, c, t]
        return out
    gates = torch.sigmoid(g[:, :3 * hidden])
    i, f, o = gates[:, :hidden], gates[:, hidden:2 * hidden], gates[:, 2 * hidden:]
    u = fast_tanh(g[:, 3 * hidden:])
    c2 = f * c + i * u
    t = fast_tanh(c2)
    if save is not None:
        save += [xh, gates, u, c, t]
    return torch.cat([o * t, c2], dim=1, out=out)


def lstm_step_backward(saved: Sequence[Tensor], grad: Tensor, weight: Tensor
                       ) -> tuple[Tensor, Tensor]:
    """Backward of :func:`lstm_step` from its saved tensors and ``d[h'; c']``.

    Returns ``(d_gates, d[x; h; c])``; the weight gradient is ``d_gates^T [x; h]``.
    """
    xh, gates, u, c, t = saved
    batch, hidden = u.shape
    i, f, o = gates[:, :hidden], gates[:, hidden:2 * hidden], gates[:, 2 * hidden:]
    dh = grad[:, :hidden]
    dc2 = torch.addcmul(grad[:, hidden:], dh * o, 1.0 - t * t)
    d_gates = torch.empty(batch, 4 * hidden, dtype=u.dtype, device=u.device)
    torch.mul(dc2, u, out=d_gates[:, :hidden])
    torch.mul(dc2, c, out=d_gates[:, hidden:2 * hidden])
    torch.mul(dh, t, out=d_gates[:, 2 * hidden:3 * hidden])
    d_gates[:, :3 * hidden].mul_(gates - gates * gates)
    torch.mul(dc2 * i, 1.0 - u * u, out=d_gates[:, 3 * hidden:])
    width = xh.shape[1]
    d_in = torch.empty(batch, width + hidden, dtype=u.dtype, device=u.device)
    torch.mm(d_gates, weight, out=d_in[:, :width])
    torch.mul(dc2, f, out=d_in[:, width:])
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
