"""Cell kernels of the sequence workloads: Lattice-LSTM/GRU, the BiLSTM tagger and seq2seq.

Each kernel follows the equations in its workload's module docstring
(:mod:`edbatch.workloads.lattice`, :mod:`~edbatch.workloads.bilstm_tagger`,
:mod:`~edbatch.workloads.seq2seq`) and reads its parameters by position in ``op.params``.
The lattices' ``sum{k}`` op types have kind ``"sum"`` (a primitive kernel); start and zero
states use :func:`~edbatch.executor.cells.zero_state`, losses over one state
:func:`~edbatch.executor.cells.state_loss`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.cells import (
    gru_step,
    lstm_step,
    lstm_step_backward,
    lstm_step_xh,
    split_state,
    state_loss,
    zero_state,
)
from edbatch.executor.kernels import (
    KERNELS,
    ParamGrads,
    fast_tanh,
    lookup,
    op_params,
    pick_nll,
    pick_nll_backward,
    with_backward,
    writes_out,
)
from edbatch.graph import OpType

__all__ = ["bilstm_l1", "bilstm_l2", "bilstm_loss", "lattice_gru_arc", "lattice_lstm_arc",
           "seq2seq_step"]

for _kind in ("lattice_lstm.start", "lattice_gru.start", "bilstm.zero_state",
              "seq2seq.zero_state"):
    KERNELS.register(_kind)(zero_state)
for _kind in ("lattice_lstm.loss", "lattice_gru.loss", "seq2seq.loss"):
    KERNELS.register(_kind)(state_loss)
KERNELS.register("bilstm.lookup")(lookup)


# ---------------------------------------------------------------------- lattices
def _lattice_lstm_arc_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                               params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                               ) -> list[Tensor | None]:
    emb, weight, _ = op.params
    d_gates, d_in = lstm_step_backward(saved, grad, params[weight])
    acc.linear(op.params[1:], d_gates, saved[0])
    width = params[emb].shape[1]
    acc.rows(emb, attrs, d_in[:, :width])
    return [d_in[:, width:]]


@with_backward(_lattice_lstm_arc_backward)
@writes_out
def lattice_lstm_arc(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                     attrs: Tensor, out: Tensor | None = None,
                     save: list[Tensor] | None = None) -> Tensor:
    """LSTM arc: ``x = emb[token]``, one LSTM step from the source state ``[h; c]``."""
    emb, weight, bias = op_params(op, params, 3)
    h, c = split_state(inputs[0])
    return lstm_step(F.embedding(attrs, emb), h, c, weight, bias, out, save)


def lattice_gru_arc(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                    attrs: Tensor) -> Tensor:
    """GRU arc: ``x = emb[token]``, one GRU step from the source state ``h``."""
    emb, w_rz, b_rz, w_c, b_c = op_params(op, params, 5)
    return gru_step(F.embedding(attrs, emb), inputs[0], w_rz, b_rz, w_c, b_c)


for _arc in ("char_arc", "word_arc"):
    KERNELS.register(f"lattice_lstm.{_arc}")(lattice_lstm_arc)
    KERNELS.register(f"lattice_gru.{_arc}")(lattice_gru_arc)


# ---------------------------------------------------------------------- BiLSTM tagger
def _bilstm_l1_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                        params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                        ) -> list[Tensor | None]:
    d_gates, d_in = lstm_step_backward(saved, grad, params[op.params[0]])
    acc.linear(op.params, d_gates, saved[0])
    width = d_in.shape[1] - grad.shape[1]  # x's width
    return [d_in[:, :width], d_in[:, width:]]


@with_backward(_bilstm_l1_backward)
@writes_out
def bilstm_l1(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor, out: Tensor | None = None,
              save: list[Tensor] | None = None) -> Tensor:
    """Layer-1 LSTM step: operands ``(x_t, previous state [h; c])``."""
    weight, bias = op_params(op, params, 2)
    h, c = split_state(inputs[1])
    return lstm_step(inputs[0], h, c, weight, bias, out, save)


def _bilstm_l2_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                        params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                        ) -> list[Tensor | None]:
    d_gates, d_in = lstm_step_backward(saved, grad, params[op.params[0]])
    acc.linear(op.params, d_gates, saved[0])
    half = (d_in.shape[1] - grad.shape[1]) // 2  # the layer-1 hidden size
    return [d_in[:, :half], d_in[:, half:2 * half], d_in[:, 2 * half:]]  # h(f1), h(b1), state


@with_backward(_bilstm_l2_backward)
@writes_out
def bilstm_l2(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor, out: Tensor | None = None,
              save: list[Tensor] | None = None) -> Tensor:
    """Layer-2 LSTM step: operands ``(f1_t, b1_t, previous state)``; input ``[h(f1); h(b1)]``
    (``f1_t``, ``b1_t``: states ``[h; c]`` or only their ``h`` columns, the executor's
    :func:`~edbatch.executor._hoist.head_reads`)."""
    weight, bias = op_params(op, params, 2)
    h, c = split_state(inputs[2])
    half = (weight.shape[1] - h.shape[1]) // 2  # the layer-1 hidden size
    xh = torch.cat([v if v.shape[1] == half else split_state(v)[0] for v in inputs[:2]] + [h],
                   dim=1)
    return lstm_step_xh(xh, c, weight, bias, out, save)


for _dir in ("fwd", "bwd"):
    KERNELS.register(f"bilstm.l1_{_dir}")(bilstm_l1)
    KERNELS.register(f"bilstm.l2_{_dir}")(bilstm_l2)


def _bilstm_loss_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                          params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                          ) -> list[Tensor | None]:
    x, a, logits = saved
    d_logits = pick_nll_backward(logits, attrs, grad)
    acc.linear(op.params[2:], d_logits, a)
    dz = (d_logits @ params[op.params[2]]) * (1.0 - a * a)
    acc.linear(op.params[:2], dz, x)
    dx = dz @ params[op.params[0]]
    half = dx.shape[1] // 2
    return [dx[:, :half], dx[:, half:]]  # the leading h of each state row


@KERNELS.register("bilstm.loss")
@with_backward(_bilstm_loss_backward)
def bilstm_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor, save: list[Tensor] | None = None) -> Tensor:
    """``pick_nll(O tanh(H [h(f2); h(b2)] + b_H) + b_O, tag)`` for operands ``(f2, b2)``:
    their states ``[h; c]`` or only their ``h`` columns (the executor's
    :func:`~edbatch.executor._hoist.head_reads`)."""
    w_hidden, b_hidden, w_out, b_out = op_params(op, params, 4)
    half = w_hidden.shape[1] // 2
    x = torch.cat([v if v.shape[1] == half else split_state(v)[0] for v in inputs[:2]], dim=1)
    a = fast_tanh(F.linear(x, w_hidden, b_hidden))
    logits = F.linear(a, w_out, b_out)
    if save is not None:
        save += [x, a, logits]
    return pick_nll(logits, attrs)


# ---------------------------------------------------------------------- seq2seq
def _seq2seq_step_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                           params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                           ) -> list[Tensor | None]:
    e, x = saved[:2]
    d_gates, d_in = lstm_step_backward(saved[2:], grad, params[op.params[3]])
    acc.linear(op.params[3:], d_gates, saved[2])
    dz = d_in[:, :x.shape[1]] * (1.0 - x * x)
    acc.linear(op.params[1:3], dz, e)
    acc.rows(op.params[0], attrs, dz @ params[op.params[1]])
    return [d_in[:, x.shape[1]:]]


@KERNELS.register("seq2seq.enc")
@KERNELS.register("seq2seq.dec")
@with_backward(_seq2seq_step_backward)
@writes_out
def seq2seq_step(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                 attrs: Tensor, out: Tensor | None = None,
                 save: list[Tensor] | None = None) -> Tensor:
    """Encoder / decoder step: ``x = tanh(E2H emb[token] + b)``, then one LSTM step."""
    emb, w_e2h, b_e2h, weight, bias = op_params(op, params, 5)
    h, c = split_state(inputs[0])
    e = F.embedding(attrs, emb)
    x = fast_tanh(F.linear(e, w_e2h, b_e2h))
    if save is not None:
        save += [e, x]
    return lstm_step(x, h, c, weight, bias, out, save)
