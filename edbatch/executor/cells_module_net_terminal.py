"""Terminal cell kinds of the CLEVR module network (:mod:`edbatch.executor.cells_module_net`
holds the attention modules): ``count`` / ``exist``, the comparisons, ``equal_object`` and the
answer classifier's loss. Each has a hand-written ``backward`` reading its saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import cells_module_net_terminal_fused as fused
from edbatch.executor._attr_checks import check_range
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import TANH_GRAD
from edbatch.graph import OpType
from edbatch.workloads.module_net import COUNT_BINS, MAX_OBJECTS

__all__ = ["Answer", "Compare", "Count", "EqualObject", "answer_logits"]

_P = "module_net"
Saves = dict[str, Tensor] | None
Grads = list[Tensor | None]


def _tanh(z: Tensor, out: Tensor | None) -> Tensor:
    """``tanh(z)`` into the arena region ``out`` when the executor gives one (its forward
    runs untracked), else a new tensor."""
    return torch.tanh_(z) if out is None else torch.tanh(z, out=out)


class Count(CellKind):
    """``count`` / ``exist``: ``tanh(W k(s) + b)``, ``k_m(s) = exp(-2 (s - m)^2)``,
    ``s = sum att``, ``m = 0..10``."""

    kind = f"{_P}.count"
    inputs = ("att",)
    params = (Param("W", "H, K"), Param("b", "H"))
    saves = ("diff", "k", "y")
    dims = staticmethod(lambda op: {"H": op.out_shape[0], "K": COUNT_BINS})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        if fused.usable(inputs[0], p.W, p.b):
            y, diff, k = fused.count_forward(inputs[0], p.W, p.b, out)
            if save is not None:
                save.update(diff=diff, k=k, y=y)
            return y
        s = inputs[0].sum(dim=1, keepdim=True)
        bins = torch.arange(COUNT_BINS, dtype=s.dtype, device=s.device)
        diff = s - bins
        k = torch.exp(-2.0 * diff ** 2)
        y = _tanh(F.linear(k, p.W, p.b), out)
        if save is not None:
            save.update(diff=diff, k=k, y=y)
        return y

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        if fused.usable(grad, saved.y, saved.k, saved.diff, p.W):
            dz, d_att = fused.count_backward(grad, saved.y, saved.k, saved.diff, p.W,
                                             MAX_OBJECTS)
            grads.linear(("W", "b"), dz, saved.k)
            return [d_att]
        dz = TANH_GRAD(grad, saved.y)
        grads.linear(("W", "b"), dz, saved.k)
        d_s = ((dz @ p.W) * saved.k * saved.diff).sum(dim=1, keepdim=True) * -4.0
        return [d_s.expand(len(d_s), MAX_OBJECTS)]


class Compare(CellKind):
    """``equal_a``, ``equal_integer``, ``less_than``, ``greater_than``:
    ``tanh(W [x; y; x * y] + b)``."""

    kind = f"{_P}.compare"
    inputs = ("x", "y")
    params = (Param("W", "H, 3H"), Param("b", "H"))
    saves = ("x", "y", "xy", "out")
    dims = staticmethod(lambda op: {"H": op.out_shape[0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        x, y = inputs
        if fused.usable(x, y, p.W, p.b):
            h, xy = fused.compare_forward(x, y, p.W, p.b, out)
            if save is not None:
                save.update(x=x, y=y, xy=xy, out=h)
            return h
        xy = torch.cat([x, y, x * y], dim=1)
        h = _tanh(F.linear(xy, p.W, p.b), out)
        if save is not None:
            save.update(x=x, y=y, xy=xy, out=h)
        return h

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        if fused.usable(grad, saved.out, saved.x, saved.y, p.W):
            dz, d_x, d_y = fused.compare_backward(grad, saved.out, saved.x, saved.y, p.W)
            grads.linear(("W", "b"), dz, saved.xy)
            return [d_x, d_y]
        dz = TANH_GRAD(grad, saved.out)
        grads.linear(("W", "b"), dz, saved.xy)
        d_x, d_y, d_xy = (dz @ p.W).chunk(3, dim=1)
        return [torch.addcmul(d_x, d_xy, saved.y), torch.addcmul(d_y, d_xy, saved.x)]


class EqualObject(CellKind):
    """``equal_object``: ``tanh(W (sum_j a_j b_j) + b)``."""

    kind = f"{_P}.equal_object"
    inputs = ("a", "b")
    params = (Param("W", "H, 1"), Param("b", "H"))
    saves = ("a", "b", "dot", "y")
    dims = staticmethod(lambda op: {"H": op.out_shape[0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        dot = (inputs[0] * inputs[1]).sum(dim=1, keepdim=True)
        y = _tanh(F.linear(dot, p.W, p.b), out)
        if save is not None:
            save.update(a=inputs[0], b=inputs[1], dot=dot, y=y)
        return y

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        dz = TANH_GRAD(grad, saved.y)
        grads.linear(("W", "b"), dz, saved.dot)
        d_dot = dz @ p.W
        return [d_dot * saved.b, d_dot * saved.a]


def answer_logits(h: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """The answer classifier's logits ``W h + b`` (``[B, answers]``)."""
    return F.linear(h, W, b)


class Answer(CellKind):
    """Cross-entropy ``logsumexp(W h + b) - (W h + b)[attr]`` (attr = the answer), ``[B, 1]``."""

    kind = f"{_P}.answer"
    inputs = ("h",)
    params = (Param("W", "A, H"), Param("b", "A"))
    saves = ("h", "logits", "lse")
    dims = staticmethod(lambda op: {"H": op.in_shapes[0][0]})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        check_range(attrs, p.W.shape[0], "answer", f"{p.W.shape[0]} answers",
                    "its attr must be an answer index")  # (the compiled loop reads logits[a])
        if fused.usable(inputs[0], p.W, p.b):
            loss, logits, lse = fused.answer_forward(inputs[0], p.W, p.b, attrs, out)
            if save is not None:
                save.update(h=inputs[0], logits=logits, lse=lse)
            return loss
        logits = answer_logits(inputs[0], p.W, p.b)
        gold = logits.gather(1, attrs.reshape(-1, 1))
        lse = torch.logsumexp(logits, dim=1, keepdim=True)
        if save is not None:
            save.update(h=inputs[0], logits=logits, lse=lse)
        return torch.sub(lse, gold, out=out) if out is not None else lse - gold

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        if fused.usable(grad, saved.logits, saved.lse, saved.h, p.W):
            d, d_h = fused.answer_backward(grad, saved.logits, saved.lse, attrs, p.W)
            grads.linear(("W", "b"), d, saved.h)
            return [d_h]
        d = torch.exp(saved.logits - saved.lse)
        d.scatter_add_(1, attrs.reshape(-1, 1), torch.full_like(saved.lse, -1.0))
        d.mul_(grad)
        grads.linear(("W", "b"), d, saved.h)
        return [d @ p.W]
