"""SICK relatedness with a child-sum Tree-LSTM written through ``edbatch.api``.

``python examples/sick_relatedness.py --pairs 1000 --epochs 2``: the model of Tai et al.
(2015) written per sentence pair, as a user writes it: one *variadic* cell for the
child-sum node (a word and any number of children), one cell for the similarity head and
its KL loss. Every mini-batch of pairs is recorded, scheduled and run batched by edbatch;
Adam trains it. Prints the training KL per epoch and dev Pearson / Spearman / MSE. The
embeddings start random (no GloVe in the repository).

The same model, workload-side (kernels, graphs, a training script), is
``edbatch.workloads.tree_lstm_sick`` and ``python -m experiments.train_sick``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, segment_sum
from edbatch.cli import positive, run
from edbatch.data.sick import DepTree, SickPair, load_sick
from edbatch.workloads.base import DATA_DIR
from edbatch.workloads.tree_lstm_sick import relatedness_metrics

__all__ = ["ChildSumTreeLSTM", "SickModel", "Similarity", "main", "sparse_target"]

SCALE = 1000  # a score travels to the loss cell as the int attr round(score * SCALE)


class ChildSumTreeLSTM(nn.Module):
    """A child-sum Tree-LSTM node on its word ``x`` and any number of ``[h; c]`` children."""

    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w_iou, self.u_iou = nn.Linear(in_dim, 3 * hidden), nn.Linear(hidden, 3 * hidden,
                                                                            bias=False)
        self.w_f, self.u_f = nn.Linear(in_dim, hidden), nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor, rows: Tensor, segment: Tensor, size: int) -> Tensor:
        # x: [B, in_dim]; rows: [N, 2H] every child of the B nodes; segment: [N] its node
        h_k, c_k = rows[:, :self.hidden], rows[:, self.hidden:]
        i, o, u = (self.w_iou(x) + self.u_iou(segment_sum(h_k, segment, size))).chunk(3, 1)
        f = torch.sigmoid(self.w_f(x)[segment] + self.u_f(h_k))  # one forget gate per child
        c = torch.sigmoid(i) * torch.tanh(u) + segment_sum(f * c_k, segment, size)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


def sparse_target(scores: Tensor, classes: int = 5) -> Tensor:
    """Tai et al.'s target: the mass of ``score`` split between the integers around it."""
    low = scores.floor().clamp(max=classes - 1)
    frac = scores - low
    target = torch.zeros(len(scores), classes, dtype=scores.dtype, device=scores.device)
    rows = torch.arange(len(scores), device=scores.device)
    target[rows, low.long() - 1] = 1 - frac
    target[rows, low.long()] += frac
    return target


class Similarity(nn.Module):
    """``h_s = sigmoid(W_x (h_a*h_b) + W_abs |h_a - h_b| + b)``, ``p = softmax(W_p h_s)``."""

    def __init__(self, hidden: int, sim: int, classes: int = 5) -> None:
        super().__init__()
        self.hidden = hidden
        self.w_x, self.w_abs = nn.Linear(hidden, sim), nn.Linear(hidden, sim, bias=False)
        self.w_p = nn.Linear(sim, classes)

    def log_probs(self, state_a: Tensor, state_b: Tensor) -> Tensor:
        h_a, h_b = state_a[:, :self.hidden], state_b[:, :self.hidden]
        h_s = torch.sigmoid(self.w_x(h_a * h_b) + self.w_abs((h_a - h_b).abs()))
        return F.log_softmax(self.w_p(h_s), dim=1)

    def forward(self, state_a: Tensor, state_b: Tensor, scores: Tensor) -> Tensor:
        """``KL(target || p)`` per pair (``scores``: the int attrs ``round(score*SCALE)``)."""
        logp = self.log_probs(state_a, state_b)
        target = sparse_target(scores.to(logp.dtype) / SCALE, logp.shape[1])
        return F.kl_div(logp, target, reduction="none").sum(dim=1)


