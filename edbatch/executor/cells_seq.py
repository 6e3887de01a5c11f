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

from edbatch.executor.cells import gru_step, lstm_step, split_state, state_loss, zero_state
from edbatch.executor.kernels import KERNELS, lookup, op_params, pick_nll, writes_out
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
@writes_out
def lattice_lstm_arc(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                     attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """LSTM arc: ``x = emb[token]``, one LSTM step from the source state ``[h; c]``."""
    emb, weight, bias = op_params(op, params, 3)
    h, c = split_state(inputs[0])
    return lstm_step(F.embedding(attrs, emb), h, c, weight, bias, out)


def lattice_gru_arc(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                    attrs: Tensor) -> Tensor:
    """GRU arc: ``x = emb[token]``, one GRU step from the source state ``h``."""
    emb, w_rz, b_rz, w_c, b_c = op_params(op, params, 5)
    return gru_step(F.embedding(attrs, emb), inputs[0], w_rz, b_rz, w_c, b_c)


for _arc in ("char_arc", "word_arc"):
    KERNELS.register(f"lattice_lstm.{_arc}")(lattice_lstm_arc)
    KERNELS.register(f"lattice_gru.{_arc}")(lattice_gru_arc)


# ---------------------------------------------------------------------- BiLSTM tagger
@writes_out
def bilstm_l1(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """Layer-1 LSTM step: operands ``(x_t, previous state [h; c])``."""
    weight, bias = op_params(op, params, 2)
    h, c = split_state(inputs[1])
    return lstm_step(inputs[0], h, c, weight, bias, out)


@writes_out
def bilstm_l2(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """Layer-2 LSTM step: operands ``(f1_t, b1_t, previous state)``; input ``[h(f1); h(b1)]``."""
    weight, bias = op_params(op, params, 2)
    h, c = split_state(inputs[2])
    x = torch.cat([split_state(inputs[0])[0], split_state(inputs[1])[0]], dim=1)
    return lstm_step(x, h, c, weight, bias, out)


for _dir in ("fwd", "bwd"):
    KERNELS.register(f"bilstm.l1_{_dir}")(bilstm_l1)
    KERNELS.register(f"bilstm.l2_{_dir}")(bilstm_l2)


@KERNELS.register("bilstm.loss")
def bilstm_loss(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    """``pick_nll(O tanh(H [h(f2); h(b2)] + b_H) + b_O, tag)`` for operands ``(f2, b2)``."""
    w_hidden, b_hidden, w_out, b_out = op_params(op, params, 4)
    x = torch.cat([split_state(inputs[0])[0], split_state(inputs[1])[0]], dim=1)
    return pick_nll(F.linear(torch.tanh(F.linear(x, w_hidden, b_hidden)), w_out, b_out), attrs)


# ---------------------------------------------------------------------- seq2seq
@KERNELS.register("seq2seq.enc")
@KERNELS.register("seq2seq.dec")
@writes_out
def seq2seq_step(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                 attrs: Tensor, out: Tensor | None = None) -> Tensor:
    """Encoder / decoder step: ``x = tanh(E2H emb[token] + b)``, then one LSTM step."""
    emb, w_e2h, b_e2h, weight, bias = op_params(op, params, 5)
    h, c = split_state(inputs[0])
    x = torch.tanh(F.linear(F.embedding(attrs, emb), w_e2h, b_e2h))
    return lstm_step(x, h, c, weight, bias, out)
