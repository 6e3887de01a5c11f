"""Cell kinds of the CLEVR module network (:mod:`edbatch.workloads.module_net`).

One :class:`~edbatch.executor.cell_kind.CellKind` per module *family*; each module type
(``filter_color[red]``, ``relate[left]``, ...) is an op type of its family's kind with
parameters of its own, and every op type has fixed shapes, so the nodes of one module type
batch together whatever question they come from. There are no images: a scene is the
``(N * F,)`` stack of its objects' feature rows (see the workload's docstring), an attention
is ``(N,)`` and a terminal module's output ``(H,)``.

``module_net.objects`` is a batchable *variadic* op type (``in_shapes is None``): operand
slot ``k`` of a batch holds the ``k``-th object of every node that has more than ``k`` of
them, in the batch's row order, and a node's attr is its number of objects (the convention
of :mod:`edbatch.api._variadic`). All kinds are autograd code (no hand-written backward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.cell_kind import CellKind, Param
from edbatch.graph import OpType
from edbatch.workloads.module_net import (
    ATTRIBUTE_ROWS,
    COUNT_BINS,
    MAX_OBJECTS,
    VOCAB_SIZES,
    XY_OFFSET,
    XY_RADIX,
)

__all__ = ["Answer", "Compare", "Count", "EqualObject", "Filter", "Intersect", "Object",
           "Objects", "Query", "Relate", "Same", "Start", "Union", "Unique", "answer_logits"]

_P = "module_net"


def _scene(t: Tensor) -> Tensor:
    """``(B, N * F)`` -> ``(B, N, F)``."""
    return t.reshape(t.shape[0], MAX_OBJECTS, -1)


def _features(op: OpType) -> int:
    """``F``: the width of an object row (from the scene operand, slot 1)."""
    assert op.in_shapes is not None
    return op.in_shapes[1][0] // MAX_OBJECTS


def _pairs(att: Tensor, score: Tensor, mask: Tensor) -> Tensor:
    """``out_j = mask_j sum_{i != j} att_i sig(score_ij)`` for ``score (B, N, N)``."""
    off = 1.0 - torch.eye(MAX_OBJECTS, dtype=score.dtype, device=score.device)
    return torch.bmm(att.unsqueeze(1), torch.sigmoid(score) * off).squeeze(1) * mask


class Object(CellKind):
    """An object's row ``[1, one-hot attributes, E[size] + E[colour] + E[material] +
    E[shape], x, y]``, decoded from its packed attr (``E``: one table, a block of rows per
    attribute)."""

    kind = f"{_P}.object"
    inputs = ()
    params = (Param("E", "V, D", init="embedding"),)
    dims = staticmethod(lambda op: {"V": ATTRIBUTE_ROWS,
                                    "D": op.out_shape[0] - 3 - ATTRIBUTE_ROWS})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        code, offset = attrs.reshape(-1), 0
        rows = []
        for size in VOCAB_SIZES:
            rows.append(offset + torch.remainder(code, size))
            code, offset = torch.div(code, size, rounding_mode="floor"), offset + size
        index = torch.stack(rows, dim=1)
        e = F.embedding(index, p.E).sum(dim=1)
        onehot = e.new_zeros(len(code), ATTRIBUTE_ROWS).scatter_(1, index, 1.0)
        parts = [torch.ones_like(e[:, :1]), onehot, e]
        for _ in range(2):
            xy = torch.remainder(code, XY_RADIX)
            parts.append(((xy - XY_OFFSET).to(e.dtype) / 100).unsqueeze(1))
            code = torch.div(code, XY_RADIX, rounding_mode="floor")
        return torch.cat(parts, dim=1)


class Objects(CellKind):
    """A scene: its objects' rows stacked into ``(N * F,)``, zero rows after the last."""

    kind = f"{_P}.objects"

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        out = inputs[0].new_zeros(attrs.shape[0], MAX_OBJECTS, inputs[0].shape[1])
        for k, slot in enumerate(inputs):
            out[torch.nonzero(attrs > k).reshape(-1), k] = slot
        return out.reshape(attrs.shape[0], -1)


class Start(CellKind):
    """``scene``: the attention on every real object (the mask column)."""

    kind = f"{_P}.start"
    inputs = ("scene",)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return _scene(inputs[0])[:, :, 0]


class Filter(CellKind):
    """``filter_a[v]``: ``att * sig(f w + b)``."""

    kind = f"{_P}.filter"
    inputs = ("att", "scene")
    params = (Param("w", "F"), Param("b", "1"))
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        f = _scene(inputs[1])
        return inputs[0] * torch.sigmoid(f @ p.w + p.b)


