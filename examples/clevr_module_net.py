"""A CLEVR module network (IEP's execution engine) written per question through ``edbatch.api``.

``python examples/clevr_module_net.py --questions 1000 --epochs 3``: each question's program
is run as a user writes it, one module call per program step, inside ``batch.instance()``;
edbatch records the mini-batch, schedules it and runs every module type batched across
the questions (41 module types: one per function and value, e.g. ``filter_color[red]``).
There are no images: modules act on the per-object features of the scene graph. The
equations are those of :mod:`edbatch.workloads.module_net`; :meth:`ModuleNetModel.reference`
is the same model as plain unbatched PyTorch, one question and one node at a time
(``tests/workloads/test_module_net.py`` checks loss and gradients equal in fp64).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle
from edbatch.cli import positive, run
from edbatch.data.clevr_programs import module_type
from edbatch.workloads.module_net import (
    COUNT_BINS,
    MAX_OBJECTS,
    VOCAB_SIZES,
    ModuleNet,
    QuestionInstance,
    unpack_object,
)

__all__ = ["ModuleNetModel", "main"]

N = MAX_OBJECTS


class ObjectRow(nn.Module):
    """``[1, one-hot attributes, E-sum of the attributes, x, y]`` of packed objects."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(sum(VOCAB_SIZES), dim)

    def forward(self, codes: Tensor) -> Tensor:
        rows = []
        for code in codes.tolist():
            idx, x, y = unpack_object(int(code))
            offs = np.cumsum((0, *VOCAB_SIZES[:-1])) + np.asarray(idx)
            onehot = torch.zeros(sum(VOCAB_SIZES), dtype=self.embed.weight.dtype)
            onehot[offs] = 1.0
            e = self.embed(torch.as_tensor(offs)).sum(0)
            rows.append(torch.cat([onehot.new_ones(1), onehot, e, onehot.new_tensor([x, y])]))
        return torch.stack(rows)


class Stack(nn.Module):
    """A scene: the object rows of each node, padded with zero rows to ``N`` (variadic)."""

    def forward(self, rows: Tensor, segment: Tensor, size: int) -> Tensor:
        slot = (F.one_hot(segment, size).cumsum(0) - 1).gather(1, segment[:, None])[:, 0]
        out = rows.new_zeros(size, N, rows.shape[1])
        out[segment, slot] = rows
        return out.reshape(size, -1)


def _objs(scene: Tensor) -> Tensor:
    return scene.reshape(scene.shape[0], N, -1)


def _pairs(att: Tensor, score: Tensor, mask: Tensor) -> Tensor:
    off = 1.0 - torch.eye(N, dtype=score.dtype)
    return torch.bmm(att[:, None], torch.sigmoid(score) * off)[:, 0] * mask


class Start(nn.Module):
    def forward(self, scene: Tensor) -> Tensor:
        return _objs(scene)[:, :, 0]


