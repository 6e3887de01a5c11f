"""Your own model with ``edbatch.api``: a child-sum Tree-GRU on SST, with a learned FSM.

``python examples/own_model.py``: writes the model per tree (one *variadic* cell, so leaves
and inner nodes of any child count are one op type and batch together), records a few
mini-batches to train an FSM batching policy (saved to ``--policy``), then trains the model
with Adam, every mini-batch run batched under that policy. Prints the policy's batches per
mini-batch against the lower bound and the loss per epoch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, segment_sum
from edbatch.cli import positive, run
from edbatch.data.trees import Tree, load_trees
from edbatch.schedule import lower_bound
from edbatch.workloads.base import DATA_DIR
from policies import load_policy, train_policy

__all__ = ["ChildSumGRU", "TreeGRU", "main"]


class ChildSumGRU(nn.Module):
    """A child-sum Tree-GRU node on its word ``x`` and any number of child states."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wx = nn.Linear(dim, 3 * dim)
        self.uz, self.ur, self.uh = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x: Tensor, rows: Tensor, segment: Tensor, size: int) -> Tensor:
        # x: [B, dim]; rows: [N, dim] child states of all B nodes; segment: [N] node of a row
        xz, xr, xh = self.wx(x).chunk(3, dim=1)
        h_sum = segment_sum(rows, segment, size)
        r = torch.sigmoid(xr[segment] + self.ur(rows))            # one reset gate per child
        z = torch.sigmoid(xz + self.uz(h_sum))
        h_tilde = torch.tanh(xh + self.uh(segment_sum(r * rows, segment, size)))
        return (1 - z) * h_sum + z * h_tilde


class Classify(nn.Module):
    """Cross-entropy of a linear 5-class classifier, one number per row."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.linear(h), labels, reduction="none")


class TreeGRU(nn.Module):
    """Per-tree code; the whole mini-batch runs batched by edbatch."""

    def __init__(self, words: dict[str, int], dim: int = 64) -> None:
        super().__init__()
        self.words, self.embed = words, nn.Embedding(len(words) + 1, dim)
        self.gru, self.classify = ChildSumGRU(dim), Classify(dim)
        self.batch = DynamicBatch()
        self.node = self.batch.cell(self.gru, "node", [dim, dim], dim, variadic=True)
        self.loss = self.batch.cell(self.classify, "loss", [dim], (), takes_attr=True)

    def encode(self, tree: Tree) -> Handle:
        x = self.batch.lookup(self.embed, self.words.get(tree.word or "", 0))
        h = self.node(x, *[self.encode(child) for child in tree.children])
        self.batch.add_loss(self.loss(h, attr=tree.label))
        return h

    def record(self, trees: Sequence[Tree]) -> None:
        for tree in trees:
            with self.batch.instance():
                self.encode(tree)


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Run the example; return the loss per epoch and the batches per mini-batch."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", type=positive, default=512, help="SST train trees to use")
    p.add_argument("--batch-size", type=positive, default=64)
    p.add_argument("--epochs", type=positive, default=3)
    p.add_argument("--episodes", type=positive, default=100, help="policy training episodes")
    p.add_argument("--policy", default="runs/own_model/policy.json", help="policy file")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    trees = load_trees(DATA_DIR / "trees" / "train.txt")[:args.trees]
    words = {w: i + 1 for i, w in enumerate(sorted({w for t in trees for w in t.leaves()}))}
    model = TreeGRU(words)
    chunks = [trees[i:i + args.batch_size] for i in range(0, len(trees), args.batch_size)]

    # 1. A batching policy for this model: record mini-batches, keep their graphs, train.
    graphs = []
    for chunk in chunks[:4]:
        model.record(chunk)
        graphs.append(model.batch.graph()[0])
        model.batch.discard()
    t0 = time.perf_counter()
    train_policy(graphs[:2], val_graphs=graphs[2:] or None, path=args.policy,
                 max_episodes=args.episodes)
    policy = load_policy(args.policy)
    print(f"policy {args.policy}: {policy.num_states} states, fallback "
          f"{policy.fallback_name}, {policy.metadata['best_ratio']:.3f} x LB on validation "
          f"graphs ({time.perf_counter() - t0:.1f}s)")

    # 2. Train the model, every mini-batch batched under the policy.
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, batches = [], []
    for epoch in range(1, args.epochs + 1):
        start, total, nodes = time.perf_counter(), 0.0, 0
        for chunk in chunks:
            model.record(chunk)
            out = model.batch.run(policy)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            total += out.loss.item()
            nodes += sum(t.num_nodes for t in chunk)
            batches.append(out.num_batches / lower_bound(out.graph))
        losses.append(total / nodes)
        print(f"epoch {epoch}: loss/tree node {losses[-1]:.3f}   batches/LB "
              f"{sum(batches) / len(batches):.2f}   ({time.perf_counter() - start:.1f}s)")
    return {"losses": losses, "ratio_to_lb": batches}


if __name__ == "__main__":
    run(main)