class SickModel(nn.Module):
    """Per-pair code; the whole mini-batch runs batched by edbatch."""

    def __init__(self, words: dict[str, int], embed: int = 150, hidden: int = 150,
                 sim: int = 50, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.words = words
        self.embed = nn.Embedding(len(words) + 1, embed)  # row 0: unknown words
        self.tree, self.sim = ChildSumTreeLSTM(embed, hidden), Similarity(hidden, sim)
        self.to(dtype)
        self.batch = DynamicBatch(dtype=dtype)
        self.node = self.batch.cell(self.tree, "node", [embed, 2 * hidden], 2 * hidden,
                                    variadic=True)
        self.loss = self.batch.cell(self.sim, "sim", [2 * hidden, 2 * hidden], (),
                                    takes_attr=True)

    def encode(self, tree: DepTree, token: int) -> Handle:
        """The state of ``token`` (1-based) from its word and its dependents' states."""
        x = self.batch.lookup(self.embed, self.words.get(tree.words[token - 1].lower(), 0))
        return self.node(x, *[self.encode(tree, kid) for kid in tree.children[token]])

    def record(self, pairs: Sequence[SickPair]) -> list[tuple[Handle, Handle]]:
        """Record every pair's two trees and loss; return the root states."""
        roots = []
        for pair in pairs:
            with self.batch.instance():
                a, b = self.encode(pair.a, pair.a.root), self.encode(pair.b, pair.b.root)
                self.batch.add_loss(self.loss(a, b, attr=round(pair.score * SCALE)))
                roots.append((a, b))
        return roots

    def predict(self, pairs: Sequence[SickPair]) -> Tensor:
        """Predicted scores ``sum_k k p_k`` (batched, no grad)."""
        roots = self.record(pairs)
        out = self.batch.run("dynet_agenda", outputs=[h for ab in roots for h in ab],
                             grad=False)
        states = out.stack([h for ab in roots for h in ab]).reshape(len(pairs), 2, -1)
        with torch.no_grad():
            p = self.sim.log_probs(states[:, 0], states[:, 1]).exp()
        return p @ torch.arange(1, p.shape[1] + 1, dtype=p.dtype)


def word_ids(pairs: Sequence[SickPair]) -> dict[str, int]:
    """Lower-cased words of ``pairs``, ids from 1 (0 is the unknown word)."""
    words = sorted({w.lower() for p in pairs for t in (p.a, p.b) for w in t.words})
    return {w: i for i, w in enumerate(words, start=1)}


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Run the example; return the training KL per epoch and the dev metrics."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=positive, default=1000, help="SICK train pairs to use")
    p.add_argument("--batch-size", type=positive, default=25)
    p.add_argument("--epochs", type=positive, default=2)
    p.add_argument("--dim", type=positive, default=100, help="embedding and memory size")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train = load_sick(DATA_DIR / "sick" / "train")[:args.pairs]
    dev = load_sick(DATA_DIR / "sick" / "dev")
    model = SickModel(word_ids(train), args.dim, args.dim, 50)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rng = np.random.default_rng(0)
    losses = []
    for epoch in range(1, args.epochs + 1):
        start, total = time.perf_counter(), 0.0
        order = rng.permutation(len(train))
        for lo in range(0, len(train), args.batch_size):
            model.record([train[i] for i in order[lo:lo + args.batch_size]])
            out = model.batch.run("dynet_agenda")
            assert out.loss is not None
            opt.zero_grad()
            (out.loss / args.batch_size).backward()
            opt.step()
            total += out.loss.item()
        losses.append(total / len(train))
        pred = torch.cat([model.predict(dev[i:i + 250]) for i in range(0, len(dev), 250)])
        metrics = relatedness_metrics(pred.numpy(), [q.score for q in dev])
        print(f"epoch {epoch}: train KL {losses[-1]:.4f}   dev pearson "
              f"{metrics['pearson']:.4f} spearman {metrics['spearman']:.4f} mse "
              f"{metrics['mse']:.4f}   ({time.perf_counter() - start:.1f}s)")
    return {"losses": losses, "dev": metrics}


if __name__ == "__main__":
    run(main)