class Filter(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.score = nn.Linear(f, 1)

    def forward(self, att: Tensor, scene: Tensor) -> Tensor:
        return att * torch.sigmoid(self.score(_objs(scene)))[:, :, 0]


class Relate(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.u, self.c = nn.Parameter(torch.randn(f) * 0.1), nn.Parameter(torch.zeros(1))

    def forward(self, att: Tensor, scene: Tensor) -> Tensor:
        f = _objs(scene)
        proj = f @ self.u
        return _pairs(att, proj[:, None, :] - proj[:, :, None] + self.c, f[:, :, 0])


class Same(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.M, self.c = nn.Parameter(torch.randn(f, f) * 0.1), nn.Parameter(torch.zeros(1))

    def forward(self, att: Tensor, scene: Tensor) -> Tensor:
        f = _objs(scene)
        return _pairs(att, torch.bmm(f @ self.M, f.transpose(1, 2)) + self.c, f[:, :, 0])


class Unique(nn.Module):
    def forward(self, att: Tensor) -> Tensor:
        return att / (att.sum(1, keepdim=True) + 1e-3)


class Union(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b - a * b


class Intersect(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a * b


class Count(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.out = nn.Linear(COUNT_BINS, h)

    def forward(self, att: Tensor) -> Tensor:
        s = att.sum(1, keepdim=True)
        bins = torch.arange(COUNT_BINS, dtype=s.dtype)
        return torch.tanh(self.out(torch.exp(-2.0 * (s - bins) ** 2)))


class Query(nn.Module):
    def __init__(self, f: int, h: int) -> None:
        super().__init__()
        self.out = nn.Linear(f, h)

    def forward(self, att: Tensor, scene: Tensor) -> Tensor:
        return torch.tanh(self.out(torch.bmm(att[:, None], _objs(scene))[:, 0]))


class Compare(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.out = nn.Linear(3 * h, h)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.tanh(self.out(torch.cat([x, y, x * y], dim=1)))


class EqualObject(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.out = nn.Linear(1, h)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.tanh(self.out((a * b).sum(1, keepdim=True)))


class Answer(nn.Module):
    """Cross-entropy of the answer classifier against the node's attr (the answer)."""

    def __init__(self, h: int, answers: int) -> None:
        super().__init__()
        self.out = nn.Linear(h, answers)

    def forward(self, h: Tensor, answer: Tensor) -> Tensor:
        return F.cross_entropy(self.out(h), answer, reduction="none")


def _module(mtype: str, f: int, h: int) -> tuple[nn.Module, list[int], int, bool]:
    """(module, operand widths, output width, reads the scene) of one module type."""
    fn, att, scene = mtype.split("[")[0], N, N * f
    if fn == "scene":
        return Start(), [scene], att, True
    if fn.startswith("filter_"):
        return Filter(f), [att, scene], att, True
    if fn == "relate":
        return Relate(f), [att, scene], att, True
    if fn.startswith("same_"):
        return Same(f), [att, scene], att, True
    if fn == "unique":
        return Unique(), [att], att, False
    if fn in ("union", "intersect"):
        return (Union() if fn == "union" else Intersect()), [att, att], att, False
    if fn in ("count", "exist"):
        return Count(h), [att], h, False
    if fn.startswith("query_"):
        return Query(f, h), [att, scene], h, True
    if fn == "equal_object":
        return EqualObject(h), [att, att], h, False
    return Compare(h), [h, h], h, False  # equal_*, less_than, greater_than


class ModuleNetModel(nn.Module):
    """Per-question code; edbatch batches every module type across the mini-batch."""

    def __init__(self, workload: ModuleNet, embed: int = 16, hidden: int = 64,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        f = 3 + sum(VOCAB_SIZES) + embed
        self.rows, self.stack = ObjectRow(embed), Stack()
        self.answer = Answer(hidden, len(workload.answers))
        self.mods = nn.ModuleDict()
        spec = {}
        for mtype in workload.meta.module_types():
            key = mtype.replace("[", "_").rstrip("]")
            module, ins, out, reads = _module(mtype, f, hidden)
            self.mods[key] = module
            spec[mtype] = (key, ins, out, reads)
        self.to(dtype)
        b = self.batch = DynamicBatch(dtype=dtype)
        self.c_row = b.cell(self.rows, "object", [], f, takes_attr=True)
        self.c_stack = b.cell(self.stack, "objects", [f], N * f, variadic=True)
        self.c_answer = b.cell(self.answer, "answer", [hidden], (), takes_attr=True)
        self.cells = {m: (b.cell(self.mods[k], k, ins, out), reads)
                      for m, (k, ins, out, reads) in spec.items()}

    def record(self, questions: Sequence[QuestionInstance]) -> list[Handle]:
        """Record every question's modules and loss; return the terminal handles."""
        terminals = []
        for q in questions:
            with self.batch.instance():
                scene = self.c_stack(*[self.c_row(attr=c) for c in q.object_codes])
                done: list[Handle] = []
                for node in q.question.program:
                    cell, reads = self.cells[module_type(node)]
                    args = [done[j] for j in node.inputs] + ([scene] if reads else [])
                    done.append(cell(*args))
                self.batch.add_loss(self.c_answer(done[-1], attr=q.answer))
                terminals.append(done[-1])
        return terminals

    def reference(self, q: QuestionInstance) -> Tensor:
        """The question's loss in plain PyTorch, one node at a time (unbatched)."""
        rows = self.rows(torch.tensor(q.object_codes))
        scene = F.pad(rows, (0, 0, 0, N - len(rows))).reshape(1, -1)
        done: list[Tensor] = []
        for node in q.question.program:
            key = module_type(node).replace("[", "_").rstrip("]")
            reads = self.cells[module_type(node)][1]
            args = [done[j] for j in node.inputs] + ([scene] if reads else [])
            done.append(self.mods[key](*args))
        return self.answer(done[-1], torch.tensor([q.answer]))[0]


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Train on the first ``--questions`` training questions; report validation accuracy."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=positive, default=1000)
    p.add_argument("--batch-size", type=positive, default=64)
    p.add_argument("--epochs", type=positive, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    wl = ModuleNet(hidden_dim=8)  # only the data and the module list are used
    train, val = list(wl.load("train"))[:args.questions], list(wl.load("val"))
    model = ModuleNetModel(wl)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    rng = np.random.default_rng(0)
    for epoch in range(1, args.epochs + 1):
        start, total = time.perf_counter(), 0.0
        order = rng.permutation(len(train))
        for lo in range(0, len(train), args.batch_size):
            model.record([train[i] for i in order[lo:lo + args.batch_size]])
            out = model.batch.run("critical_path")
            assert out.loss is not None
            opt.zero_grad()
            (out.loss / args.batch_size).backward()
            opt.step()
            total += out.loss.item()
        terms = model.record(val)
        res = model.batch.run("critical_path", outputs=terms, grad=False)
        with torch.no_grad():
            pred = model.answer.out(res.stack(terms)).argmax(1)
        acc = float((pred == torch.tensor([q.answer for q in val])).double().mean())
        print(f"epoch {epoch}: train loss {total / len(train):.4f}  val accuracy {acc:.4f}  "
              f"({time.perf_counter() - start:.1f}s)")
    return {"val_accuracy": acc}


if __name__ == "__main__":
    run(main)
