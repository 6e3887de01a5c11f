"""The peers' model of ``benchmarks/module_net_peers.py``: the CLEVR module network's
equations (:mod:`edbatch.workloads.module_net`) on the workload's parameter dict, run one
question and one module at a time (:func:`unbatched_loss`) or batched by depth and module
type as Suarez et al. do (:func:`suarez_loss`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.data.clevr_programs import module_type
from edbatch.workloads.module_net import (
    COUNT_BINS,
    MAX_OBJECTS,
    VOCAB_SIZES,
    QuestionInstance,
    unpack_object,
)

__all__ = ["module", "suarez_loss", "unbatched_loss"]

N = MAX_OBJECTS
def _key(mtype: str) -> str:
    return "module_net." + mtype.replace("[", ".").rstrip("]")


def _scenes(insts: Sequence[QuestionInstance], params: Mapping[str, Tensor]) -> Tensor:
    """``[Q, N * F]``: every question's object rows (one embedding call for all objects)."""
    table = params["module_net.object.E"]
    offsets = np.cumsum((0, *VOCAB_SIZES[:-1]))
    idx, xy, owner, slot = [], [], [], []
    for q, inst in enumerate(insts):
        for k, code in enumerate(inst.object_codes):
            attrs, x, y = unpack_object(code)
            idx.append(offsets + np.asarray(attrs))
            xy.append((x, y))
            owner.append(q)
            slot.append(k)
    index = torch.as_tensor(np.stack(idx), device=table.device)
    onehot = table.new_zeros(len(idx), table.shape[0]).scatter_(1, index, 1.0)
    rows = torch.cat([table.new_ones(len(idx), 1), onehot, table[index].sum(1),
                      table.new_tensor(xy)], dim=1)
    out = rows.new_zeros(len(insts), N, rows.shape[1])
    out[torch.as_tensor(owner), torch.as_tensor(slot)] = rows
    return out.reshape(len(insts), -1)


def _pairs(att: Tensor, score: Tensor, f: Tensor) -> Tensor:
    off = 1.0 - torch.eye(N, dtype=score.dtype, device=score.device)
    return (att.unsqueeze(2) * torch.sigmoid(score) * off).sum(1) * f[:, :, 0]


def _count(args: Sequence[Tensor], p: Callable[[str], Tensor]) -> Tensor:
    s = args[0].sum(1, keepdim=True)
    k = torch.exp(-2.0 * (s - torch.arange(COUNT_BINS, dtype=s.dtype, device=s.device)) ** 2)
    return torch.tanh(k @ p("W").T + p("b"))


def _compare(args: Sequence[Tensor], p: Callable[[str], Tensor]) -> Tensor:
    x, y = args
    return torch.tanh(torch.cat([x, y, x * y], dim=1) @ p("W").T + p("b"))


#: Modules on attentions or vectors only (function -> (operands, parameter getter) -> out).
_PLAIN: dict[str, Callable[[Sequence[Tensor], Callable[[str], Tensor]], Tensor]] = {
    "unique": lambda a, p: a[0] / (a[0].sum(1, keepdim=True) + 1e-3),
    "union": lambda a, p: a[0] + a[1] - a[0] * a[1],
    "intersect": lambda a, p: a[0] * a[1],
    "count": _count,
    "exist": _count,
    "equal_object": lambda a, p: torch.tanh(
        (a[0] * a[1]).sum(1, keepdim=True) @ p("W").T + p("b")),
}


def module(mtype: str, args: Sequence[Tensor], params: Mapping[str, Tensor]) -> Tensor:
    """One module type on a batch of rows (``args``: its operands, the scene last if read)."""
    fn, key = mtype.split("[")[0], _key(mtype)

    def p(name: str) -> Tensor:
        return params[f"{key}.{name}"]

    if fn in _PLAIN:
        return _PLAIN[fn](args, p)
    if not _reads_scene(fn):  # equal_*, less_than, greater_than
        return _compare(args, p)
    f = args[-1].reshape(len(args[-1]), N, -1)
    if fn == "scene":
        return f[:, :, 0]
    if fn.startswith("filter_"):
        return args[0] * torch.sigmoid(f @ p("w") + p("b"))
    if fn == "relate":
        proj = f @ p("u")
        return _pairs(args[0], proj[:, None, :] - proj[:, :, None] + p("c"), f)
    if fn.startswith("same_"):
        return _pairs(args[0], torch.einsum("bif,fg,bjg->bij", f, p("M"), f) + p("c"), f)
    return torch.tanh((args[0].unsqueeze(2) * f).sum(1) @ p("W").T + p("b"))  # query_*


def _reads_scene(fn: str) -> bool:
    return fn == "scene" or fn.startswith(("filter_", "same_", "query_")) or fn == "relate"


def _answer_loss(h: Tensor, answers: Sequence[int], params: Mapping[str, Tensor]) -> Tensor:
    logits = h @ params["module_net.answer.W"].T + params["module_net.answer.b"]
    gold = torch.as_tensor(list(answers), device=h.device)
    return F.cross_entropy(logits, gold, reduction="sum")


def unbatched_loss(insts: Sequence[QuestionInstance], params: Mapping[str, Tensor]
                   ) -> tuple[Tensor, int]:
    """The summed loss, one question and one module at a time; ``(loss, module calls)``."""
    total, calls = None, 0
    for inst in insts:
        scene = _scenes([inst], params)
        done: list[Tensor] = []
        for node in inst.question.program:
            args = [done[j] for j in node.inputs]
            if _reads_scene(node.function):
                args.append(scene)
            done.append(module(module_type(node), args, params))
        loss = _answer_loss(done[-1], [inst.answer], params)
        total = loss if total is None else total + loss
        calls += 2 + len(done)
    assert total is not None, "no questions"
    return total, calls


def suarez_loss(insts: Sequence[QuestionInstance], params: Mapping[str, Tensor]
                ) -> tuple[Tensor, int]:
    """The summed loss, one call per (depth, module type) over the mini-batch;
    ``(loss, module calls)``."""
    scenes = _scenes(insts, params)
    groups: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for q, inst in enumerate(insts):
        depth: list[int] = []
        for i, node in enumerate(inst.question.program):
            depth.append(1 + max((depth[j] for j in node.inputs), default=-1))
            groups[(depth[-1], module_type(node))].append((q, i))
    values: dict[tuple[int, int], Tensor] = {}
    for (_, mtype), nodes in sorted(groups.items()):
        first = insts[nodes[0][0]].question.program[nodes[0][1]]
        args = [torch.stack([values[(q, insts[q].question.program[i].inputs[k])]
                             for q, i in nodes]) for k in range(len(first.inputs))]
        if _reads_scene(first.function):
            args.append(scenes[torch.as_tensor([q for q, _ in nodes])])
        out = module(mtype, args, params)
        for r, node in enumerate(nodes):
            values[node] = out[r]
    h = torch.stack([values[(q, len(inst.question.program) - 1)]
                     for q, inst in enumerate(insts)])
    return _answer_loss(h, [i.answer for i in insts], params), len(groups) + 2
