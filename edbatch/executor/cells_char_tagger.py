"""Cell kind of the char-BiLSTM tagger (:mod:`edbatch.workloads.bilstm_char_tagger`).

Its LSTM steps, lookups, zero states and tag loss reuse the BiLSTM tagger's kinds
(``bilstm.l1_fwd``/``bilstm.l1_bwd`` with their hoisted input projection, ``lookup``,
``bilstm.zero_state``, ``bilstm.loss``, :mod:`~edbatch.executor.cells_seq`); the one new kind
is the composition of a rare word from its character BiLSTM:
``char_tagger.compose(f, b) = [h(f); h(b)]``, the ``h`` halves of the final forward and
backward character states (DyNet's ``concatenate([fw[-1], bw[-1]])``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from edbatch.executor.cell_kind import CellKind, RoleGrads
from edbatch.executor.cells_seq import heads
from edbatch.graph import OpType

__all__ = ["CharCompose", "char_tagger_compose"]


class CharCompose(CellKind):
    """``[h(f); h(b)]`` for operands ``(f, b)``: the final character states ``[h; c]`` of a
    word's forward and backward character LSTMs (or only their ``h`` columns, the executor's
    :func:`~edbatch.executor._hoist.head_reads`). No parameters."""

    kind = "char_tagger.compose"
    inputs = ("f", "b")
    head_reads = ("f", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        return torch.cat(heads(inputs[:2], op.out_shape[0] // 2), dim=1)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        half = grad.shape[1] // 2
        return [grad[:, :half], grad[:, half:]]  # the leading h of each state row


#: The registered kernel.
char_tagger_compose = CharCompose.kernel
