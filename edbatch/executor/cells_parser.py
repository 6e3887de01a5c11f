"""Cell kinds of the transition parser (``transition_parser``, Kiperwasser & Goldberg 2016).

The equations are in :mod:`edbatch.workloads.transition_parser`. The BiLSTM reuses the
tagger's LSTM steps (:class:`~edbatch.executor.cells_seq.BiLSTML1` /
:class:`~edbatch.executor.cells_seq.BiLSTML2`, with their hand backwards and hoisted input
projections) and the shared :class:`~edbatch.executor.cells.ZeroState` under the parser's
own kind names; the root and padding vectors are the built-in ``lookup`` kind. New here:

* :class:`ParserEmbed`: ``[E_w[word]; E_p[upos]]`` from one attr ``word * P + upos``;
* :class:`ParserFeat`: a word's BiLSTM feature ``[h_fwd; h_bwd]`` (reads only ``h``);
* :class:`ParserStep`: the transition MLP ``W_o tanh(W_h [v_1; ..; v_k] + b_h) + b_o`` over
  the feature vectors of the configuration's stack and buffer items, and the cross-entropy
  of the gold transition (attr) as the loss. :func:`transition_scores` is the same MLP
  without the loss, for decoding.

Every kind has a hand-written backward, so training runs the executor's analytic path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from edbatch.executor._attr_checks import check_range, embedding
from edbatch.executor._weights import linear_t
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import ZeroState
from edbatch.executor.cells_seq import BiLSTML1, BiLSTML2, heads, mlp_nll, mlp_nll_backward
from edbatch.graph import OpType

__all__ = ["ParserEmbed", "ParserFeat", "ParserL1", "ParserL2", "ParserStep", "ParserZero",
           "side_by_side", "transition_scores"]


class ParserZero(ZeroState):
    """The zero initial state of each BiLSTM direction."""

    kind = "parser.zero_state"


class ParserL1(BiLSTML1):
    """First BiLSTM layer: the tagger's layer-1 step on the word's embedding."""

    kind = ("parser.l1_fwd", "parser.l1_bwd")


class ParserL2(BiLSTML2):
    """Second BiLSTM layer: the tagger's layer-2 step on ``[h(f1); h(b1)]``."""

    kind = ("parser.l2_fwd", "parser.l2_bwd")


class ParserEmbed(CellKind):
    """``[E_w[a // P]; E_p[a % P]]`` for attr ``a = word * P + upos`` (no operands)."""

    kind = "parser.embed"
    inputs = ()
    params = (Param("E_w", "V, DW", init="embedding"), Param("E_p", "P, DP", init="embedding"))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        tags = p.E_p.shape[0]
        words = p.E_w.shape[0]
        check_range(attrs, words * tags, "attr", f"{words} words x {tags} tags",
                    f"its attr must be word * {tags} + tag, the word a row of E_w")
        return torch.cat([embedding(torch.div(attrs, tags, rounding_mode="floor"), p.E_w),
                          embedding(attrs % tags, p.E_p)], dim=1)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        tags, width = p.E_p.shape[0], p.E_w.shape[1]
        grads.rows("E_w", torch.div(attrs, tags, rounding_mode="floor"), grad[:, :width])
        grads.rows("E_p", attrs % tags, grad[:, width:])
        return []


class ParserFeat(CellKind):
    """``[h(f); h(b)]`` of a word's last-layer forward and backward states ``[h; c]`` (or
    only their ``h`` columns, the executor's head reads)."""

    kind = "parser.feat"
    inputs = ("f", "b")
    head_reads = ("f", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        return torch.cat(heads(inputs, op.out_shape[0] // 2), dim=1)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        half = grad.shape[1] // 2
        return [grad[:, :half], grad[:, half:]]  # the leading h of each state row


def transition_scores(features: Sequence[Tensor], w_h: Tensor, b_h: Tensor, w_o: Tensor,
                      b_o: Tensor) -> Tensor:
    """``W_o tanh(W_h [v_1; ..; v_k] + b_h) + b_o``: ``[B, A]`` transition scores, each
    product by the weight's contiguous ``W^T`` (:func:`~edbatch.executor._weights.linear_t`:
    cached for a run; ``[50, 800] x [800, 100]`` then ``[50, 100] x [100, 103]``: 87 against
    115 us with ``F.linear``'s strided ``W^T``, 1 thread)."""
    return linear_t(torch.tanh(linear_t(side_by_side(features), w_h, b_h)), w_o, b_o)


def side_by_side(parts: Sequence[Tensor]) -> Tensor:
    """``torch.cat(parts, dim=1)``, or without a copy the one ``[B, sum of widths]`` tensor
    the ``[B, w]`` parts are consecutive column blocks of (the operand rows of a direct
    round gathered one instance after another: :mod:`edbatch.api._direct`)."""
    first = parts[0]
    if len(parts) > 1 and first.dim() == 2:
        width, rows, dtype = first.stride(0), first.shape[0], first.dtype
        start = at = first.data_ptr()
        size = first.element_size()
        for p in parts:
            if p.stride() != (width, 1) or p.data_ptr() != at or p.dtype is not dtype or \
                    p.shape[0] != rows:
                break
            at += p.shape[1] * size
        else:
            if at == start + width * size:  # (the blocks fill the rows)
                return first.as_strided((rows, width), (width, 1))
    return torch.cat(list(parts), dim=1)


class ParserStep(CellKind):
    """``-log softmax(scores)[gold]`` of one transition, ``[B, 1]``: the scores of
    :func:`transition_scores` over the ``k`` feature operands, the gold class as attr."""

    kind = "parser.step"
    params = (Param("W_h", "M, K"), Param("b_h", "M"), Param("W_o", "A, M"), Param("b_o", "A"))
    saves = ("x", "a", "logits")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        return mlp_nll(torch.cat(list(inputs), dim=1), p, attrs, save, tanh=torch.tanh)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        dx = mlp_nll_backward(saved, grad, p, attrs, grads)
        return list(dx.split([s[0] for s in op.in_shapes or ()], dim=1))
