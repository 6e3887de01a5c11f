"""BiLSTM tagger with character-composed rare words (DyNet's ``bilstm-tagger-withchar``) on
the UPOS tags of UD English EWT, registry name ``"bilstm_char_tagger"``.

The model (Neubig, Goldberg, Dyer 2017, the char-BiLSTM tagger of their autobatching
benchmark), with ``E = embed_dim``, ``Hc = E / 2``, ``H = hidden_dim``, ``M = mlp_dim``:

* **word representation** ``x_t``: a word seen at least ``min_count`` times in EWT train
  (:class:`~edbatch.data.vocab.FrequentWords`, DyNet's ``wc[w] > 5``) is looked up,
  ``x_t = E[w_t]``; every other word (rare or unseen) is read by a character BiLSTM over
  ``<w> c_1 .. c_k <w>`` (character embeddings ``C[c]`` of size ``char_dim``, boundary symbol
  ``<w>``, :class:`~edbatch.data.vocab.CharVocab`) and ``x_t = [h_fwd; h_bwd]``, the final
  ``h`` of the forward and of the backward character LSTM (each of size ``Hc``);
* a 1-layer **sentence BiLSTM** over ``x_1 .. x_n`` (forward ``f_t``, backward ``b_t``);
* per word the **MLP loss** ``pick_neg_log_softmax(O tanh(W [f_t; b_t] + b_W) + b_O, tag_t)``
  over the 17 UPOS tags.

Every LSTM is ``[i f o u] = W [x; h] + b`` from a zero state (as in
:mod:`~edbatch.workloads.bilstm_tagger`). The splits are EWT's train/dev/test files
(:func:`~edbatch.data.ud.load_conllu`: syntactic words; a sentence longer than ``max_words``
is a :class:`~edbatch.errors.DataFormatError` at its ``file:line``). The character vocabulary
is EWT train's; a character never seen there maps to the unknown id (``unknown_chars="unk"``)
or raises a ``DataFormatError`` naming it with the word's ``file:line``
(``unknown_chars="error"``).

Op types at cell granularity (``S = (2H,)``, ``Sc = (2Hc,)`` states ``[h; c]``):

* ``char_tagger.char``: kind ``lookup``, attr = character id, out ``(char_dim,)``;
* ``char_tagger.word``: kind ``lookup``, attr = word id, out ``(E,)``;
* ``char_tagger.char_zero`` / ``char_tagger.zero``: kind ``bilstm.zero_state``, out ``Sc`` /
  ``S`` (one per recurrence: two per rare word, two per sentence);
* ``char_tagger.char_fwd`` / ``char_tagger.char_bwd``: kinds ``bilstm.l1_fwd`` / ``_bwd``,
  operands ``(c, previous state)``, out ``Sc``;
* ``char_tagger.compose``: operands the final forward and backward character states, out
  ``(E,)`` (:mod:`~edbatch.executor.cells_char_tagger`);
* ``char_tagger.fwd`` / ``char_tagger.bwd``: kinds ``bilstm.l1_fwd`` / ``_bwd``, operands
  ``(x_t, previous state)``, out ``S``;
* ``char_tagger.loss``: kind ``bilstm.loss``, operands ``(f_t, b_t)``, attr = tag id;
* ``loss_sum``.

At primitive granularity: the two lookups, ``zero/*`` initial ``h`` and ``c``,
:func:`~edbatch.workloads.primitives.emit_lstm` cells, ``concat`` of the two character ``h``
(the composition) and of ``f_t``, ``b_t`` (the loss input), then ``affine``, ``tanh``,
``affine`` and ``pick_nll``. Both granularities declare the same parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edbatch.data._text import parsed
from edbatch.data.ud import DEFAULT_MAX_WORDS, UPOS_TAGS, DepSentence, Treebank, load_conllu
from edbatch.data.vocab import DEFAULT_MIN_COUNT, CharVocab, FrequentWords, word_counts
from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder
from edbatch.workloads._seq import (
    PrimitiveLSTM,
    affine_params,
    check_positive,
    declare_cell,
    lstm_params,
    unroll,
)
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["BiLSTMCharTagger", "CharTaggedInstance", "read_ewt"]

_P = "char_tagger"
_SPLITS = ("train", "dev", "test")


def read_ewt(path: str, max_words: int) -> Treebank:
    """:func:`load_conllu` of one EWT file (cached per process while the file is unchanged:
    train takes ~2 s)."""
    return parsed(load_conllu, path, max_words=max_words)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, eq=False)
class CharTaggedInstance:
    """A sentence with its ids resolved.

    Attributes:
        sentence: the parsed sentence.
        word_ids: per word, its id, or 0 for a word composed from its characters.
        char_ids: per word, ``None`` for a looked-up word, else its character ids with the
            boundary id 1 before and after.
        tag_ids: per word, its UPOS tag id (an index of :data:`~edbatch.data.ud.UPOS_TAGS`).
    """

    sentence: DepSentence
    word_ids: tuple[int, ...]
    char_ids: tuple[tuple[int, ...] | None, ...]
    tag_ids: tuple[int, ...]

    def __len__(self) -> int:
        """Number of words."""
        return len(self.word_ids)

    @property
    def num_rare(self) -> int:
        """How many words are composed from characters."""
        return sum(c is not None for c in self.char_ids)


class BiLSTMCharTagger(Workload):
    """Char-BiLSTM tagger on EWT UPOS (see the module docstring).

    Args:
        granularity: ``"cell"`` or ``"primitive"``.
        char_dim: character embedding size.
        embed_dim: word embedding size ``E`` (even: a composed word is two ``E/2`` states).
        hidden_dim: sentence LSTM size ``H``.
        mlp_dim: the loss MLP's hidden size ``M``.
        min_count: train occurrences a word needs to be looked up (DyNet: 6, ``> 5``).
        vocab_size: at most this many word ids including id 0 (the most frequent words
            keep theirs; every other word is composed); ``None``: no cap.
        max_words: longest sentence accepted (a longer one is a ``DataFormatError``).
        unknown_chars: ``"unk"`` (map to the unknown character) or ``"error"``.
        data_dir: data root holding ``ud_ewt/``.

    Example:
        >>> wl = BiLSTMCharTagger(char_dim=4, embed_dim=6, hidden_dim=4, mlp_dim=4)
        >>> [len(wl.load(s)) for s in wl.splits], len(wl.words), len(wl.chars)
        ([12544, 2001, 2077], 3505, 110)
        >>> inst = wl.load("test")[0]
        >>> inst.sentence.words, inst.num_rare
        (('What', 'if', 'Google', 'Morphed', 'Into', 'GoogleOS', '?'), 3)
        >>> chars = sum(len(c) for c in inst.char_ids if c is not None)  # with boundaries
        >>> n = len(inst)  # lookups, 3 nodes per character and rare word, 3 per word
        >>> wl.minibatch("test", [0]).num_nodes == (n - 3) + 3 * chars + 3 * 3 + 3 * n + 2 + 1
        True
    """

    name = "bilstm_char_tagger"
    real_data = True
    hand_backward = True
    default_eval_split = "test"

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small sizes (``embed_dim = 2 * (dim // 2)``, 3-wide characters, 4-wide MLP) and
        50 word ids (the other words are composed from their characters)."""
        return {"char_dim": 3, "embed_dim": 2 * max(dim // 2, 1),
                "hidden_dim": dim if hidden is None else hidden, "mlp_dim": 4,
                "vocab_size": 50}

    def __init__(self, granularity: str = "cell", char_dim: int = 32, embed_dim: int = 128,
                 hidden_dim: int = 128, mlp_dim: int = 64, min_count: int = DEFAULT_MIN_COUNT,
                 vocab_size: int | None = None, max_words: int = DEFAULT_MAX_WORDS,
                 unknown_chars: Literal["unk", "error"] = "unk",
                 data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, data_dir)
        check_positive(char_dim=char_dim, embed_dim=embed_dim, hidden_dim=hidden_dim,
                       mlp_dim=mlp_dim, min_count=min_count, max_words=max_words,
                       vocab_size=vocab_size)
        if embed_dim % 2:
            raise GraphError(f"embed_dim must be even (a composed word is two embed_dim/2 "
                             f"character states), got {embed_dim}; pass {embed_dim + 1}")
        if unknown_chars not in ("unk", "error"):
            raise GraphError(f"unknown_chars must be 'unk' or 'error', got {unknown_chars!r}")
        self.char_dim, self.embed_dim, self.hidden_dim = char_dim, embed_dim, hidden_dim
        self.mlp_dim, self.max_words = mlp_dim, max_words
        train = self.treebank("train")
        self.words = FrequentWords(word_counts(s.words for s in train), min_count)
        if vocab_size is not None and vocab_size < len(self.words):  # keep the most frequent
            self.words.words = self.words.words[:vocab_size]
            self.words.ids = {w: i for w, i in self.words.ids.items() if i < vocab_size}
        self.chars = CharVocab.from_words((w for s in train for w in s.words),
                                          unknown=unknown_chars)
        self.tag_names = UPOS_TAGS
        self.tag_index = {t: i for i, t in enumerate(UPOS_TAGS)}
        declared = self._declare_vocab()
        if self.granularity == "cell":
            ids = self.vocab.id
            self._ids = {k: ids(v) for k, v in declared.items()}

    def treebank(self, split: str) -> Treebank:
        """The parsed EWT file of ``split`` (``data_dir/ud_ewt/en_ewt-ud-<split>.conllu``)."""
        path = self.data_dir / "ud_ewt" / f"en_ewt-ud-{split}.conllu"
        return read_ewt(str(path), self.max_words)

    # ------------------------------------------------------------------ vocabulary
    def _declare_cells(self, ops: OpSet) -> dict[str, str]:
        c, e, h, hc = self.char_dim, self.embed_dim, self.hidden_dim, self.embed_dim // 2
        state, char_state = (2 * h,), (2 * hc,)
        names = {
            "char": declare_cell(ops, f"{_P}.char", (), (c,), {f"{_P}.cemb": (len(self.chars),
                                                                             c)}, kind="lookup"),
            "word": declare_cell(ops, f"{_P}.word", (), (e,), {f"{_P}.emb": (len(self.words),
                                                                           e)}, kind="lookup"),
            "char_zero": declare_cell(ops, f"{_P}.char_zero", (), char_state,
                                      kind="bilstm.zero_state"),
            "zero": declare_cell(ops, f"{_P}.zero", (), state, kind="bilstm.zero_state"),
            "compose": declare_cell(ops, f"{_P}.compose", (char_state, char_state), (e,)),
            "loss": declare_cell(ops, f"{_P}.loss", (state, state), (1,),
                                 affine_params(f"{_P}.hidden", 2 * h, self.mlp_dim),
                                 affine_params(f"{_P}.out", self.mlp_dim, len(UPOS_TAGS)),
                                 kind="bilstm.loss"),
        }
        for d in ("fwd", "bwd"):
            names[f"char_{d}"] = declare_cell(ops, f"{_P}.char_{d}", ((c,), char_state),
                                              char_state, lstm_params(f"{_P}.char_{d}", c, hc),
                                              kind=f"bilstm.l1_{d}")
            names[d] = declare_cell(ops, f"{_P}.{d}", ((e,), state), state,
                                    lstm_params(f"{_P}.{d}", e, h), kind=f"bilstm.l1_{d}")
        return names

    def _declare_primitives(self, ops: OpSet) -> None:
        c, e, h, hc = self.char_dim, self.embed_dim, self.hidden_dim, self.embed_dim // 2
        self._char = ops.lookup(f"{_P}.cemb", len(self.chars), c)
        self._word = ops.lookup(f"{_P}.emb", len(self.words), e)
        self._char_cells = tuple(PrimitiveLSTM.declare(ops, f"{_P}.char_{d}", c, hc)
                                 for d in ("fwd", "bwd"))
        self._cells = tuple(PrimitiveLSTM.declare(ops, f"{_P}.{d}", e, h)
                            for d in ("fwd", "bwd"))
        self._compose = ops.concat(hc, hc)
        self._concat = ops.concat(h, h)
        self._hidden = ops.affine(f"{_P}.hidden", 2 * h, self.mlp_dim)
        self._tanh = ops.unary("tanh", self.mlp_dim)
        self._out = ops.affine(f"{_P}.out", self.mlp_dim, len(UPOS_TAGS))
        self._pick = ops.pick_nll(len(UPOS_TAGS))

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (identical at both granularities)."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """EWT's ``("train", "dev", "test")`` files."""
        return _SPLITS

    def _load(self, split: str) -> Sequence[CharTaggedInstance]:
        words, chars, tags = self.words, self.chars, self.tag_index
        out = []
        for s in self.treebank(split):
            ids = tuple(words.id(w) for w in s.words)
            lines = s.word_lines or (s.line,) * len(s)
            char_ids = tuple(None if i else chars.encode(w, boundaries=True, path=s.path,
                                                         line=line)
                             for w, i, line in zip(s.words, ids, lines, strict=True))
            out.append(CharTaggedInstance(s, ids, char_ids, tuple(tags[t] for t in s.upos)))
        return out

    # ------------------------------------------------------------------ emission
    def emit(self, instance: CharTaggedInstance, builder: GraphBuilder) -> list[int]:
        """Append one sentence's nodes; return its per-word loss node ids."""
        if self.granularity == "cell":
            return self._emit_cells(instance, builder)
        return self._emit_primitives(instance, builder)

    def _emit_cells(self, inst: CharTaggedInstance, b: GraphBuilder) -> list[int]:
        add, k, n = b.add, self._ids, len(inst)
        xs = [add(k["word"], attr=w) if cs is None else self._compose_cells(cs, b)
              for w, cs in zip(inst.word_ids, inst.char_ids, strict=True)]
        f = unroll(add(k["zero"]), lambda t, s: add(k["fwd"], xs[t], s), n)
        bk = unroll(add(k["zero"]), lambda t, s: add(k["bwd"], xs[t], s), n, backward=True)
        return [add(k["loss"], f[t], bk[t], attr=tag) for t, tag in enumerate(inst.tag_ids)]

    def _compose_cells(self, chars: Sequence[int], b: GraphBuilder) -> int:
        """A rare word: its character BiLSTM and the composition node."""
        add, k = b.add, self._ids
        es = [add(k["char"], attr=c) for c in chars]
        fwd = unroll(add(k["char_zero"]), lambda t, s: add(k["char_fwd"], es[t], s), len(es))
        bwd = unroll(add(k["char_zero"]), lambda t, s: add(k["char_bwd"], es[t], s), len(es),
                     backward=True)
        return add(k["compose"], fwd[-1], bwd[0])

    def _compose_primitives(self, chars: Sequence[int], b: GraphBuilder) -> int:
        cf, cb = self._char_cells
        es = [b.add(self._char, attr=c) for c in chars]
        fwd = unroll(cf.start(b), lambda t, s: cf.step(b, es[t], s), len(es))
        bwd = unroll(cb.start(b), lambda t, s: cb.step(b, es[t], s), len(es), backward=True)
        return b.add(self._compose, fwd[-1][0], bwd[0][0])

    def _emit_primitives(self, inst: CharTaggedInstance, b: GraphBuilder) -> list[int]:
        add, n = b.add, len(inst)
        lf, lb = self._cells
        xs = [add(self._word, attr=w) if cs is None else self._compose_primitives(cs, b)
              for w, cs in zip(inst.word_ids, inst.char_ids, strict=True)]
        f = unroll(lf.start(b), lambda t, s: lf.step(b, xs[t], s), n)
        bk = unroll(lb.start(b), lambda t, s: lb.step(b, xs[t], s), n, backward=True)
        losses = []
        for t, tag in enumerate(inst.tag_ids):
            hidden = add(self._tanh, add(self._hidden, add(self._concat, f[t][0], bk[t][0])))
            losses.append(add(self._pick, add(self._out, hidden), attr=tag))
        return losses
