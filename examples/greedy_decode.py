"""Greedy decoding of the seq2seq workload's encoder-decoder, every sentence batched.

``python examples/greedy_decode.py``: the built-in ``seq2seq`` cells (encoder and decoder
LSTM steps, :meth:`DynamicBatch.from_workload`) plus one user cell for the output logits.
Each sentence is a program that encodes its source, then at every step asks for the argmax
of the logits (``prev = yield argmax(logits)``: computed for all sentences at once), feeds it
back as the next input and stops at ``</s>``.
:meth:`~edbatch.api.DynamicBatch.run_programs` runs all sentences' steps together: one
synchronisation per decoded position (the longest output), every decoder step of that
position one batch.
"""

from __future__ import annotations

import argparse
from collections.abc import Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, argmax
from edbatch.cli import positive, run
from edbatch.executor import init_params
from edbatch.workloads import make_workload

__all__ = ["Decoder", "main"]


class Logits(nn.Module):
    """``W_out h + b_out`` of a decoder state ``[h; c]`` (the loss op's own parameters)."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, state: Tensor) -> Tensor:
        return F.linear(state[:, :self.weight.shape[1]], self.weight, self.bias)


class Decoder:
    """The seq2seq workload's cells and parameters, decoding greedily."""

    def __init__(self, hidden: int = 32, vocab_size: int = 256, seed: int = 0,
                 max_len: int | None = 12, dtype: torch.dtype = torch.float32) -> None:
        self.wl = make_workload("seq2seq", embed_dim=hidden, hidden_dim=hidden,
                                vocab_size=vocab_size, max_len=max_len)
        params = init_params(self.wl, torch.Generator().manual_seed(seed), dtype=dtype)
        #: The workload's parameters (the benchmark's peers decode with the same ones).
        self.params = params
        b = self.batch = DynamicBatch.from_workload(self.wl, params, dtype=dtype)
        self.zero, self.enc, self.dec = (b.op(f"seq2seq.{n}") for n in ("zero_state", "enc",
                                                                          "dec"))
        out = Logits(params["seq2seq.out"], params["seq2seq.out.b"])
        self.logits = b.cell(out, "logits", [2 * hidden], self.wl.num_target)
        vocab = self.wl.target_vocab
        self.bos, self.eos = vocab["<s>"] % vocab_size, vocab["</s>"] % vocab_size

    def program(self, source: Sequence[int], steps: int) -> Generator[Any, Tensor, list[int]]:
        """Encode ``source``, then decode greedily for at most ``steps`` tokens."""
        state = self.zero()
        for token in source:
            state = self.enc(state, attr=token)
        prev, out = self.bos, []
        for _ in range(steps):
            state = self.dec(state, attr=prev)
            prev = yield argmax(self.logits(state))  # one value read per position
            out.append(prev)
            if prev == self.eos:
                break
        return out

    def decode(self, sources: Sequence[Sequence[int]], steps: int | Sequence[int]
               ) -> tuple[list[list[int]], int]:
        """Every source decoded in one batched run (``steps``: one limit for all or one
        per source): (outputs, synchronisations)."""
        limits = [steps] * len(sources) if isinstance(steps, int) else list(steps)
        out = self.batch.run_programs([self.program(s, n) for s, n in zip(sources, limits,
                                                                           strict=True)],
                                      "depth", grad=False)
        return out.returns, out.syncs


def main(argv: Sequence[str] | None = None) -> list[list[int]]:
    """Decode the first test sentences; print the outputs' lengths and the syncs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=positive, default=16)
    p.add_argument("--steps", type=positive, default=10)
    args = p.parse_args(argv)
    model = Decoder()
    sources = [inst.source_ids for inst in model.wl.load("test")[:args.sentences]]
    outputs, syncs = model.decode(sources, args.steps)
    print(f"{len(sources)} sentences decoded in {syncs} synchronisations; lengths "
          f"{[len(o) for o in outputs]}")
    return outputs


if __name__ == "__main__":
    run(main)