class Relate(CellKind):
    """``relate[r]``: ``mask_j sum_{i != j} att_i sig(u . (f_j - f_i) + c)``."""

    kind = f"{_P}.relate"
    inputs = ("att", "scene")
    params = (Param("u", "F"), Param("c", "1"))
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        f = _scene(inputs[1])
        proj = f @ p.u
        score = proj.unsqueeze(1) - proj.unsqueeze(2) + p.c  # [b, i, j] = proj_j - proj_i
        return _pairs(inputs[0], score, f[:, :, 0])


class Same(CellKind):
    """``same_a``: ``mask_j sum_{i != j} att_i sig(f_i^T M f_j + c)``."""

    kind = f"{_P}.same"
    inputs = ("att", "scene")
    params = (Param("M", "F, F"), Param("c", "1"))
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        f = _scene(inputs[1])
        score = torch.bmm(f @ p.M, f.transpose(1, 2)) + p.c
        return _pairs(inputs[0], score, f[:, :, 0])


class Unique(CellKind):
    """``unique``: ``att / (sum att + 1e-3)``."""

    kind = f"{_P}.unique"
    inputs = ("att",)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return inputs[0] / (inputs[0].sum(dim=1, keepdim=True) + 1e-3)


class Union(CellKind):
    """``union``: ``a + b - a b``."""

    kind = f"{_P}.union"
    inputs = ("a", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        a, b = inputs
        return a + b - a * b


class Intersect(CellKind):
    """``intersect``: ``a b``."""

    kind = f"{_P}.intersect"
    inputs = ("a", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        return inputs[0] * inputs[1]


class Count(CellKind):
    """``count`` / ``exist``: ``tanh(W k(s) + b)``, ``k_m(s) = exp(-2 (s - m)^2)``,
    ``s = sum att``, ``m = 0..10``."""

    kind = f"{_P}.count"
    inputs = ("att",)
    params = (Param("W", "H, K"), Param("b", "H"))
    dims = staticmethod(lambda op: {"H": op.out_shape[0], "K": COUNT_BINS})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        s = inputs[0].sum(dim=1, keepdim=True)
        bins = torch.arange(COUNT_BINS, dtype=s.dtype, device=s.device)
        return torch.tanh(F.linear(torch.exp(-2.0 * (s - bins) ** 2), p.W, p.b))


class Query(CellKind):
    """``query_a``: ``tanh(W (sum_j att_j f_j) + b)``."""

    kind = f"{_P}.query"
    inputs = ("att", "scene")
    params = (Param("W", "H, F"), Param("b", "H"))
    dims = staticmethod(lambda op: {"H": op.out_shape[0], "F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        r = torch.bmm(inputs[0].unsqueeze(1), _scene(inputs[1])).squeeze(1)
        return torch.tanh(F.linear(r, p.W, p.b))


class Compare(CellKind):
    """``equal_a``, ``equal_integer``, ``less_than``, ``greater_than``:
    ``tanh(W [x; y; x * y] + b)``."""

    kind = f"{_P}.compare"
    inputs = ("x", "y")
    params = (Param("W", "H, 3H"), Param("b", "H"))
    dims = staticmethod(lambda op: {"H": op.out_shape[0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        x, y = inputs
        return torch.tanh(F.linear(torch.cat([x, y, x * y], dim=1), p.W, p.b))


class EqualObject(CellKind):
    """``equal_object``: ``tanh(W (sum_j a_j b_j) + b)``."""

    kind = f"{_P}.equal_object"
    inputs = ("a", "b")
    params = (Param("W", "H, 1"), Param("b", "H"))
    dims = staticmethod(lambda op: {"H": op.out_shape[0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        dot = (inputs[0] * inputs[1]).sum(dim=1, keepdim=True)
        return torch.tanh(F.linear(dot, p.W, p.b))


def answer_logits(h: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """The answer classifier's logits ``W h + b`` (``[B, answers]``)."""
    return F.linear(h, W, b)


class Answer(CellKind):
    """Cross-entropy ``logsumexp(W h + b) - (W h + b)[attr]`` (attr = the answer), ``[B, 1]``."""

    kind = f"{_P}.answer"
    inputs = ("h",)
    params = (Param("W", "A, H"), Param("b", "A"))
    dims = staticmethod(lambda op: {"H": op.in_shapes[0][0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor) -> Tensor:
        logits = answer_logits(inputs[0], p.W, p.b)
        gold = logits.gather(1, attrs.reshape(-1, 1))
        return torch.logsumexp(logits, dim=1, keepdim=True) - gold
