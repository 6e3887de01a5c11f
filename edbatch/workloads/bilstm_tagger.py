"""BiLSTM tagger (ED-Batch's ``bilstm_tagger``) over the WikiNER sentences of ``data/tags/``
(default) or the UPOS tags of UD English EWT (``data="ewt"``, ``data/ud_ewt/``).

The model (docs/architecture.md 3.10): word embeddings ``x_t = E[w_t]``; a 2-layer
bidirectional LSTM whose second layer reads ``[f1_t; b1_t]`` (the first layer's forward and
backward ``h``); and per token the loss block ``pick_neg_log_softmax(O tanh(H [f2_t; b2_t] +
b_H) + b_O, tag_t)``. Every LSTM (one per layer and direction, each with its own weights) is
``[i f o u] = W [x; h] + b``, ``c' = sigmoid(f)*c + sigmoid(i)*tanh(u)``, ``h' =
sigmoid(o)*tanh(c')``, from a zero initial state.

**Splits.** The benchmark's ``train.txt`` is missing from the data snapshot, so the one file
``tags/dev.txt`` is split deterministically in file order: ``"train"`` is the first 80% of
its sentences (``[0, n*8//10)``), ``"dev"`` the next 10% (``[n*8//10, n*9//10)``) and
``"test"`` the rest. The word vocabulary is built from the train part only (by descending
frequency, ties by word; id 0 is the unknown word), the tag vocabulary from every tag of the
file (sorted), so dev and test labels are always in range. With ``data="ewt"`` the splits are
EWT's own train/dev/test files (:func:`~edbatch.data.ud.load_conllu`, syntactic words,
sentences up to ``DEFAULT_MAX_WORDS`` words), the word vocabulary comes from its train file
and the tags are the 17 UPOS tags (:data:`~edbatch.data.ud.UPOS_TAGS`).

Op types at cell granularity (``S = (2H,)`` is a state ``[h; c]``):

* ``bilstm.lookup``: no operands, ``attr`` = word id, output ``(E,)``.
* ``bilstm.zero_state``: no operands, the zero initial state of one (layer, direction);
  four per sentence, all batching together.
* ``bilstm.l1_fwd`` / ``bilstm.l1_bwd``: operands ``(x_t, previous state)``.
* ``bilstm.l2_fwd`` / ``bilstm.l2_bwd``: operands ``(f1_t, b1_t, previous state)``; the cell
  concatenates the ``h`` parts of ``f1_t`` and ``b1_t`` into its input.
* ``bilstm.loss``: operands ``(f2_t, b2_t)``, ``attr`` = tag id, output ``(1,)``.
* ``loss_sum``.

At primitive granularity: lookups, ``zero/H`` initial ``h`` and ``c`` per (layer, direction),
:func:`~edbatch.workloads.primitives.emit_lstm` cells, one ``concat`` per position for the
layer-2 input (shared by both directions) and one for the loss input, then ``affine`` H,
``tanh``, ``affine`` O and ``pick_nll``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edbatch.data.tags import TaggedSentence, load_tagged
from edbatch.data.ud import UPOS_TAGS, load_conllu
from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.graph import GraphBuilder
from edbatch.workloads._seq import (
    PrimitiveLSTM,
    affine_params,
    check_positive,
    declare_cell,
    frequency_index,
    lstm_params,
    unroll,
)
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["BiLSTMTagger", "TaggedInstance", "split_bounds"]

_SPLITS = ("train", "dev", "test")
_DIRECTIONS = ("l1_fwd", "l1_bwd", "l2_fwd", "l2_bwd")
#: The data options: WikiNER's one file cut 80/10/10, or EWT's train/dev/test UPOS files.
DATA = ("wikiner", "ewt")


@dataclass(frozen=True, slots=True, eq=False)
class TaggedInstance:
    """A tagged sentence with its word and tag ids pre-computed.

    Attributes:
        sentence: the parsed sentence.
        word_ids: word id per token (0 = unknown).
        tag_ids: tag id per token.
    """

    sentence: TaggedSentence
    word_ids: tuple[int, ...]
    tag_ids: tuple[int, ...]

    def __len__(self) -> int:
        """Number of tokens."""
        return len(self.word_ids)


def split_bounds(num_sentences: int) -> dict[str, tuple[int, int]]:
    """The ``[start, stop)`` sentence range of each split: 80% / 10% / 10% in file order."""
    a, b = num_sentences * 8 // 10, num_sentences * 9 // 10
    return {"train": (0, a), "dev": (a, b), "test": (b, num_sentences)}


class BiLSTMTagger(Workload):
    """2-layer BiLSTM tagger with an MLP loss per token.

    Example:
        >>> w = BiLSTMTagger()
        >>> w.splits, len(w.load("train")) + len(w.load("dev")) + len(w.load("test"))
        (('train', 'dev', 'test'), 1696)
        >>> g = w.minibatch("train", range(1))
        >>> g.num_nodes == 6 * len(w.load("train")[0]) + 4 + 1
        True
    """

    name = "bilstm_tagger"
    real_data = True
    hand_backward = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small embeddings and states."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden}

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int | None = None, data_dir: str | Path | None = None,
                 data: str = "wikiner") -> None:
        """Read the data, build the word and tag vocabularies, declare the ops.

        Args:
            granularity: ``"cell"`` (one op per LSTM cell) or ``"primitive"`` (DyNet ops).
            embed_dim: word embedding size ``E``.
            hidden_dim: LSTM hidden size ``H`` (also the loss MLP's hidden size).
            vocab_size: number of word ids including the unknown id 0 (the most frequent
                ``vocab_size - 1`` train words are kept); ``None`` keeps every train word.
            data_dir: folder holding ``tags/dev.txt`` (or ``ud_ewt/``); defaults to the
                repository's ``data/``.
            data: ``"wikiner"`` (``tags/dev.txt`` cut 80/10/10) or ``"ewt"`` (UD English
                EWT's train/dev/test files, UPOS tags).
        """
        super().__init__(granularity, data_dir)
        check_positive(embed_dim=embed_dim, hidden_dim=hidden_dim, vocab_size=vocab_size)
        if data not in DATA:
            raise UnknownNameError(f"unknown data {data!r} for bilstm_tagger; expected one of "
                                   f"{list(DATA)}." + did_you_mean(data, DATA))
        self.embed_dim, self.hidden_dim, self.data = embed_dim, hidden_dim, data
        if data == "ewt":
            self._split_sentences = {s: [TaggedSentence(d.words, d.upos) for d in load_conllu(
                self.data_dir / "ud_ewt" / f"en_ewt-ud-{s}.conllu")] for s in _SPLITS}
        else:
            sentences = load_tagged(self.data_dir / "tags" / "dev.txt")
            self._split_sentences = {s: sentences[lo:hi] for s, (lo, hi)
                                     in split_bounds(len(sentences)).items()}
        train = self._split_sentences["train"]
        self.word_index = frequency_index((w for s in train for w in s.words), vocab_size)
        self.tag_names = UPOS_TAGS if data == "ewt" else tuple(sorted(
            {t for sents in self._split_sentences.values() for s in sents for t in s.tags}))
        self.tag_index = {t: i for i, t in enumerate(self.tag_names)}
        self.num_words = len(self.word_index) + 1
        self._declare_vocab()
        if self.granularity == "cell":
            ids = self.vocab.id
            self._lookup_id, self._zero_id = ids("bilstm.lookup"), ids("bilstm.zero_state")
            self._cell_ids = tuple(ids(f"bilstm.{d}") for d in _DIRECTIONS)
            self._loss_id = ids("bilstm.loss")

    # ------------------------------------------------------------------ vocabulary
    def _loss_params(self) -> dict[str, tuple[int, ...]]:
        h = self.hidden_dim
        return {**affine_params("bilstm.hidden", 2 * h, h),
                **affine_params("bilstm.out", h, len(self.tag_names))}

    def _declare_cells(self, ops: OpSet) -> None:
        e, h = self.embed_dim, self.hidden_dim
        state = (2 * h,)
        emb = {"bilstm.emb": (self.num_words, e)}
        declare_cell(ops, "bilstm.lookup", (), (e,), emb)
        declare_cell(ops, "bilstm.zero_state", (), state)
        for d in _DIRECTIONS:
            if d.startswith("l1"):
                declare_cell(ops, f"bilstm.{d}", ((e,), state), state,
                             lstm_params(f"bilstm.{d}", e, h))
            else:
                declare_cell(ops, f"bilstm.{d}", (state, state, state), state,
                             lstm_params(f"bilstm.{d}", 2 * h, h))
        declare_cell(ops, "bilstm.loss", (state, state), (1,), self._loss_params())

    def _declare_primitives(self, ops: OpSet) -> None:
        e, h = self.embed_dim, self.hidden_dim
        self._lookup = ops.lookup("bilstm.emb", self.num_words, e)
        self._cells = tuple(
            PrimitiveLSTM.declare(ops, f"bilstm.{d}", e if d.startswith("l1") else 2 * h, h)
            for d in _DIRECTIONS)
        self._concat = ops.concat(h, h)
        self._hidden = ops.affine("bilstm.hidden", 2 * h, h)
        self._tanh = ops.unary("tanh", h)
        self._out = ops.affine("bilstm.out", h, len(self.tag_names))
        self._pick = ops.pick_nll(len(self.tag_names))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (identical at both granularities)."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``: 80/10/10% of ``tags/dev.txt`` in file order, or
        EWT's three files."""
        return _SPLITS

    def _load(self, split: str) -> Sequence[TaggedInstance]:
        words, tags = self.word_index, self.tag_index
        return [TaggedInstance(s, tuple([words.get(w, 0) for w in s.words]),
                               tuple([tags[t] for t in s.tags]))
                for s in self._split_sentences[split]]

    # ------------------------------------------------------------------ emission
    def emit(self, instance: TaggedInstance, builder: GraphBuilder) -> list[int]:
        """Append one sentence's nodes; return its per-token loss node ids."""
        if self.granularity == "cell":
            return self._emit_cells(instance, builder)
        return self._emit_primitives(instance, builder)

    def _emit_cells(self, inst: TaggedInstance, b: GraphBuilder) -> list[int]:
        add, zero, n = b.add, self._zero_id, len(inst)
        l1f, l1b, l2f, l2b = self._cell_ids
        xs = [add(self._lookup_id, attr=w) for w in inst.word_ids]
        f1 = unroll(add(zero), lambda t, s: add(l1f, xs[t], s), n)
        b1 = unroll(add(zero), lambda t, s: add(l1b, xs[t], s), n, backward=True)
        f2 = unroll(add(zero), lambda t, s: add(l2f, f1[t], b1[t], s), n)
        b2 = unroll(add(zero), lambda t, s: add(l2b, f1[t], b1[t], s), n, backward=True)
        loss = self._loss_id
        return [add(loss, f, bk, attr=tag) for f, bk, tag in zip(f2, b2, inst.tag_ids,
                                                                 strict=True)]

    def _emit_primitives(self, inst: TaggedInstance, b: GraphBuilder) -> list[int]:
        add, n = b.add, len(inst)
        l1f, l1b, l2f, l2b = self._cells
        xs = [add(self._lookup, attr=w) for w in inst.word_ids]
        f1 = unroll(l1f.start(b), lambda t, s: l1f.step(b, xs[t], s), n)
        b1 = unroll(l1b.start(b), lambda t, s: l1b.step(b, xs[t], s), n, backward=True)
        x2 = [add(self._concat, f[0], bk[0]) for f, bk in zip(f1, b1, strict=True)]
        f2 = unroll(l2f.start(b), lambda t, s: l2f.step(b, x2[t], s), n)
        b2 = unroll(l2b.start(b), lambda t, s: l2b.step(b, x2[t], s), n, backward=True)
        losses = []
        for f, bk, tag in zip(f2, b2, inst.tag_ids, strict=True):
            hidden = add(self._tanh, add(self._hidden, add(self._concat, f[0], bk[0])))
            losses.append(add(self._pick, add(self._out, hidden), attr=tag))
        return losses
