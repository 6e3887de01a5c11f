"""Cell kinds of the CLEVR module network (:mod:`edbatch.workloads.module_net`).

One :class:`~edbatch.executor.cell_kind.CellKind` per module *family*; each module type
(``filter_color[red]``, ``relate[left]``, ...) is an op type of its family's kind with
parameters of its own, and every op type has fixed shapes, so the nodes of one module type
batch together whatever question they come from. There are no images: a scene is the
``(N * F,)`` stack of its objects' feature rows (see the workload's docstring), an attention
is ``(N,)`` and a terminal module's output ``(H,)``.

The scene-building kinds (``object``, ``objects``, ``start``) live in
:mod:`edbatch.executor.cells_module_net_scene`, the terminal ones (``count``, ``compare``,
``equal_object``, ``answer``) in :mod:`edbatch.executor.cells_module_net_terminal` (both
re-exported here).
``module_net.objects`` is a batchable *variadic* op type (``in_shapes is None``): operand
slot ``k`` of a batch holds the ``k``-th object of every node that has more than ``k`` of
them, in the batch's row order, and a node's attr is its number of objects (the convention
of :mod:`edbatch.api._variadic`). Every kind has a hand-written ``backward`` reading its
saves, so training runs :mod:`edbatch.executor._analytic` (no autograd graph per batch: the
many small batches of 41 module types made per-batch autograd the bulk of a training step);
``tests/executor/test_hand_backward.py`` and ``test_module_net_backward.py`` check them
against autograd in fp64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor import cells_module_net_fused as fused
from edbatch.executor import cells_module_net_terminal_fused as terminal
from edbatch.executor._reads import ArenaRows
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.cells import SIGMOID_GRAD, TANH_GRAD
from edbatch.executor.cells_module_net_scene import Object, Objects, Start
from edbatch.executor.cells_module_net_terminal import (
    Answer,
    Compare,
    Count,
    EqualObject,
    answer_logits,
)
from edbatch.graph import OpType
from edbatch.workloads.module_net import MAX_OBJECTS

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


Saves = dict[str, Tensor] | None
Grads = list[Tensor | None]


_OFF: dict[tuple[torch.dtype, torch.device], Tensor] = {}


def _off(like: Tensor) -> Tensor:
    """``1 - I`` (``N x N``), cached per dtype and device (one allocation per run)."""
    key = (like.dtype, like.device)
    off = _OFF.get(key)
    if off is None:
        off = _OFF[key] = 1.0 - torch.eye(MAX_OBJECTS, dtype=like.dtype, device=like.device)
    return off


def _pairs(att: Tensor, score: Tensor, mask: Tensor, save: Saves = None,
           out: Tensor | None = None) -> Tensor:
    """``out_j = mask_j sum_{i != j} att_i sig(score_ij)`` for ``score (B, N, N)``."""
    s_off = torch.sigmoid_(score) * _off(score)  # score: the caller's temporary
    t = torch.bmm(att.unsqueeze(1), s_off).squeeze(1)
    if save is not None:
        save.update(att=att, sg=s_off, t=t)
    return torch.mul(t, mask, out=out) if out is not None else t * mask


def _pairs_backward(saved: Any, grad: Tensor, f: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(d att, d score, d mask)`` of :func:`_pairs` (``f``: the ``(B, N, F)`` scene).
    ``saved.sg`` is ``sig(score)`` with a zero diagonal, so ``sig'`` through it is
    ``sig (1 - sig)`` off the diagonal and 0 on it, as the masked product needs."""
    att, s_off, t = saved.att, saved.sg, saved.t
    d_t = grad * f[:, :, 0]
    d_att = torch.bmm(s_off, d_t.unsqueeze(2)).squeeze(2)
    d_score = att.unsqueeze(2) * d_t.unsqueeze(1)
    SIGMOID_GRAD(d_score, s_off, grad_input=d_score)
    return d_att, d_score, grad * t


def _tanh(z: Tensor, out: Tensor | None) -> Tensor:
    """``tanh(z)`` into the arena region ``out`` when the executor gives one (its forward
    runs untracked), else a new tensor."""
    return torch.tanh_(z) if out is None else torch.tanh(z, out=out)


def _flat(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1)


