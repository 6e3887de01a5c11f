"""The benchmark peers of ``bilstm_char_tagger``: the BiLSTM tagger with char-composed rare words.

* ``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`), node
  for node the workload's cell graph;
* ``HandBatched``: hand-batched PyTorch as a practitioner writes it
  (:mod:`benchmarks.hand_batched`): one bidirectional ``nn.LSTM`` over the packed
  characters of every rare-word occurrence of the mini-batch (its final states composed),
  then one bidirectional ``nn.LSTM`` over the packed sentences, the MLP loss on every word;
* ``Unbatched`` (:func:`unbatched_loss`): **unbatched per-instance PyTorch**, one sentence, word and
  character at a time (the baseline the seeds' speedups divide by).

All read the workload's parameters (``init_params``) and return its loss. The DyNet peer is
``benchmarks/peers/dynet/bilstm_char_tagger.py``.
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

__all__ = ["CharTaggerPacked", "CharTaggerUnbatched", "HandBatched", "Unbatched", "record",
           "unbatched_loss"]

_P = "char_tagger"


def record(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """Per sentence: each rare word's character BiLSTM and composition, the sentence
    BiLSTM, one loss per word (the op order of the workload's builder)."""
    char, word, compose, loss = (batch.op(f"{_P}.{n}") for n in ("char", "word", "compose",
                                                                   "loss"))
    char_zero, zero = batch.op(f"{_P}.char_zero"), batch.op(f"{_P}.zero")
    cf, cb, lf, lb = (batch.op(f"{_P}.{d}") for d in ("char_fwd", "char_bwd", "fwd", "bwd"))
    add_loss = batch.add_loss
    for inst in instances:
        n = len(inst)
        with batch.instance():
            xs = []
            for w, chars in zip(inst.word_ids, inst.char_ids, strict=True):
                if chars is None:
                    xs.append(word(attr=w))
                    continue
                es = [char(attr=c) for c in chars]
                f = char_zero()
                for e in es:
                    f = cf(e, f)
                b = char_zero()
                for e in reversed(es):
                    b = cb(e, b)
                xs.append(compose(f, b))
            fs, bs = [None] * n, [None] * n
            s = zero()
            for t in range(n):
                s = fs[t] = lf(xs[t], s)
            s = zero()
            for t in reversed(range(n)):
                s = bs[t] = lb(xs[t], s)
            for t, tag in enumerate(inst.tag_ids):
                add_loss(loss(fs[t], bs[t], attr=tag))


def _torch_gate_order(w: Tensor) -> Tensor:
    """edbatch's gate blocks ``i f o u`` -> torch's ``i f g o`` (along dim 0)."""
    i, f, o, u = w.chunk(4, 0)
    return torch.cat([i, f, u, o], 0)


def _bilstm(params: Mapping[str, Tensor], fwd: str, bwd: str, in_dim: int, hidden: int
            ) -> nn.LSTM:
    """A 1-layer bidirectional ``nn.LSTM`` holding the weights ``fwd`` and ``bwd``."""
    like = params[fwd]
    lstm = nn.LSTM(in_dim, hidden, bidirectional=True).to(like.dtype)
    with torch.no_grad():
        for name, suffix in ((fwd, ""), (bwd, "_reverse")):
            w, b = _torch_gate_order(params[name].detach()), _torch_gate_order(
                params[f"{name}.b"].detach())
            getattr(lstm, f"weight_ih_l0{suffix}").copy_(w[:, :in_dim])
            getattr(lstm, f"weight_hh_l0{suffix}").copy_(w[:, in_dim:])
            getattr(lstm, f"bias_ih_l0{suffix}").copy_(b)
            getattr(lstm, f"bias_hh_l0{suffix}").zero_()
    return lstm.requires_grad_(like.requires_grad)


def _padded(seqs: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Time-major ``[T, B]`` ids (0-padded) and the lengths."""
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    ids = np.zeros((int(lengths.max()), len(seqs)), dtype=np.int64)
    mask = np.arange(ids.shape[0])[:, None] < lengths[None, :]
    ids.T[mask.T] = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
    return torch.from_numpy(ids), torch.from_numpy(lengths)


class CharTaggerPacked(hand_batched.HandBatched):
    """Packed ``nn.LSTM`` over the rare words' characters, then over the sentences."""

    def __init__(self, wl: Any, params: Mapping[str, Tensor]) -> None:
        super().__init__(wl, params)
        self.half = wl.embed_dim // 2
        self.chars = _bilstm(params, f"{_P}.char_fwd", f"{_P}.char_bwd", wl.char_dim,
                             self.half)
        self.words = _bilstm(params, f"{_P}.fwd", f"{_P}.bwd", wl.embed_dim, wl.hidden_dim)

    def parameters(self) -> list[Tensor]:
        keep = (f"{_P}.cemb", f"{_P}.emb", f"{_P}.hidden", f"{_P}.hidden.b", f"{_P}.out",
                f"{_P}.out.b")
        return ([self.params[k] for k in keep] + list(self.chars.parameters())
                + list(self.words.parameters()))

    def prepare(self, instances: Sequence[Any]) -> dict[str, Any]:
        rare = [c for inst in instances for c in inst.char_ids if c is not None]
        flat = [c is not None for inst in instances for c in inst.char_ids]
        words, lengths = _padded([inst.word_ids for inst in instances])
        prep = {"words": words, "lengths": lengths,
                "mask": torch.arange(words.shape[0])[None, :] < lengths[:, None],
                "rare": torch.from_numpy(np.flatnonzero(flat)),
                "tags": torch.from_numpy(np.concatenate([inst.tag_ids for inst in instances]))}
        if rare:
            prep["chars"], prep["char_lengths"] = _padded(rare)
        return prep

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p, mask = self.params, prep["mask"]
        x = F.embedding(prep["words"], p[f"{_P}.emb"], sparse=True)  # [T, B, E]
        x = x.transpose(0, 1)[mask]  # every word, batch-major
        if "chars" in prep:
            c = F.embedding(prep["chars"], p[f"{_P}.cemb"], sparse=True)
            packed = nn.utils.rnn.pack_padded_sequence(c, prep["char_lengths"],
                                                       enforce_sorted=False)
            _, (h_n, _) = self.chars(packed)  # [2, R, Hc]: final fwd, final bwd
            x = x.index_copy(0, prep["rare"], torch.cat([h_n[0], h_n[1]], dim=1))
        padded_x = x.new_zeros(mask.shape[1], mask.shape[0], x.shape[1])
        padded_x.transpose(0, 1)[mask] = x
        packed = nn.utils.rnn.pack_padded_sequence(padded_x, prep["lengths"],
                                                   enforce_sorted=False)
        out, _ = self.words(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out)  # [T, B, 2H]
        states = padded.transpose(0, 1)[mask[:, :padded.shape[0]]]
        a = torch.tanh(F.linear(states, p[f"{_P}.hidden"], p[f"{_P}.hidden.b"]))
        logits = F.linear(a, p[f"{_P}.out"], p[f"{_P}.out.b"])
        return F.cross_entropy(logits, prep["tags"], reduction="sum")


#: The hand-batched model of this workload.
HandBatched = CharTaggerPacked


def unbatched_loss(instances: Sequence[Any], params: Mapping[str, Tensor]) -> Tensor:
    """The summed loss computed one sentence, word and character at a time."""
    p = params
    cells = {d: (p[f"{_P}.{d}"], p[f"{_P}.{d}.b"]) for d in ("char_fwd", "char_bwd", "fwd",
                                                             "bwd")}

    def run(cell: str, xs: Sequence[Tensor]) -> list[Tensor]:
        w, b = cells[cell]
        h = c = w.new_zeros(w.shape[0] // 4)
        out = []
        for x in xs:
            h, c = hand_batched.lstm_step(x, h, c, w, b)
            out.append(h)
        return out

    total = p[f"{_P}.out.b"].new_zeros(())
    for inst in instances:
        xs = []
        for w, chars in zip(inst.word_ids, inst.char_ids, strict=True):
            if chars is None:
                xs.append(p[f"{_P}.emb"][w])
                continue
            es = [p[f"{_P}.cemb"][c] for c in chars]
            xs.append(torch.cat([run("char_fwd", es)[-1], run("char_bwd", es[::-1])[-1]]))
        fs, bs = run("fwd", xs), run("bwd", xs[::-1])[::-1]
        for f, b, tag in zip(fs, bs, inst.tag_ids, strict=True):
            a = torch.tanh(F.linear(torch.cat([f, b]), p[f"{_P}.hidden"], p[f"{_P}.hidden.b"]))
            logits = F.linear(a, p[f"{_P}.out"], p[f"{_P}.out.b"])
            total = total - torch.log_softmax(logits, 0)[tag]
    return total


class CharTaggerUnbatched(hand_batched.PerInstance):
    """:func:`unbatched_loss` as a benchmark contender (``prepare`` has nothing to do)."""

    def forward(self, prepared: Sequence[Any]) -> Tensor:
        return unbatched_loss(prepared, self.params)


#: The per-instance PyTorch model of this workload (the ``pytorch_unbatched`` contender).
Unbatched = CharTaggerUnbatched
