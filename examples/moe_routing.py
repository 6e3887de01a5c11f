"""A top-2-of-8 mixture of experts whose routing is decided inside the per-sentence code.

``python examples/moe_routing.py``: trains a token-level MoE sentiment classifier on SST
sentences (the words of ``data/trees/train.txt``). Per sentence, a plain Python program
records the gate of every token, *reads the gate's values* (``p = yield gates``), picks each
token's two experts with ``topk`` and records the two expert calls and their weighted
combination. :meth:`~edbatch.api.DynamicBatch.run_programs` runs every sentence of the
mini-batch to that read, computes all gates as one batch, hands the values back, and runs
the routed experts batched across all sentences: every expert is one op type, so all the
tokens routed to expert ``k`` run as one call. One synchronisation per mini-batch; the
combination weights are the gate's outputs, so gradients reach the gate through the
recorded graph (the values read for routing are detached, as in a standard MoE).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch
from edbatch.data.trees import load_trees
from edbatch.workloads.base import DATA_DIR

__all__ = ["MoE", "main", "sentences"]

EXPERTS, TOP = 8, 2


class Combine(nn.Module):
    """``(p_a e_a + p_b e_b) / (p_a + p_b)`` with the experts ``a, b`` in the node's attr
    (``a * 8 + b``): the top-2 gate weights, renormalised."""

    def forward(self, probs: Tensor, ea: Tensor, eb: Tensor, attrs: Tensor) -> Tensor:
        pa = probs.gather(1, (attrs // EXPERTS)[:, None])
        pb = probs.gather(1, (attrs % EXPERTS)[:, None])
        return (pa * ea + pb * eb) / (pa + pb)


class Gate(nn.Module):
    """Softmax over the experts."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, EXPERTS)

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(self.linear(x), dim=1)


class Classify(nn.Module):
    """Cross-entropy of a linear 5-class classifier against the node's attr (label)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.linear(h), labels, reduction="none")


class MoE(nn.Module):
    """Embedding, gate, 8 experts, top-2 combination and a per-token loss."""

    def __init__(self, vocab: int, dim: int = 32, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gate, self.classify, self.combine = Gate(dim), Classify(dim), Combine()
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.Tanh())
                                     for _ in range(EXPERTS))
        self.to(dtype)
        b = self.batch = DynamicBatch(dtype=dtype)
        self.c_gate = b.cell(self.gate, "gate", [dim], EXPERTS)
        self.c_experts = [b.cell(e, f"expert{k}", [dim], dim) for k, e in enumerate(self.experts)]
        self.c_combine = b.cell(self.combine, "combine", [EXPERTS, dim, dim], dim,
                                takes_attr=True)
        self.c_loss = b.cell(self.classify, "loss", [dim], (), takes_attr=True)

    def program(self, words: Sequence[int], label: int) -> Generator[Any, Tensor, list[int]]:
        """One sentence: gates, a read of their values, routed experts, per-token losses.
        Returns the experts chosen per token."""
        b = self.batch
        xs = [b.lookup(self.embed, w) for w in words]
        gates = [self.c_gate(x) for x in xs]
        probs = yield gates                              # [T, 8], all tokens at once
        chosen = probs.topk(TOP, dim=1).indices.tolist()
        for x, g, (a, c) in zip(xs, gates, chosen, strict=True):
            y = self.c_combine(g, self.c_experts[a](x), self.c_experts[c](x),
                               attr=a * EXPERTS + c)
            b.add_loss(self.c_loss(y, attr=label))
        return [a * EXPERTS + c for a, c in chosen]

    def reference(self, words: Sequence[int], label: int) -> tuple[Tensor, list[int]]:
        """The same sentence token by token in plain PyTorch: loss and routing."""
        total, routes = torch.zeros((), dtype=self.embed.weight.dtype), []
        for w in words:
            x = self.embed.weight[w][None]
            p = self.gate(x)
            a, c = p[0].topk(TOP).indices.tolist()
            y = self.combine(p, self.experts[a](x), self.experts[c](x),
                             torch.tensor([a * EXPERTS + c]))
            total = total + self.classify(y, torch.tensor([label]))[0]
            routes.append(a * EXPERTS + c)
        return total, routes


def sentences(limit: int) -> tuple[list[tuple[list[int], int]], int]:
    """The first ``limit`` SST train sentences as (word ids, sentiment label), and the
    vocabulary size (id 0: unknown)."""
    trees = load_trees(DATA_DIR / "trees" / "train.txt")[:limit]
    words = {w: i + 1 for i, w in enumerate(sorted({w for t in trees for w in t.leaves()}))}
    return [([words[w] for w in t.leaves()], t.label) for t in trees], len(words) + 1


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train on SST sentences; return the mean per-token loss of each epoch."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--scheduler", default="typewise_greedy")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    data, vocab = sentences(args.sentences)
    model = MoE(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    tokens = sum(len(w) for w, _ in data)
    for epoch in range(1, args.epochs + 1):
        start, total = time.perf_counter(), 0.0
        for i in range(0, len(data), args.batch_size):
            chunk = data[i:i + args.batch_size]
            out = model.batch.run_programs([model.program(w, y) for w, y in chunk],
                                           args.scheduler)
            assert out.loss is not None
            opt.zero_grad()
            (out.loss / sum(len(w) for w, _ in chunk)).backward()
            opt.step()
            total += out.loss.item() / tokens
        losses.append(total)
        print(f"epoch {epoch}: loss/token {total:.3f}  ({out.syncs} sync, "
              f"{out.num_batches} batches per mini-batch; {time.perf_counter() - start:.1f}s)")
    return losses


if __name__ == "__main__":
    main()
