"""A BiLSTM POS tagger with character-composed rare words, written through ``edbatch.api``.

``python examples/char_tagger.py --sentences 2000 --epochs 1``: DyNet's char-BiLSTM tagger
(Neubig, Goldberg, Dyer 2017) written per sentence, as a user writes it. A word seen fewer
than ``min_count`` times in EWT train is read by a forward and a backward character LSTM
over ``<w> c_1 .. c_k <w>`` and represented by their final ``h`` concatenated; every other
word is looked up. A sentence BiLSTM reads the words and an MLP scores the 17 UPOS tags.
Every mini-batch of sentences is recorded, scheduled and run batched by edbatch; Adam trains
it. Prints the training loss per epoch and the dev UPOS accuracy. Embeddings start random.

The same model, workload-side (kernels, graphs, a training script), is
``edbatch.workloads.bilstm_char_tagger`` and ``python -m experiments.train_tagger``.
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
from edbatch.data.ud import UPOS_TAGS, DepSentence, load_conllu
from edbatch.data.vocab import CharVocab, FrequentWords
from edbatch.workloads.base import DATA_DIR

__all__ = ["CharTagger", "Compose", "LSTMStep", "TagScorer", "main"]


class LSTMStep(nn.Module):
    """One LSTM step: ``(x, [h; c]) -> [h'; c']`` (an ``nn.LSTMCell`` on packed states)."""

    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(in_dim, hidden)

    def forward(self, x: Tensor, state: Tensor) -> Tensor:
        h, c = self.cell(x, (state[:, :self.hidden], state[:, self.hidden:]))
        return torch.cat([h, c], dim=1)


class Compose(nn.Module):
    """A rare word: the ``h`` of the final forward and backward character states."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, fwd: Tensor, bwd: Tensor) -> Tensor:
        return torch.cat([fwd[:, :self.hidden], bwd[:, :self.hidden]], dim=1)


