"""Split LSTM cell kernels for input-projection hoisting (:mod:`~edbatch.executor._hoist`).

An LSTM cell's gate pre-activation ``W [x; h] + b`` has two parts: ``W_x x + b``, which reads
only operands that do not depend on the recurrence (a word embedding, a lower layer's
output), and ``W_h h``, which reads the previous state. With hoisting, the executor computes
the first part for many nodes of a cell type in one *projection* step (one large GEMM) and
each batch of the cell adds only the recurrent GEMM (``addmm``), as a hand-batched
``nn.LSTM`` does over a packed sequence. Both halves have hand-written backwards: the
projection's weight gradient is the column block ``W[:, :width(x)]``, the cell's the block
``W[:, width(x):]`` (:meth:`~edbatch.executor.kernels.ParamGrads.linear` with ``start``).

An LSTM cell kind declares its hoisting by name (``hoist = Hoist(project, LSTMRecurrent,
hoisted=("x",), state="state", weight="W")``, :class:`~edbatch.executor.cell_kind.Hoist`):
the projection is one of the unregistered kinds below, the recurrent half a subclass of
:class:`LSTMRecurrent` made for the cell; defining the cell kind fills :data:`HOISTS`
(the BiLSTM tagger's four recurrences, the Lattice-LSTM arcs, seq2seq's encoder and decoder
steps). The element-wise part is :func:`~edbatch.executor.cells.lstm_step`'s, in the same
order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._attr_checks import embedding
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.cell_kind import HEAD_READS, HOISTS, CellKind, HoistSpec, Param, RoleGrads
from edbatch.executor.cells import lstm_step_backward, split_state
from edbatch.executor.kernels import fast_tanh
from edbatch.graph import OpType

__all__ = ["HEAD_READS", "HOISTS", "ArcProject", "HoistSpec", "L1Project", "L2Project",
           "LSTMRecurrent", "Seq2SeqProject", "arc_project", "l1_project", "l2_project",
           "lattice_dims", "lstm_dims", "lstm_from_gates", "seq2seq_project"]


def lstm_dims(op: OpType) -> dict[str, int]:
    """``H`` of an LSTM cell with output ``[h; c]``, ``X`` (``= 2 H1``) its first operand's
    width."""
    if not op.in_shapes:
        return {"H": math.prod(op.out_shape) // 2}
    x = math.prod(op.in_shapes[0])
    return {"H": math.prod(op.out_shape) // 2, "X": x, "H1": x // 2}


def lattice_dims(op: OpType) -> dict[str, int]:
    """``H`` of an LSTM cell with output ``[h; c]`` that reads its input from ``attrs``."""
    return {"H": math.prod(op.out_shape) // 2}


def _projection_dims(op: OpType) -> dict[str, int]:
    """The cell's symbols for its projection op type (``<kind>.projection``: output ``4H``,
    the hoisted operands), or for the cell's own op type."""
    if not op.kind.endswith(".projection"):
        return lstm_dims(op)
    if not op.in_shapes:
        return {"H": math.prod(op.out_shape) // 4}
    x = math.prod(op.in_shapes[0])
    return {"H": math.prod(op.out_shape) // 4, "X": x, "H1": x // 2}


def _token_projection_dims(op: OpType) -> dict[str, int]:
    """``H`` of a projection that reads only its token (or of its cell's op type)."""
    return {"H": math.prod(op.out_shape) // (4 if op.kind.endswith(".projection") else 2)}


def lstm_from_gates(g: Tensor, c: Tensor, out: Tensor | None = None,
                    save: dict[str, Tensor] | None = None, state: Tensor | None = None
                    ) -> Tensor:
    """The element-wise part of :func:`~edbatch.executor.cells.lstm_step` from the gate
    pre-activations ``g`` (``[B, 4H]``, order ``i f o u``), written into ``out``; saves
    ``gates, u, c, t``. The gate sigmoids are computed in place in ``g`` (a projection row
    block that no other batch reads), ``c'`` and ``h'`` straight into ``out`` (no ``cat``).
    Fused (:mod:`~edbatch.executor._fused`): one kernel, ``gates`` saved as the whole ``g``;
    ``state``: the ``[h; c]`` that ``c`` is the second half of (read faster)."""
    hidden = c.shape[1]
    if out is None:
        out = g.new_empty((g.shape[0], 2 * hidden))
    if _fused.cell_usable(g, c, out, state if state is not None else c):
        t = g.new_empty((g.shape[0], hidden))
        _fused.lstm_forward(g, c, out, t, state)
        if save is not None:
            save.update(gates=g, u=g[:, 3 * hidden:], c=c, t=t)
        return out
    # split_with_sizes, not ``g[:, a:b]``: one dispatch for all pieces, and a multi-dim
    # ``__getitem__`` costs several us of Python per slice (7 of them per batch before)
    gates, g_u = g.split_with_sizes((3 * hidden, hidden), 1)
    i, f, o = gates.sigmoid_().split_with_sizes((hidden, hidden, hidden), 1)
    u = fast_tanh(g_u)
    h_out, c_out = out.split_with_sizes((hidden, hidden), 1)
    c2 = torch.mul(f, c, out=c_out).addcmul_(i, u)
    t = fast_tanh(c2)
    torch.mul(o, t, out=h_out)
    if save is not None:
        save.update(gates=gates, u=u, c=c, t=t)
    return out


def _recurrent(weight: Tensor, hidden: int) -> tuple[Tensor, int]:
    """``(W_h, start)``: the last ``hidden`` columns of the gate weight and where they start."""
    start = weight.shape[1] - hidden
    return weight[:, start:], start


class LSTMRecurrent(CellKind):
    """The recurrent half of an LSTM cell kind whose gate weight is the parameter
    ``weight``: operands ``(state [h; c], projection W_x x + b)``,
    ``g = projection + h W_h^T``. A subclass per cell kind is made by its ``hoist``
    declaration (same parameters and symbols, ``weight`` set).

    Unlike the registered kinds it writes into its projection operand (the rows of the
    hoisted projection arena that only this batch reads): ``addmm_`` and the gate sigmoids
    run in place there, saving a ``[B, 4H]`` copy and allocation per batch."""

    weight: ClassVar[str] = "W"
    inputs = ("state", "projection")
    saves = ("xh", "gates", "u", "c", "t")  # xh: h, the recurrent matmul's input

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        state, projection = inputs
        h, c = split_state(state)
        weight = getattr(p, self.weight)
        w_ht = TRANSPOSED(weight, weight.shape[1] - h.shape[1])
        if save is not None:
            save["xh"] = h
        # in place: each projection row is read by exactly this batch (and saved by nothing)
        return lstm_from_gates(projection.addmm_(h, w_ht), c, out, save, state)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        w_h, start = _recurrent(getattr(p, self.weight), saved.xh.shape[1])
        d_gates, d_state = lstm_step_backward(saved, grad, w_h)
        grads.linear((self.weight,), d_gates, saved.xh, start)
        return [d_state, d_gates]


def _projection(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor | None) -> Tensor:
    """``W[:, :width(x)] x + b`` (the input block of the gate weight), into ``out``."""
    if out is None:
        return F.linear(x, weight[:, :x.shape[1]], bias)
    return torch.addmm(bias, x, weight[:, :x.shape[1]].t(), out=out)


def _input_grad(d_proj: Tensor, weight: Tensor, width: int) -> Tensor:
    return d_proj @ weight[:, :width]


# ---------------------------------------------------------------------- BiLSTM tagger
class L1Project(CellKind, registry=None):
    """Layer 1: ``W_x x_t + b`` for operand ``x_t``."""

    inputs = ("x",)
    params = (Param("W", "4H, X+H"), Param("b", "4H"))
    saves = ("x",)
    dims = staticmethod(_projection_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        if save is not None:
            save["x"] = inputs[0]
        return _projection(inputs[0], p.W, p.b, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        grads.linear(("W", "b"), grad, saved.x)
        return [_input_grad(grad, p.W, saved.x.shape[1])]


class L2Project(CellKind, registry=None):
    """Layer 2: ``W_x [h(f1_t); h(b1_t)] + b`` for operands ``(f1_t, b1_t)``: their states
    ``[h; c]``, or only their ``h`` columns (the hoisted program's reads, ``heads``), or
    one operand ``[h(f1_t); h(b1_t)]`` (its pair read, ``_hoist.HeadPairRead``)."""

    inputs = ("f1", "b1")
    params = (Param("W", "4H, 2*H1+H"), Param("b", "4H"))
    saves = ("x",)
    dims = staticmethod(_projection_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        half = (p.W.shape[1] - p.W.shape[0] // 4) // 2  # the layer-1 hidden size
        x = inputs[0] if len(inputs) == 1 else torch.cat(  # one operand: both h already
            [v if v.shape[1] == half else split_state(v)[0] for v in inputs[:2]], dim=1)
        if save is not None:
            save["x"] = x
        return _projection(x, p.W, p.b, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        x = saved.x
        grads.linear(("W", "b"), grad, x)
        dx = _input_grad(grad, p.W, x.shape[1])
        if op.in_shapes is not None and len(op.in_shapes) == 1:
            return [dx]  # one operand [h(f1_t); h(b1_t)] (the hoisted program's pair read)
        half = x.shape[1] // 2
        return [dx[:, :half], dx[:, half:]]  # the leading h of f1_t's and b1_t's state rows


# ---------------------------------------------------------------------- Lattice-LSTM
class ArcProject(CellKind, registry=None):
    """Lattice-LSTM arc: ``W_x emb[token] + b`` (no operands: the token is the attr)."""

    inputs = ()
    params = (Param("emb", "V, D", init="embedding"), Param("W", "4H, D+H"), Param("b", "4H"))
    saves = ("x",)
    dims = staticmethod(_token_projection_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        x = embedding(attrs, p.emb)
        if save is not None:
            save["x"] = x
        return _projection(x, p.W, p.b, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        x = saved.x
        grads.linear(("W", "b"), grad, x)
        grads.rows("emb", attrs, _input_grad(grad, p.W, x.shape[1]))
        return []


# ---------------------------------------------------------------------- seq2seq
class Seq2SeqProject(CellKind, registry=None):
    """seq2seq step: ``W_x tanh(W_e emb[token] + b_e) + b`` (no operands)."""

    inputs = ()
    params = (Param("emb", "V, D", init="embedding"), Param("W_e", "X, D"), Param("b_e", "X"),
              Param("W", "4H, X+H"), Param("b", "4H"))
    saves = ("e", "x")
    dims = staticmethod(_token_projection_dims)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: dict[str, Tensor] | None = None) -> Tensor:
        e = embedding(attrs, p.emb)
        x = fast_tanh(F.linear(e, p.W_e, p.b_e))
        if save is not None:
            save.update(e=e, x=x)
        return _projection(x, p.W, p.b, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        e, x = saved.e, saved.x
        grads.linear(("W", "b"), grad, x)
        dz = _input_grad(grad, p.W, x.shape[1]) * (1.0 - x * x)
        grads.linear(("W_e", "b_e"), dz, e)
        grads.rows("emb", attrs, dz @ p.W_e)
        return []


#: The projection kernels, under the names they had as functions.
l1_project = L1Project.kernel
l2_project = L2Project.kernel
arc_project = ArcProject.kernel
seq2seq_project = Seq2SeqProject.kernel
