"""The PyTorch contenders of the two decoding demonstrations, and edbatch's inference program
for early exit (the greedy decoder's is ``examples/greedy_decode.py``'s ``Decoder.program``).

**Greedy decoding** of the seq2seq workload (:mod:`edbatch.workloads.seq2seq`, its cell
parameters): encode the source from a zero state, then from ``<s>`` feed back the argmax of
``W_out h + b_out`` until ``</s>`` or the sentence's step limit. Every contender returns each
sentence's output token ids (``</s>`` included when reached).

* :func:`greedy_unbatched`: per sentence, per token, ``[1, H]`` tensors, ``argmax().item()``.
* :func:`greedy_hand`: what a practitioner vectorises by hand: the encoder's input
  projections of every source token at once; the sources sorted by length so that the
  sentences still encoding at step ``t`` are a prefix (as ``pack_padded_sequence`` does);
  then one decoder step for all unfinished sentences per position, the finished ones
  dropped from the state by a boolean mask.

**Early exit** (``examples/early_exit.py``'s model at inference): an Elman RNN reads one word
at a time and stops after the first word whose class probabilities' maximum passes the
threshold (or at the last word). Every contender returns ``(words read, predicted class)``
per sentence: :func:`exit_unbatched` (per sentence and word), :func:`exit_hand` (all
still-reading sentences one step per position, masks) and :func:`exit_program` (the
edbatch per-sentence program for :meth:`~edbatch.api.DynamicBatch.run_programs`).

No timing here: ``benchmarks/decode_peers.py`` interleaves the contenders.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Weights", "exit_hand", "exit_program", "exit_unbatched", "greedy_hand",
           "greedy_unbatched"]

Output = list[list[int]]


class Weights:
    """The seq2seq cell parameters under short names, detached (inference)."""

    def __init__(self, params: Mapping[str, Tensor]) -> None:
        p = {k.removeprefix("seq2seq."): v.detach() for k, v in params.items()}
        self.src_emb, self.tgt_emb = p["src_emb"], p["tgt_emb"]
        self.enc = (p["enc_e2h"], p["enc_e2h.b"], p["enc_lstm"], p["enc_lstm.b"])
        self.dec = (p["dec_e2h"], p["dec_e2h.b"], p["dec_lstm"], p["dec_lstm.b"])
        self.out, self.out_b = p["out"], p["out.b"]
        self.hidden = self.out.shape[1]


def _step(x_emb: Tensor, h: Tensor, c: Tensor, w: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """``x = tanh(W_e e + b_e)``; ``[i f o u] = W [x; h] + b``; the LSTM update."""
    w_e, b_e, w, b = w
    return _lstm(torch.tanh(F.linear(x_emb, w_e, b_e)), h, c, w, b)


def _lstm(x: Tensor, h: Tensor, c: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    hid = h.shape[1]
    g = F.linear(torch.cat([x, h], 1), w, b)
    i, f, o = torch.sigmoid(g[:, :3 * hid]).split(hid, 1)
    c2 = f * c + i * torch.tanh(g[:, 3 * hid:])
    return o * torch.tanh(c2), c2


# ---------------------------------------------------------------------- greedy decoding
def greedy_unbatched(w: Weights, sources: Sequence[Sequence[int]], limits: Sequence[int],
                     bos: int, eos: int) -> Output:
    """Each sentence alone, token by token (the per-instance reference)."""
    outputs = []
    for source, limit in zip(sources, limits, strict=True):
        h = c = w.out.new_zeros(1, w.hidden)
        for token in source:
            h, c = _step(w.src_emb[token:token + 1], h, c, w.enc)
        prev, out = bos, []
        for _ in range(limit):
            h, c = _step(w.tgt_emb[prev:prev + 1], h, c, w.dec)
            prev = int(F.linear(h, w.out, w.out_b).argmax())
            out.append(prev)
            if prev == eos:
                break
        outputs.append(out)
    return outputs


def greedy_hand(w: Weights, sources: Sequence[Sequence[int]], limits: Sequence[int],
                bos: int, eos: int) -> Output:
    """Hand-batched: one step for all unfinished sentences, masks (module docstring)."""
    n = len(sources)
    order = sorted(range(n), key=lambda i: -len(sources[i]))
    lens = [len(sources[i]) for i in order]
    tokens = torch.zeros(n, max(lens, default=0), dtype=torch.long)
    for row, i in enumerate(order):
        tokens[row, :lens[row]] = torch.tensor(sources[i], dtype=torch.long)
    w_e, b_e, w_x, b_x = w.enc
    xs = torch.tanh(F.linear(w.src_emb[tokens], w_e, b_e))  # every source token at once
    h = w.out.new_zeros(n, w.hidden)
    c = torch.zeros_like(h)
    active = n
    for t in range(tokens.shape[1]):
        while lens[active - 1] <= t:  # sorted by length: the encoding ones are a prefix
            active -= 1
        h[:active], c[:active] = _lstm(xs[:active, t], h[:active], c[:active], w_x, b_x)
    limit = torch.tensor([limits[i] for i in order], dtype=torch.long)
    alive = torch.arange(n)
    prev = torch.full((n,), bos, dtype=torch.long)
    out = torch.full((n, max(limits, default=0)), -1, dtype=torch.long)
    step = 0
    while len(alive):
        h, c = _step(w.tgt_emb[prev], h, c, w.dec)
        prev = F.linear(h, w.out, w.out_b).argmax(1)
        out[alive, step] = prev
        step += 1
        keep = (prev != eos) & (limit > step)
        if not bool(keep.all()):
            alive, prev, h, c, limit = alive[keep], prev[keep], h[keep], c[keep], limit[keep]
    rows = out.tolist()
    outputs: Output = [[] for _ in range(n)]
    for row, i in enumerate(order):
        r = rows[row]
        outputs[i] = r[:r.index(-1)] if -1 in r else r
    return outputs


# ---------------------------------------------------------------------- early exit
Decision = tuple[int, int]


def exit_unbatched(model: Any, sentences: Sequence[Sequence[int]]) -> list[Decision]:
    """Each sentence alone, word by word (the per-instance reference)."""
    emb, out = model.embed.weight.detach(), []
    for words in sentences:
        h = emb.new_zeros(1, model.dim)
        for t, word in enumerate(words):
            h = model.step(h, emb[word:word + 1])
            p = torch.softmax(model.out(h), 1)[0]
            if p.max() > model.threshold or t == len(words) - 1:
                out.append((t + 1, int(p.argmax())))
                break
    return out


def exit_hand(model: Any, sentences: Sequence[Sequence[int]]) -> list[Decision]:
    """Hand-batched: every still-reading sentence one step per position (masks)."""
    n = len(sentences)
    lens = torch.tensor([len(s) for s in sentences], dtype=torch.long)
    words = torch.zeros(n, int(lens.max()), dtype=torch.long)
    for i, s in enumerate(sentences):
        words[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    xs = model.embed.weight.detach()[words]
    alive = torch.arange(n)
    h = xs.new_zeros(n, model.dim)
    read = torch.zeros(n, dtype=torch.long)
    pred = torch.zeros(n, dtype=torch.long)
    t = 0
    while len(alive):
        h = model.step(h, xs[alive, t])
        conf, arg = torch.softmax(model.out(h), 1).max(1)
        t += 1
        stop = (conf > model.threshold) | (lens[alive] == t)
        if bool(stop.any()):
            done = alive[stop]
            read[done], pred[done] = t, arg[stop]
            keep = ~stop
            alive, h = alive[keep], h[keep]
    return list(zip(read.tolist(), pred.tolist(), strict=True))


def exit_program(model: Any, words: Sequence[int]) -> Generator[Any, Tensor, Decision]:
    """The edbatch program of one sentence: read until confident; (read, class)."""
    b = model.batch
    h = b.input(model.embed.weight.new_zeros(model.dim))
    for t, word in enumerate(words):
        h = model.c_step(h, b.lookup(model.embed, word))
        p = yield model.c_probs(h)
        if p.max() > model.threshold or t == len(words) - 1:
            return t + 1, int(p.argmax())
    raise ValueError("exit_program: an empty sentence has no decision; drop empty sentences")
