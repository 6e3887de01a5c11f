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

from edbatch.executor.kernels import new_zeros, op_params, pick_nll
from edbatch.graph import OpType

__all__ = ["gru_step", "lstm_step", "split_state", "state_loss", "zero_state"]


def split_state(state: Tensor) -> tuple[Tensor, Tensor]:
    """``(h, c)`` halves of LSTM states ``[B, 2H]``."""
    hidden = state.shape[1] // 2
    return state[:, :hidden], state[:, hidden:]


def lstm_step(x: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor,
              out: Tensor | None = None) -> Tensor:
    """One fused LSTM step; return the new states ``[h'; c']`` as ``[B, 2H]`` (into ``out``).

    ``[i f o u] = W [x; h] + b``; ``i, f, o = sigmoid(.)``, ``u = tanh(.)``;
    ``c' = f*c + i*u``; ``h' = o*tanh(c')`` (the order of
    :func:`~edbatch.workloads.primitives.emit_lstm`).
    """
    hidden = h.shape[1]
    g = F.linear(torch.cat([x, h], dim=1), weight, bias)
    gates = torch.sigmoid(g[:, :3 * hidden])
    i, f, o = gates[:, :hidden], gates[:, hidden:2 * hidden], gates[:, 2 * hidden:]
    u = torch.tanh(g[:, 3 * hidden:])
    c2 = f * c + i * u
    return torch.cat([o * torch.tanh(c2), c2], dim=1, out=out)


def gru_step(x: Tensor, h: Tensor, w_rz: Tensor, b_rz: Tensor, w_c: Tensor,
             b_c: Tensor) -> Tensor:
    """One GRU step; return ``h'`` as ``[B, H]``.

    ``[r z] = sigmoid(W_rz [x; h] + b_rz)``; ``c = tanh(W_c [x; r*h] + b_c)``;
    ``h' = z*h + (1 - z)*c`` (the order of :func:`~edbatch.workloads.primitives.emit_gru`).
    """
    hidden = h.shape[1]
    rz = torch.sigmoid(F.linear(torch.cat([x, h], dim=1), w_rz, b_rz))
    r, z = rz[:, :hidden], rz[:, hidden:]
    cand = torch.tanh(F.linear(torch.cat([x, r * h], dim=1), w_c, b_c))
    return z * h + (1.0 - z) * cand


def state_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
    """``-log_softmax(W_out h + b_out)[label]`` where ``h`` leads the state row.

    ``h`` is the first ``W_out.shape[1]`` entries of the operand, so one kernel serves
    ``[h; c]`` LSTM states, ``h`` GRU states and MV-RNN's ``[v; vec(M)]``.
    """
    weight, bias = op_params(op, params, 2)
    return pick_nll(F.linear(inputs[0][:, :weight.shape[1]], weight, bias), attrs)


def zero_state(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
    """The zero initial state of a recurrence, one row per node."""
    return new_zeros(attrs.shape[0], math.prod(op.out_shape), params, attrs)
