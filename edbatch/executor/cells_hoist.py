"""Split LSTM cell kernels for input-projection hoisting (:mod:`~edbatch.executor._hoist`).

An LSTM cell's gate pre-activation ``W [x; h] + b`` has two parts: ``W_x x + b``, which reads
only operands that do not depend on the recurrence (a word embedding, a lower layer's
output), and ``W_h h``, which reads the previous state. With hoisting, the executor computes
the first part for many nodes of a cell type in one *projection* step (one large GEMM) and
each batch of the cell adds only the recurrent GEMM (``addmm``), as a hand-batched
``nn.LSTM`` does over a packed sequence. Both halves have hand-written backwards: the
projection's weight gradient is the column block ``W[:, :width(x)]``, the cell's the block
``W[:, width(x):]`` (:meth:`~edbatch.executor.kernels.ParamGrads.linear` with ``start``).

A :class:`HoistSpec` per op kind says which operands the projection reads, which operand is
the recurrent state and where the weight sits in ``op.params``; :data:`HOISTS` holds the
LSTM cells of the sequence workloads (the BiLSTM tagger's four recurrences, the Lattice-LSTM
arcs, seq2seq's encoder and decoder steps). The element-wise part is
:func:`~edbatch.executor.cells.lstm_step`'s, in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.cells import lstm_step_backward, split_state
from edbatch.executor.kernels import (
    Kernel,
    ParamGrads,
    fast_tanh,
    op_params,
    with_backward,
    writes_out,
)
from edbatch.graph import OpType

__all__ = ["HEAD_READS", "HOISTS", "HoistSpec", "hoisted_cell", "lstm_from_gates"]


@dataclass(frozen=True)
class HoistSpec:
    """How to split one LSTM cell kind into a projection and a recurrent step.

    Attributes:
        hoisted: operand slots the projection reads (none: it reads only ``attrs``).
        state: operand slot of the recurrent state ``[h; c]``.
        weight: position of the gate weight ``W`` (``(4H, in + H)``) in ``op.params``.
        project: kernel ``(op, hoisted operands, params, attrs) -> [B, 4H]`` computing
            ``W_x x + b`` (with a hand-written backward).
        cell: kernel ``(op, (state, projection), params, attrs) -> [B, 2H]``.
        heads: the hoisted operands are LSTM states ``[h; c]`` of which ``project`` reads
            only ``h``: the projection step then gathers the ``h`` columns alone (half the
            bytes, no slicing and re-packing of full rows; ``project`` also accepts the
            full rows).
    """

    hoisted: tuple[int, ...]
    state: int
    weight: int
    project: Kernel
    cell: Kernel
    heads: bool = False

    @staticmethod
    def gate_width(op: OpType) -> int:
        """``4H`` for an LSTM cell whose output is the state ``[h; c]`` (``2H``)."""
        return 2 * math.prod(op.out_shape)


def lstm_from_gates(g: Tensor, c: Tensor, out: Tensor | None = None,
                    save: list[Tensor] | None = None) -> Tensor:
    """The element-wise part of :func:`~edbatch.executor.cells.lstm_step` from the gate
    pre-activations ``g`` (``[B, 4H]``, order ``i f o u``), written into ``out``; appends
    ``gates, u, c, t``. The gate sigmoids are computed in place in ``g`` (a projection row
    block that no other batch reads), ``c'`` and ``h'`` straight into ``out`` (no ``cat``)."""
    hidden = c.shape[1]
    if out is None:
        out = g.new_empty((g.shape[0], 2 * hidden))
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
        save += [gates, u, c, t]
    return out


def _recurrent(weight: Tensor, hidden: int) -> tuple[Tensor, int]:
    """``(W_h, start)``: the last ``hidden`` columns of the gate weight and where they start."""
    start = weight.shape[1] - hidden
    return weight[:, start:], start


def hoisted_cell(weight_index: int) -> Kernel:
    """The recurrent half of an LSTM cell whose weight is ``op.params[weight_index]``:
    operands ``(state [h; c], projection W_x x + b)``, ``g = projection + h W_h^T``.

    Unlike the registered kernels it writes into its projection operand (the rows of the
    hoisted projection arena that only this batch reads): ``addmm_`` and the gate sigmoids
    run in place there, saving a ``[B, 4H]`` copy and allocation per batch."""

    def backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                 params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                 ) -> list[Tensor | None]:
        weight_name = op.params[weight_index]
        w_h, start = _recurrent(params[weight_name], saved[0].shape[1])
        d_gates, d_state = lstm_step_backward(saved, grad, w_h)
        acc.linear((weight_name,), d_gates, saved[0], start)
        return [d_state, d_gates]

    @with_backward(backward)
    @writes_out
    def cell(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
             attrs: Tensor, out: Tensor | None = None,
             save: list[Tensor] | None = None) -> Tensor:
        state, projection = inputs
        h, c = split_state(state)
        weight = params[op.params[weight_index]]
        w_ht = TRANSPOSED(weight, weight.shape[1] - h.shape[1])
        if save is not None:
            save.append(h)
        # in place: each projection row is read by exactly this batch (and saved by nothing)
        return lstm_from_gates(projection.addmm_(h, w_ht), c, out, save)

    return cell


def _projection(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor | None) -> Tensor:
    """``W[:, :width(x)] x + b`` (the input block of the gate weight), into ``out``."""
    if out is None:
        return F.linear(x, weight[:, :x.shape[1]], bias)
    return torch.addmm(bias, x, weight[:, :x.shape[1]].t(), out=out)


def _input_grad(d_proj: Tensor, weight: Tensor, width: int) -> Tensor:
    return d_proj @ weight[:, :width]


# ---------------------------------------------------------------------- BiLSTM tagger
def _l1_project_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                         params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                         ) -> list[Tensor | None]:
    (x,) = saved
    acc.linear(op.params, grad, x)
    return [_input_grad(grad, params[op.params[0]], x.shape[1])]


@with_backward(_l1_project_backward)
@writes_out
def l1_project(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor, out: Tensor | None = None,
               save: list[Tensor] | None = None) -> Tensor:
    """Layer 1: ``W_x x_t + b`` for operand ``x_t``."""
    weight, bias = op_params(op, params, 2)
    if save is not None:
        save.append(inputs[0])
    return _projection(inputs[0], weight, bias, out)


def _l2_project_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                         params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                         ) -> list[Tensor | None]:
    (x,) = saved
    acc.linear(op.params, grad, x)
    dx = _input_grad(grad, params[op.params[0]], x.shape[1])
    half = x.shape[1] // 2
    return [dx[:, :half], dx[:, half:]]  # the leading h of f1_t's and b1_t's state rows


@with_backward(_l2_project_backward)
@writes_out
def l2_project(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor, out: Tensor | None = None,
               save: list[Tensor] | None = None) -> Tensor:
    """Layer 2: ``W_x [h(f1_t); h(b1_t)] + b`` for operands ``(f1_t, b1_t)``: their states
    ``[h; c]``, or only their ``h`` columns (the hoisted program's reads, ``heads``)."""
    weight, bias = op_params(op, params, 2)
    half = (weight.shape[1] - weight.shape[0] // 4) // 2  # the layer-1 hidden size
    x = torch.cat([v if v.shape[1] == half else split_state(v)[0] for v in inputs[:2]], dim=1)
    if save is not None:
        save.append(x)
    return _projection(x, weight, bias, out)


# ---------------------------------------------------------------------- Lattice-LSTM
def _arc_project_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                          params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                          ) -> list[Tensor | None]:
    (x,) = saved
    acc.linear(op.params[1:], grad, x)
    acc.rows(op.params[0], attrs, _input_grad(grad, params[op.params[1]], x.shape[1]))
    return []


@with_backward(_arc_project_backward)
@writes_out
def arc_project(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor, out: Tensor | None = None,
                save: list[Tensor] | None = None) -> Tensor:
    """Lattice-LSTM arc: ``W_x emb[token] + b`` (no operands: the token is the attr)."""
    emb, weight, bias = op_params(op, params, 3)
    x = F.embedding(attrs, emb)
    if save is not None:
        save.append(x)
    return _projection(x, weight, bias, out)


# ---------------------------------------------------------------------- seq2seq
def _seq2seq_project_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                              params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                              ) -> list[Tensor | None]:
    e, x = saved
    acc.linear(op.params[3:], grad, x)
    dz = _input_grad(grad, params[op.params[3]], x.shape[1]) * (1.0 - x * x)
    acc.linear(op.params[1:3], dz, e)
    acc.rows(op.params[0], attrs, dz @ params[op.params[1]])
    return []