class Filter(CellKind):
    """``filter_a[v]``: ``att * sig(f w + b)`` (fused: :mod:`.cells_module_net_fused`)."""

    kind = f"{_P}.filter"
    inputs = ("att", "scene")
    indexed_reads = ("scene",)
    params = (Param("w", "F"), Param("b", "1"))
    saves = ("att", "f", "s")
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        att, scene = inputs
        if fused.usable(att, scene):
            scene = fused.arena_rows(scene)
            y, s = fused.filter_forward(att, scene, p.w, p.b, out)
            if save is not None:
                save.update(att=att, f=scene, s=s)
            return y
        rows = fused.rows(scene).reshape(-1, p.w.shape[0])  # [B * N, F]
        s = torch.sigmoid_(torch.addmv(p.b, rows, p.w)).view(-1, MAX_OBJECTS)
        if save is not None:
            save.update(att=att, f=rows, s=s)
        return torch.mul(att, s, out=out) if out is not None else att * s

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        s = saved.s
        if isinstance(saved.f, ArenaRows):  # the fused forward's saves
            d_att, d_scene, dw, db = fused.filter_backward(grad, saved.att, s, saved.f, p.w)
            grads.add("w", dw)
            grads.add("b", db)
            return [d_att, fused.scene_grad(d_scene, saved.f)]
        d_z = grad * saved.att
        SIGMOID_GRAD(d_z, s, grad_input=d_z)
        flat = d_z.view(-1, 1)  # fresh tensors: views
        grads.linear(("w", "b"), flat, saved.f)  # one matmul per type for the whole run
        return [grad * s, torch.mul(flat, p.w).view(grad.shape[0], -1)]


