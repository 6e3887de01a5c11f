"""The benchmark peers of ``bilstm_tagger``: the 2-layer BiLSTM tagger.

``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`);
``HandBatched``: the hand-batched PyTorch model (:mod:`benchmarks.hand_batched`);
``Unbatched``: per-instance PyTorch, one sentence and one LSTM step at a time (the
``pytorch_unbatched`` contender, the seeds' baseline). Found by
the workload's name (:func:`benchmarks.peers.find_peers`); the DyNet peer is
``benchmarks/peers/dynet/bilstm_tagger.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import hand_batched
from edbatch.api import DynamicBatch

__all__ = ["BiLSTMPacked", "BiLSTMUnbatched", "HandBatched", "Unbatched", "record"]


def record(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """2-layer BiLSTM tagger: embeddings, four recurrences, an MLP loss per token."""
    lookup, zero = batch.op("bilstm.lookup"), batch.op("bilstm.zero_state")
    l1f, l1b, l2f, l2b = (batch.op(f"bilstm.{d}")
                          for d in ("l1_fwd", "l1_bwd", "l2_fwd", "l2_bwd"))
    loss = batch.op("bilstm.loss")
    add_loss = batch.add_loss
    for inst in instances:
        n = len(inst)
        with batch.instance():
            xs = [lookup(attr=w) for w in inst.word_ids]
            f1, b1, f2, b2 = [None] * n, [None] * n, [None] * n, [None] * n
            s = zero()
            for t in range(n):
                s = f1[t] = l1f(xs[t], s)
            s = zero()
            for t in reversed(range(n)):
                s = b1[t] = l1b(xs[t], s)
            s = zero()
            for t in range(n):
                s = f2[t] = l2f(f1[t], b1[t], s)
            s = zero()
            for t in reversed(range(n)):
                s = b2[t] = l2b(f1[t], b1[t], s)
            for t, tag in enumerate(inst.tag_ids):
                add_loss(loss(f2[t], b2[t], attr=tag))


def _torch_gate_order(w: Tensor) -> Tensor:
    """edbatch's gate blocks ``i f o u`` -> torch's ``i f g o`` (along dim 0)."""
    i, f, o, u = w.chunk(4, 0)
    return torch.cat([i, f, u, o], 0)


class BiLSTMPacked(hand_batched.HandBatched):
    """The BiLSTM tagger as ``nn.LSTM(2 layers, bidirectional)`` over packed sequences."""

    def __init__(self, wl: Any, params: Mapping[str, Tensor]) -> None:
        super().__init__(wl, params)
        emb = params["bilstm.emb"]
        embed, hidden = emb.shape[1], wl.hidden_dim
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, bidirectional=True).to(emb.dtype)
        with torch.no_grad():
            for layer, in_dim in ((1, embed), (2, 2 * hidden)):
                for direction, suffix in (("fwd", ""), ("bwd", "_reverse")):
                    w = _torch_gate_order(params[f"bilstm.l{layer}_{direction}"].detach())
                    b = _torch_gate_order(params[f"bilstm.l{layer}_{direction}.b"].detach())
                    tail = f"_l{layer - 1}{suffix}"
                    getattr(self.lstm, f"weight_ih{tail}").copy_(w[:, :in_dim])
                    getattr(self.lstm, f"weight_hh{tail}").copy_(w[:, in_dim:])
                    getattr(self.lstm, f"bias_ih{tail}").copy_(b)
                    getattr(self.lstm, f"bias_hh{tail}").zero_()
        self.lstm.requires_grad_(emb.requires_grad)

    def parameters(self) -> list[Tensor]:
        keep = ("bilstm.emb", "bilstm.hidden", "bilstm.hidden.b", "bilstm.out", "bilstm.out.b")
        return [self.params[k] for k in keep] + list(self.lstm.parameters())

    def prepare(self, instances: Sequence[Any]) -> dict[str, Any]:
        lengths = np.array([len(inst) for inst in instances])
        words = np.zeros((int(lengths.max()), len(instances)), dtype=np.int64)
        mask = np.arange(words.shape[0])[:, None] < lengths[None, :]
        words.T[mask.T] = np.concatenate([inst.word_ids for inst in instances])
        tags = np.concatenate([inst.tag_ids for inst in instances])  # batch-major
        return {"words": torch.from_numpy(words), "lengths": torch.from_numpy(lengths),
                "mask": torch.from_numpy(mask.T.copy()), "tags": torch.from_numpy(tags)}

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p = self.params
        x = F.embedding(prep["words"], p["bilstm.emb"], sparse=True)
        packed = nn.utils.rnn.pack_padded_sequence(x, prep["lengths"], enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out)  # [T, B, 2H]
        states = padded.transpose(0, 1)[prep["mask"][:, :padded.shape[0]]]  # batch-major
        a = torch.tanh(F.linear(states, p["bilstm.hidden"], p["bilstm.hidden.b"]))
        logits = F.linear(a, p["bilstm.out"], p["bilstm.out.b"])
        return F.cross_entropy(logits, prep["tags"], reduction="sum")


class BiLSTMUnbatched(hand_batched.PerInstance):
    """The BiLSTM tagger in plain per-instance PyTorch: per sentence, four recurrences of
    single-token LSTM steps (edbatch's ``[i f o u] = W [x; h] + b``), then a per-token MLP
    loss (``prepare`` has nothing to do)."""

    def forward(self, instances: Sequence[Any]) -> Tensor:
        p = self.params
        hidden = self.wl.hidden_dim
        zero = p["bilstm.out"].new_zeros(hidden)

        def run(name: str, xs: list[Tensor], steps: range) -> list[Tensor]:
            w, b = p[f"bilstm.{name}"], p[f"bilstm.{name}.b"]
            h, c, out = zero, zero, [zero] * len(xs)
            for t in steps:
                h, c = hand_batched.lstm_step(xs[t], h, c, w, b)
                out[t] = h
            return out

        losses: list[Tensor] = []
        for inst in instances:
            n = len(inst)
            xs = [F.embedding(torch.tensor(int(w)), p["bilstm.emb"], sparse=True)
                  for w in inst.word_ids]
            f1, b1 = run("l1_fwd", xs, range(n)), run("l1_bwd", xs, range(n - 1, -1, -1))
            x2 = [torch.cat([f, b]) for f, b in zip(f1, b1, strict=True)]
            f2, b2 = run("l2_fwd", x2, range(n)), run("l2_bwd", x2, range(n - 1, -1, -1))
            for t, tag in enumerate(inst.tag_ids):
                a = torch.tanh(F.linear(torch.cat([f2[t], b2[t]]), p["bilstm.hidden"],
                                        p["bilstm.hidden.b"]))
                logits = F.linear(a, p["bilstm.out"], p["bilstm.out.b"])
                losses.append(F.cross_entropy(logits[None], torch.tensor([int(tag)]),
                                              reduction="sum"))
        return torch.stack(losses).sum()


#: The hand-batched model of this workload.
HandBatched = BiLSTMPacked
#: The per-instance PyTorch model of this workload (the ``pytorch_unbatched`` contender).
Unbatched = BiLSTMUnbatched
