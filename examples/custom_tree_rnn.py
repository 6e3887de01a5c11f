"""A custom Tree-RNN on SST sentiment trees, written per tree and run batched by edbatch.

``python examples/custom_tree_rnn.py``: trains on a few hundred SST train trees with Adam and
prints the per-node loss and how many batches (kernel launches) each mini-batch took.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle
from edbatch.data.trees import Tree, load_trees
from edbatch.workloads.base import DATA_DIR

__all__ = ["TreeRNN", "main"]


class Compose(nn.Module):
    """``h = tanh(W [h_l; h_r] + b)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)

    def forward(self, left: Tensor, right: Tensor) -> Tensor:
        return torch.tanh(self.linear(torch.cat([left, right], dim=1)))


class Classify(nn.Module):
    """Cross-entropy of a linear 5-class classifier, one number per row."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.linear(h), labels, reduction="none")


class TreeRNN(nn.Module):
    """Embedding leaves, a composition cell and a loss at every node, batched by edbatch."""

    def __init__(self, words: dict[str, int], dim: int = 64) -> None:
        super().__init__()
        self.words, self.embed = words, nn.Embedding(len(words) + 1, dim)
        self.compose, self.classify = Compose(dim), Classify(dim)
        self.batch = DynamicBatch()
        self.compose_cell = self.batch.cell(self.compose, "compose", [dim, dim], dim)
        self.loss_cell = self.batch.cell(self.classify, "loss", [dim], (), takes_attr=True)

    def encode(self, tree: Tree) -> Handle:
        """Plain per-tree recursion: record the tree's nodes and a loss per node."""
        if tree.is_leaf:
            h = self.batch.lookup(self.embed, self.words.get(tree.word or "", 0))
        else:
            h = self.compose_cell(*[self.encode(child) for child in tree.children])
        self.batch.add_loss(self.loss_cell(h, attr=tree.label))
        return h


def main(num_trees: int = 400, batch_size: int = 32, epochs: int = 6) -> list[float]:
    """Train on the first ``num_trees`` SST train trees; return the loss per epoch."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    trees = load_trees(DATA_DIR / "trees" / "train.txt")[:num_trees]
    words = {w: i + 1 for i, w in enumerate(sorted({w for t in trees for w in t.leaves()}))}
    model = TreeRNN(words)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(1, epochs + 1):
        start, total, steps = time.perf_counter(), 0.0, []
        for i in range(0, len(trees), batch_size):
            chunk = trees[i:i + batch_size]
            for tree in chunk:
                with model.batch.instance():
                    model.encode(tree)
            out = model.batch.run("typewise_greedy")  # any scheduler name or Policy
            assert out.loss is not None
            opt.zero_grad()
            (out.loss / len(chunk)).backward()
            opt.step()
            total += out.loss.item() / sum(t.num_nodes for t in trees)
            steps.append((out.graph.num_nodes, out.num_batches))
        losses.append(total)
        nodes, batches = (sum(x) // len(steps) for x in zip(*steps))
        print(f"epoch {epoch}: loss/tree node {total:.3f}   mini-batch of {batch_size} trees: "
              f"{nodes} nodes in {batches} batches   ({time.perf_counter() - start:.1f}s)")
    return losses


if __name__ == "__main__":
    main()
