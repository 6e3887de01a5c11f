"""Cell kinds of the sequence workloads: Lattice-LSTM/GRU, the BiLSTM tagger and seq2seq.

Each :class:`~edbatch.executor.cell_kind.CellKind` follows the equations in its workload's
module docstring (:mod:`edbatch.workloads.lattice`, :mod:`~edbatch.workloads.bilstm_tagger`,
:mod:`~edbatch.workloads.seq2seq`) and reads its parameters by their declared names. The
lattices' ``sum{k}`` op types have kind ``"sum"`` (a primitive kernel); start and zero
states are :class:`~edbatch.executor.cells.ZeroState`, losses over one state
:class:`~edbatch.executor.cells.StateLoss`, the tagger's lookup
:class:`~edbatch.executor.cells.Lookup`. The LSTM kinds declare their hoisted input
projection (:mod:`~edbatch.executor.cells_hoist`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor._attr_checks import embedding
from edbatch.executor.cell_kind import CellKind, Hoist, Param, RoleGrads
from edbatch.executor.cells import (
    LSTM_SAVES,
    gru_step,
    lstm_step,
    lstm_step_backward,
    lstm_step_xh,
    split_state,
)
from edbatch.executor.cells_hoist import (
    ArcProject,
    L1Project,
    L2Project,
    LSTMRecurrent,
    Seq2SeqProject,
    lattice_dims,
    lstm_dims,
)
from edbatch.executor.kernels import fast_tanh, pick_nll, pick_nll_backward
from edbatch.graph import OpType

__all__ = ["BiLSTML1", "BiLSTML2", "BiLSTMLoss", "LatticeGRUArc", "LatticeLSTMArc",
           "Seq2SeqStep", "bilstm_l1", "bilstm_l2", "bilstm_loss", "lattice_gru_arc",
           "lattice_lstm_arc", "seq2seq_step"]


# ---------------------------------------------------------------------- lattices
class LatticeLSTMArc(CellKind):
    """LSTM arc: ``x = emb[token]``, one LSTM step from the source state ``[h; c]``."""

    kind = ("lattice_lstm.char_arc", "lattice_lstm.word_arc")
    inputs = ("state",)
    params = (Param("emb", "V, D", init="embedding"), Param("W", "4H, D+H"), Param("b", "4H"))
    saves = LSTM_SAVES
    dims = staticmethod(lattice_dims)
    hoist = Hoist(ArcProject, LSTMRecurrent, hoisted=(), state="state", weight="W")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        h, c = split_state(inputs[0])
        return lstm_step(embedding(attrs, p.emb), h, c, p.W, p.b, out, save, inputs[0])

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        d_gates, d_in = lstm_step_backward(saved, grad, p.W)
        grads.linear(("W", "b"), d_gates, saved.xh)
        width = p.emb.shape[1]
        grads.rows("emb", attrs, d_in[:, :width])
        return [d_in[:, width:]]


class LatticeGRUArc(CellKind):
    """GRU arc: ``x = emb[token]``, one GRU step from the source state ``h``."""

    kind = ("lattice_gru.char_arc", "lattice_gru.word_arc")
    inputs = ("state",)
    params = (Param("emb", "V, D", init="embedding"), Param("W_rz", "2H, D+H"),
              Param("b_rz", "2H"), Param("W_c", "H, D+H"), Param("b_c", "H"))

    @staticmethod
    def dims(op: OpType) -> dict[str, int]:
        return {"H": math.prod(op.out_shape)}

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return gru_step(embedding(attrs, p.emb), inputs[0], p.W_rz, p.b_rz, p.W_c, p.b_c)


# ---------------------------------------------------------------------- BiLSTM tagger
class BiLSTML1(CellKind):
    """Layer-1 LSTM step: operands ``(x_t, previous state [h; c])``."""

    kind = ("bilstm.l1_fwd", "bilstm.l1_bwd")
    inputs = ("x", "state")
    params = (Param("W", "4H, X+H"), Param("b", "4H"))
    saves = LSTM_SAVES
    dims = staticmethod(lstm_dims)
    hoist = Hoist(L1Project, LSTMRecurrent, hoisted=("x",), state="state", weight="W")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        h, c = split_state(inputs[1])
        return lstm_step(inputs[0], h, c, p.W, p.b, out, save, inputs[1])

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        d_gates, d_in = lstm_step_backward(saved, grad, p.W)
        grads.linear(("W", "b"), d_gates, saved.xh)
        width = d_in.shape[1] - grad.shape[1]  # x's width
        return [d_in[:, :width], d_in[:, width:]]


def heads(inputs: Sequence[Tensor], half: int) -> list[Tensor]:
    """The ``h`` columns of LSTM states ``[h; c]`` (operands already ``half`` wide as is)."""
    return [v if v.shape[1] == half else split_state(v)[0] for v in inputs]


class BiLSTML2(CellKind):
    """Layer-2 LSTM step: operands ``(f1_t, b1_t, previous state)``; input ``[h(f1); h(b1)]``
    (``f1_t``, ``b1_t``: states ``[h; c]`` or only their ``h`` columns, the executor's
    :func:`~edbatch.executor._hoist.head_reads`)."""

    kind = ("bilstm.l2_fwd", "bilstm.l2_bwd")
    inputs = ("f1", "b1", "state")
    params = (Param("W", "4H, 2*H1+H"), Param("b", "4H"))
    saves = LSTM_SAVES
    head_reads = ("f1", "b1")
    dims = staticmethod(lstm_dims)
    hoist = Hoist(L2Project, LSTMRecurrent, hoisted=("f1", "b1"), state="state", weight="W",
                  heads=True)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        h, c = split_state(inputs[2])
        half = (p.W.shape[1] - h.shape[1]) // 2  # the layer-1 hidden size
        xh = torch.cat([*heads(inputs[:2], half), h], dim=1)
        return lstm_step_xh(xh, c, p.W, p.b, out, save, inputs[2])

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        d_gates, d_in = lstm_step_backward(saved, grad, p.W)
        grads.linear(("W", "b"), d_gates, saved.xh)
        half = (d_in.shape[1] - grad.shape[1]) // 2  # the layer-1 hidden size
        return [d_in[:, :half], d_in[:, half:2 * half], d_in[:, 2 * half:]]


class BiLSTMLoss(CellKind):
    """``pick_nll(W_o tanh(W_h [h(f2); h(b2)] + b_h) + b_o, tag)`` for operands ``(f2, b2)``:
    their states ``[h; c]`` or only their ``h`` columns (the executor's
    :func:`~edbatch.executor._hoist.head_reads`), or one operand ``[h(f2); h(b2)]`` already
    side by side (an inference pair read, :class:`~edbatch.executor._head_reads.HeadPairRead`)."""

    kind = "bilstm.loss"
    inputs = ("f2", "b2")
    params = (Param("W_h", "M, 2H"), Param("b_h", "M"), Param("W_o", "C, M"), Param("b_o", "C"))
    saves = ("x", "a", "logits")
    head_reads = ("f2", "b2")

    @staticmethod
    def dims(op: OpType) -> dict[str, int]:
        return {"H": math.prod(op.in_shapes[0]) // 2} if op.in_shapes else {}

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        x = inputs[0] if len(inputs) == 1 else \
            torch.cat(heads(inputs[:2], p.W_h.shape[1] // 2), dim=1)  # one: the pair read
        return mlp_nll(x, p, attrs, save)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        dx = mlp_nll_backward(saved, grad, p, attrs, grads)
        half = dx.shape[1] // 2
        return [dx[:, :half], dx[:, half:]]  # the leading h of each state row


# ---------------------------------------------------------------------- seq2seq
class Seq2SeqStep(CellKind):
    """Encoder / decoder step: ``x = tanh(W_e emb[token] + b_e)``, then one LSTM step."""

    kind = ("seq2seq.enc", "seq2seq.dec")
    inputs = ("state",)
    params = (Param("emb", "V, D", init="embedding"), Param("W_e", "X, D"), Param("b_e", "X"),
              Param("W", "4H, X+H"), Param("b", "4H"))
    saves = ("e", "x", *LSTM_SAVES)
    dims = staticmethod(lattice_dims)
    hoist = Hoist(Seq2SeqProject, LSTMRecurrent, hoisted=(), state="state", weight="W")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        h, c = split_state(inputs[0])
        e = embedding(attrs, p.emb)
        x = fast_tanh(F.linear(e, p.W_e, p.b_e))
        if save is not None:
            save.update(e=e, x=x)
        return lstm_step(x, h, c, p.W, p.b, out, save, inputs[0])

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        x = saved.x
        d_gates, d_in = lstm_step_backward(saved, grad, p.W)
        grads.linear(("W", "b"), d_gates, saved.xh)
        dz = d_in[:, :x.shape[1]] * (1.0 - x * x)
        grads.linear(("W_e", "b_e"), dz, saved.e)
        grads.rows("emb", attrs, dz @ p.W_e)
        return [d_in[:, x.shape[1]:]]


#: The registered kernels, under the names they had as functions.
lattice_lstm_arc = LatticeLSTMArc.kernel
lattice_gru_arc = LatticeGRUArc.kernel
bilstm_l1 = BiLSTML1.kernel
bilstm_l2 = BiLSTML2.kernel
bilstm_loss = BiLSTMLoss.kernel
seq2seq_step = Seq2SeqStep.kernel


def mlp_nll(x: Tensor, p: Any, attrs: Tensor, save: dict[str, Tensor] | None,
            tanh: Any = fast_tanh) -> Tensor:
    """``-log softmax(W_o tanh(W_h x + b_h) + b_o)[attr]`` per row (the tagger's loss and the
    parser's transition scorer); ``save`` keeps ``x``, ``a`` and ``logits`` for
    :func:`mlp_nll_backward`."""
    a = tanh(F.linear(x, p.W_h, p.b_h))
    logits = F.linear(a, p.W_o, p.b_o)
    if save is not None:
        save.update(x=x, a=a, logits=logits)
    return pick_nll(logits, attrs)


def mlp_nll_backward(saved: Any, grad: Tensor, p: Any, attrs: Tensor, grads: RoleGrads
                     ) -> Tensor:
    """The hand backward of :func:`mlp_nll`: adds the weights' gradients, returns ``dx``."""
    a = saved.a
    d_logits = pick_nll_backward(saved.logits, attrs, grad)
    grads.linear(("W_o", "b_o"), d_logits, a)
    dz = (d_logits @ p.W_o) * (1.0 - a * a)
    grads.linear(("W_h", "b_h"), dz, saved.x)
    return dz @ p.W_h
