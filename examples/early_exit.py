"""Early exit: a sentence RNN that stops reading once its classifier is confident enough.

``python examples/early_exit.py``: per SST sentence, an Elman RNN reads one word at a time;
after each word the program reads the classifier's confidence (``p = yield probs``) and
stops when its maximum passes a threshold (or at the last word), then adds the loss of the
state it stopped at. :meth:`~edbatch.api.DynamicBatch.run_programs` runs the still-reading
sentences' steps together: one synchronisation per word position (the longest reading).
"""

from __future__ import annotations

import argparse
from collections.abc import Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch
from edbatch.cli import positive, run

__all__ = ["EarlyExit", "main"]


class Step(nn.Module):
    """``h' = tanh(W [h; x] + b)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)

    def forward(self, h: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(torch.cat([h, x], 1)))


class Probs(nn.Module):
    """Class probabilities of a state."""

    def __init__(self, out: nn.Linear) -> None:
        super().__init__()
        self.out = out

    def forward(self, h: Tensor) -> Tensor:
        return torch.softmax(self.out(h), 1)


class Loss(nn.Module):
    """Cross-entropy against the node's attr (label)."""

    def __init__(self, out: nn.Linear) -> None:
        super().__init__()
        self.out = out

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.out(h), labels, reduction="none")


class EarlyExit(nn.Module):
    """Embedding, RNN step, a 5-class classifier read after every word."""

    def __init__(self, vocab: int, dim: int = 16, threshold: float = 0.4,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed, self.step, self.out = nn.Embedding(vocab, dim), Step(dim), nn.Linear(dim, 5)
        self.threshold, self.dim = threshold, dim
        self.to(dtype)
        b = self.batch = DynamicBatch(dtype=dtype)
        self.c_step = b.cell(self.step, "step", [dim, dim], dim)
        self.c_probs = b.cell(Probs(self.out), "probs", [dim], 5)
        self.c_loss = b.cell(Loss(self.out), "loss", [dim], (), takes_attr=True)

    def program(self, words: Sequence[int], label: int) -> Generator[Any, Tensor, int]:
        """Read words until confident; return how many were read."""
        b = self.batch
        h = b.input(torch.zeros(self.dim, dtype=self.out.weight.dtype))
        read = 0
        for w in words:
            h = self.c_step(h, b.lookup(self.embed, w))
            read += 1
            p = yield self.c_probs(h)
            if p.max() > self.threshold:
                break
        b.add_loss(self.c_loss(h, attr=label))
        return read

    def reference(self, words: Sequence[int], label: int) -> tuple[Tensor, int]:
        """The same sentence in plain PyTorch: loss and words read."""
        h = torch.zeros(1, self.dim, dtype=self.out.weight.dtype)
        read = 0
        for w in words:
            h = self.step(h, self.embed.weight[w][None])
            read += 1
            if torch.softmax(self.out(h), 1).max() > self.threshold:
                break
        return F.cross_entropy(self.out(h), torch.tensor([label]), reduction="sum"), read


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train on SST sentences; return the mean loss and words read per epoch."""
    import importlib.util
    from pathlib import Path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=positive, default=128)
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--epochs", type=positive, default=3)
    args = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location(
        "moe_routing", Path(__file__).resolve().parent / "moe_routing.py")
    assert spec is not None and spec.loader is not None
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)
    data, vocab = moe.sentences(args.sentences)
    torch.manual_seed(0)
    model = EarlyExit(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(1, args.epochs + 1):
        total, read = 0.0, 0
        for i in range(0, len(data), args.batch_size):
            chunk = data[i:i + args.batch_size]
            out = model.batch.run_programs([model.program(w, y) for w, y in chunk])
            assert out.loss is not None
            opt.zero_grad()
            (out.loss / len(chunk)).backward()
            opt.step()
            total += out.loss.item() / len(data)
            read += sum(out.returns)
        losses.append(total)
        print(f"epoch {epoch}: loss/sentence {total:.3f}, words read "
              f"{read}/{sum(len(w) for w, _ in data)}")
    return losses


if __name__ == "__main__":
    run(main)