class TagScorer(nn.Module):
    """``O tanh(W [h_f; h_b] + b) + b_O`` over the tags; ``forward`` is its NLL per word."""

    def __init__(self, hidden: int, mlp: int, tags: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.mlp, self.out = nn.Linear(2 * hidden, mlp), nn.Linear(mlp, tags)

    def logits(self, fwd: Tensor, bwd: Tensor) -> Tensor:
        x = torch.cat([fwd[:, :self.hidden], bwd[:, :self.hidden]], dim=1)
        return self.out(torch.tanh(self.mlp(x)))

    def forward(self, fwd: Tensor, bwd: Tensor, tags: Tensor) -> Tensor:
        return F.cross_entropy(self.logits(fwd, bwd), tags, reduction="none")


class CharTagger(nn.Module):
    """Per-sentence code; the whole mini-batch runs batched by edbatch."""

    def __init__(self, words: FrequentWords, chars: CharVocab, char_dim: int = 32,
                 word_dim: int = 128, hidden: int = 128, mlp: int = 64,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        half = word_dim // 2
        self.words, self.chars = words, chars
        self.char_embed = nn.Embedding(len(chars), char_dim)
        self.word_embed = nn.Embedding(len(words), word_dim)  # row 0 unused (rare words)
        self.char_fwd, self.char_bwd = LSTMStep(char_dim, half), LSTMStep(char_dim, half)
        self.fwd, self.bwd = LSTMStep(word_dim, hidden), LSTMStep(word_dim, hidden)
        self.scorer = TagScorer(hidden, mlp, len(UPOS_TAGS))
        self.to(dtype)
        self.register_buffer("char_zero", torch.zeros(2 * half, dtype=dtype))
        self.register_buffer("zero", torch.zeros(2 * hidden, dtype=dtype))
        b = self.batch = DynamicBatch(dtype=dtype)
        self.cf = b.cell(self.char_fwd, "char_fwd", [char_dim, 2 * half], 2 * half)
        self.cb = b.cell(self.char_bwd, "char_bwd", [char_dim, 2 * half], 2 * half)
        self.compose = b.cell(Compose(half), "compose", [2 * half, 2 * half], word_dim)
        self.wf = b.cell(self.fwd, "fwd", [word_dim, 2 * hidden], 2 * hidden)
        self.wb = b.cell(self.bwd, "bwd", [word_dim, 2 * hidden], 2 * hidden)
        self.loss = b.cell(self.scorer, "loss", [2 * hidden, 2 * hidden], (), takes_attr=True)

    def word(self, word: str) -> Handle:
        """A frequent word's embedding, or a rare word composed from its characters."""
        if not self.words.is_rare(word):
            return self.batch.lookup(self.word_embed, self.words.id(word), name="word")
        cs = [self.batch.lookup(self.char_embed, c, name="char")
              for c in self.chars.encode(word, boundaries=True)]
        f = self.batch.input(self.char_zero)
        for c in cs:
            f = self.cf(c, f)
        b = self.batch.input(self.char_zero)
        for c in reversed(cs):
            b = self.cb(c, b)
        return self.compose(f, b)

    def encode(self, sentence: DepSentence) -> tuple[list[Handle], list[Handle]]:
        """The sentence BiLSTM's forward and backward state of every word."""
        xs = [self.word(w) for w in sentence.words]
        fwd: list[Handle] = []
        s = self.batch.input(self.zero)
        for x in xs:
            s = self.wf(x, s)
            fwd.append(s)
        bwd: list[Handle] = []
        s = self.batch.input(self.zero)
        for x in reversed(xs):
            s = self.wb(x, s)
            bwd.append(s)
        return fwd, bwd[::-1]

    def record(self, sentences: Sequence[DepSentence]) -> list[tuple[list[Handle],
                                                                      list[Handle]]]:
        """Record every sentence's graph and per-word losses; return the word states."""
        states = []
        for sentence in sentences:
            with self.batch.instance():
                fwd, bwd = self.encode(sentence)
                for f, b, tag in zip(fwd, bwd, sentence.upos, strict=True):
                    self.batch.add_loss(self.loss(f, b, attr=UPOS_TAGS.index(tag)))
                states.append((fwd, bwd))
        return states

    def predict(self, sentences: Sequence[DepSentence]) -> list[list[int]]:
        """The argmax tag id of every word (batched, no grad)."""
        states = self.record(sentences)
        handles = [h for fwd, bwd in states for h in (*fwd, *bwd)]
        out = self.batch.run("dynet_agenda", outputs=handles, grad=False)
        tags = []
        for fwd, bwd in states:
            with torch.no_grad():
                logits = self.scorer.logits(out.stack(fwd), out.stack(bwd))
            tags.append(logits.argmax(1).tolist())
        return tags


def accuracy(model: CharTagger, sentences: Sequence[DepSentence], chunk: int = 256) -> float:
    """UPOS accuracy over ``sentences``."""
    right = total = 0
    for lo in range(0, len(sentences), chunk):
        part = sentences[lo:lo + chunk]
        for sentence, tags in zip(part, model.predict(part), strict=True):
            right += sum(UPOS_TAGS[t] == g for t, g in zip(tags, sentence.upos, strict=True))
            total += len(sentence)
    return right / total


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    """Run the example; return the training loss per epoch and the dev accuracy."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=positive, default=2000, help="EWT train sentences to use")
    p.add_argument("--dev", type=positive, default=500, help="EWT dev sentences to score")
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--epochs", type=positive, default=1)
    p.add_argument("--dim", type=positive, default=64, help="word embedding and LSTM size")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    all_train = load_conllu(DATA_DIR / "ud_ewt" / "en_ewt-ud-train.conllu")
    train = all_train[:args.sentences]
    dev = load_conllu(DATA_DIR / "ud_ewt" / "en_ewt-ud-dev.conllu")[:args.dev]
    words = FrequentWords.from_sentences(s.words for s in all_train)
    chars = CharVocab.from_words(w for s in all_train for w in s.words)
    model = CharTagger(words, chars, 16, args.dim, args.dim, 32)
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
        losses.append(total / sum(len(s) for s in train))
        acc = accuracy(model, dev)
        print(f"epoch {epoch}: train loss/word {losses[-1]:.4f}   dev UPOS accuracy "
              f"{acc:.4f}   ({time.perf_counter() - start:.1f}s)")
    return {"losses": losses, "dev_accuracy": acc}


if __name__ == "__main__":
    run(main)