@with_backward(_seq2seq_project_backward)
@writes_out
def seq2seq_project(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                    attrs: Tensor, out: Tensor | None = None,
                    save: list[Tensor] | None = None) -> Tensor:
    """seq2seq step: ``W_x tanh(E2H emb[token] + b_e) + b`` (no operands)."""
    emb, w_e2h, b_e2h, weight, bias = op_params(op, params, 5)
    e = F.embedding(attrs, emb)
    x = fast_tanh(F.linear(e, w_e2h, b_e2h))
    if save is not None:
        save += [e, x]
    return _projection(x, weight, bias, out)


def _specs() -> dict[str, HoistSpec]:
    specs: dict[str, HoistSpec] = {}
    make: Callable[[int], Kernel] = hoisted_cell
    for d in ("fwd", "bwd"):
        specs[f"bilstm.l1_{d}"] = HoistSpec((0,), 1, 0, l1_project, make(0))
        specs[f"bilstm.l2_{d}"] = HoistSpec((0, 1), 2, 0, l2_project, make(0), heads=True)
    for arc in ("char_arc", "word_arc"):
        specs[f"lattice_lstm.{arc}"] = HoistSpec((), 0, 1, arc_project, make(1))
    for step in ("enc", "dec"):
        specs[f"seq2seq.{step}"] = HoistSpec((), 0, 3, seq2seq_project, make(3))
    return specs


#: Op kind -> how its cell splits into a hoisted projection and a recurrent step.
HOISTS: dict[str, HoistSpec] = _specs()

#: Op kind -> operand slots holding LSTM states ``[h; c]`` of which its registered kernel
#: reads only ``h`` (and accepts the ``h`` columns alone): the executor's inference reads
#: gather just those columns (:func:`~edbatch.executor._hoist.head_reads`), as a projection
#: with ``heads`` does.
HEAD_READS: dict[str, tuple[int, ...]] = {
    "bilstm.l2_fwd": (0, 1), "bilstm.l2_bwd": (0, 1), "bilstm.loss": (0, 1)}
