"""Cell kinds of the sparsely gated MoE tagger (:mod:`edbatch.workloads.moe`).

Each kind calls the workload's own functions (:func:`~edbatch.workloads.moe.gate_logits`,
:func:`~edbatch.workloads.moe.expert_ffn`, :func:`~edbatch.workloads.moe.combine`), so the
graph builder's routing, the executor and the references compute the same thing. Plain
autograd code (no hand-written backward). The word embedding is the built-in ``lookup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from edbatch.executor._attr_checks import check_range
from edbatch.executor.cell_kind import CellKind, Param
from edbatch.executor.kernels import pick_nll
from edbatch.graph import OpType
from edbatch.workloads._moe_math import combine, expert_ffn, gate_logits, unpack_choice

__all__ = ["MoECombine", "MoEExpert", "MoEGate", "MoELoss"]


class MoEGate(CellKind):
    """Noisy gate logits ``H = x W^T + n * softplus(x W_noise^T)``; the attr is the noise
    key (``-1``: ``n = 0``)."""

    kind = "moe.gate"
    inputs = ("x",)
    params = (Param("W", "E, D"), Param("W_noise", "E, D"))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return gate_logits(inputs[0], p.W, p.W_noise, attrs)


class MoEExpert(CellKind):
    """One expert's feed-forward network ``W2 relu(W1 x + b1) + b2``."""

    kind = "moe.expert"
    inputs = ("x",)
    params = (Param("W1", "F, D"), Param("b1", "F"), Param("W2", "D, F"), Param("b2", "D"))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return expert_ffn(inputs[0], p.W1, p.b1, p.W2, p.b2)


class MoECombine(CellKind):
    """``x + sum_j softmax(H[a])_j e_j`` over operands ``(H, x, e_1..e_k)``; the attr packs
    the chosen experts ``a`` (:func:`~edbatch.workloads.moe.pack_choice`)."""

    kind = "moe.combine"

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        logits, x, outs = inputs[0], inputs[1], inputs[2:]
        check_range(attrs, logits.shape[1] ** len(outs), "packed choice", f"{len(outs)} of "
                    f"{logits.shape[1]} experts", "make it with edbatch.workloads.moe.pack_choice")
        chosen = unpack_choice(attrs, logits.shape[1], len(outs))
        return combine(logits, x, outs, chosen)


class MoELoss(CellKind):
    """Cross-entropy of ``W x + b`` against the tag in the attr; output ``(1,)``."""

    kind = "moe.loss"
    inputs = ("x",)
    params = (Param("W", "C, D"), Param("b", "C"))

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return pick_nll(F.linear(inputs[0], p.W, p.b), attrs)