class Relate(CellKind):
    """``relate[r]``: ``mask_j sum_{i != j} att_i sig(u . (f_j - f_i) + c)`` (fused:
    :mod:`.cells_module_net_fused`)."""

    kind = f"{_P}.relate"
    inputs = ("att", "scene")
    indexed_reads = ("scene",)
    params = (Param("u", "F"), Param("c", "1"))
    saves = ("f", "att", "sg", "t")
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        att, scene = inputs
        if fused.usable(att, scene):
            scene = fused.arena_rows(scene)
            y, sg, t = fused.relate_forward(att, scene, p.u, p.c, out)
            if save is not None:
                save.update(f=scene, att=att, sg=sg, t=t)
            return y
        scene = fused.rows(scene)
        f = _scene(scene)
        proj = f @ p.u
        score = proj.unsqueeze(1) - proj.unsqueeze(2) + p.c  # [b, i, j] = proj_j - proj_i
        if save is not None:
            save["f"] = scene
        return _pairs(att, score, f[:, :, 0], save, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        if isinstance(saved.f, ArenaRows):  # the fused forward's saves
            d_att, d_scene, du, dc = fused.relate_backward(grad, saved.att, saved.sg,
                                                           saved.t, saved.f, p.u)
            grads.add("u", du)
            grads.add("c", dc)
            return [d_att, fused.scene_grad(d_scene, saved.f)]
        f = _scene(saved.f)
        d_att, d_score, d_mask = _pairs_backward(saved, grad, f)
        grads.add("c", d_score.sum().reshape(1))
        d_proj = d_score.sum(1) - d_score.sum(2)
        grads.linear(("u",), d_proj.reshape(-1, 1), f.reshape(-1, f.shape[2]))
        d_f = d_proj.unsqueeze(2) * p.u
        d_f[:, :, 0] += d_mask
        return [d_att, _flat(d_f)]


class Same(CellKind):
    """``same_a``: ``mask_j sum_{i != j} att_i sig(f_i^T M f_j + c)``."""

    kind = f"{_P}.same"
    inputs = ("att", "scene")
    indexed_reads = ("scene",)
    params = (Param("M", "F, F"), Param("c", "1"))
    saves = ("f", "att", "sg", "t")
    dims = staticmethod(lambda op: {"F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        f = _scene(fused.rows(inputs[1]))
        score = torch.bmm(f @ p.M, f.transpose(1, 2)) + p.c
        if save is not None:
            save["f"] = f
        return _pairs(inputs[0], score, f[:, :, 0], save, out)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        f = saved.f
        d_att, d_score, d_mask = _pairs_backward(saved, grad, f)
        grads.add("c", d_score.sum().reshape(1))
        a = torch.bmm(d_score, f)  # [b, i] = sum_j d_ij f_j
        width = f.shape[2]
        grads.add("M", f.reshape(-1, width).t().mm(a.reshape(-1, width)))
        d_f = torch.baddbmm(a @ p.M.t(), d_score.transpose(1, 2), f @ p.M)
        d_f[:, :, 0] += d_mask
        return [d_att, _flat(d_f)]


class Unique(CellKind):
    """``unique``: ``att / (sum att + 1e-3)``."""

    kind = f"{_P}.unique"
    inputs = ("att",)

    saves = ("den", "y")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        den = inputs[0].sum(dim=1, keepdim=True) + 1e-3
        y = torch.div(inputs[0], den, out=out) if out is not None else inputs[0] / den
        if save is not None:
            save.update(den=den, y=y)
        return y

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        return [(grad - (grad * saved.y).sum(dim=1, keepdim=True)) / saved.den]


class Union(CellKind):
    """``union``: ``a + b - a b``."""

    kind = f"{_P}.union"
    inputs = ("a", "b")

    saves = ("a", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        a, b = inputs
        if save is not None:
            save.update(a=a, b=b)
        return torch.addcmul(a + b, a, b, value=-1.0, out=out) if out is not None else \
            torch.addcmul(a + b, a, b, value=-1.0)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        return [torch.addcmul(grad, grad, saved.b, value=-1.0),
                torch.addcmul(grad, grad, saved.a, value=-1.0)]


class Intersect(CellKind):
    """``intersect``: ``a b``."""

    kind = f"{_P}.intersect"
    inputs = ("a", "b")

    saves = ("a", "b")

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        if save is not None:
            save.update(a=inputs[0], b=inputs[1])
        return torch.mul(inputs[0], inputs[1], out=out) if out is not None else \
            inputs[0] * inputs[1]

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        return [grad * saved.b, grad * saved.a]


class Query(CellKind):
    """``query_a``: ``tanh(W (sum_j att_j f_j) + b)`` (the scene sums compiled:
    :mod:`.cells_module_net_fused`)."""

    kind = f"{_P}.query"
    inputs = ("att", "scene")
    indexed_reads = ("scene",)
    params = (Param("W", "H, F"), Param("b", "H"))
    saves = ("att", "f", "r", "y")
    dims = staticmethod(lambda op: {"H": op.out_shape[0], "F": _features(op)})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                out: Tensor | None = None, save: Saves = None) -> Tensor:
        att, scene = inputs
        y: Tensor | None = None
        if fused.usable(att, scene):
            f: Any = fused.arena_rows(scene)
            if terminal.usable(att, p.W, p.b):  # weighted rows and head: one compiled call
                y, r = terminal.query_forward(att, f.arena, f.idx, p.W, p.b, out)
            else:
                r = fused.query_rows(att, f)
        else:
            f = _scene(fused.rows(scene))
            r = torch.bmm(att.unsqueeze(1), f).squeeze(1)
        if y is None:
            y = _tanh(F.linear(r, p.W, p.b), out)
        if save is not None:
            save.update(att=att, f=f, r=r, y=y)
        return y

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        f = saved.f
        if isinstance(f, ArenaRows) and terminal.usable(grad, saved.y, saved.att, p.W):
            dz, d_att, d_scene = terminal.query_backward(grad, saved.y, saved.att, f.arena,
                                                         f.idx, p.W)
            grads.linear(("W", "b"), dz, saved.r)
            return [d_att, fused.scene_grad(d_scene, f)]
        dz = TANH_GRAD(grad, saved.y)
        grads.linear(("W", "b"), dz, saved.r)
        if isinstance(saved.f, ArenaRows):  # the fused forward's saves
            d_att, d_scene = fused.query_backward(dz @ p.W, saved.att, saved.f)
            return [d_att, fused.scene_grad(d_scene, saved.f)]
        d_r = (dz @ p.W).unsqueeze(1)
        d_att = torch.bmm(d_r, saved.f.transpose(1, 2)).squeeze(1)
        return [d_att, _flat(saved.att.unsqueeze(2) * d_r)]
