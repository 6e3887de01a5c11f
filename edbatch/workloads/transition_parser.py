"""Arc-standard transition parser with BiLSTM features on UD English EWT, registry name
``"transition_parser"`` (Kiperwasser & Goldberg 2016, "Simple and Accurate Dependency
Parsing Using Bidirectional LSTM Feature Representations", greedy variant).

**Model.** Word ``i`` of a sentence reads ``x_i = [E_w[word_i]; E_p[upos_i]]`` (train words
seen ``min_count`` times or more get their own row, others the unknown row 0; the gold UPOS
tag); a ``layers``-deep BiLSTM (layer 2 reads ``[h(f1_i); h(b1_i)]``, each direction from a
zero state) gives ``v_i = [h(f_i); h(b_i)]``. A configuration of the arc-standard system
(:mod:`edbatch.data.transitions`: stack ``.. s2 s1 s0``, buffer ``b0 ..``) is scored by an
MLP over ``[v_s2; v_s1; v_s0; v_b0]``: ``W_o tanh(W_h [...] + b_h) + b_o``, one score per
class: ``SHIFT`` and, per dependency relation ``l`` of train, ``LEFT_ARC(l)`` and
``RIGHT_ARC(l)`` (``labelled=False``: three classes). The root 0 on the stack reads a learned
vector ``R``, an empty slot a learned ``PAD`` (the two rows of ``parser.E_special``).

**Training graph.** The static oracle's transitions of the gold tree
(:func:`~edbatch.data.transitions.labelled_oracle`), ``2n`` for ``n`` words; each is one
``parser.step`` node whose loss is the cross-entropy of the gold class. **Non-projective
sentences** have no arc-standard derivation and are left out of every split's graphs (EWT:
288 of 12,544 train, 31 of 2,001 dev, 26 of 2,077 test; :attr:`TransitionParser.dropped`);
evaluation parses *every* sentence (:meth:`TransitionParser.sentences`) and scores the
predicted heads against the gold ones, so the non-projective ones count (UAS / LAS over all
words, punctuation included, as the CoNLL 2018 shared task does).

Op types (cell granularity; ``S = (2H,)`` a state ``[h; c]``, ``V = (2H,)`` a feature):

* ``parser.embed``: no operands, attr ``word * P + upos``, out ``(Dw + Dp,)``.
* ``parser.zero_state``: the zero initial state, ``2 * layers`` per sentence.
* ``parser.l1_fwd`` / ``parser.l1_bwd``: ``(x_i, previous state)``; ``parser.l2_fwd`` /
  ``parser.l2_bwd``: ``(f1_i, b1_i, previous state)`` (``layers=2``).
* ``parser.feat``: ``(f_i, b_i)`` of the last layer, out ``V``.
* ``parser.special``: kind ``lookup``, attr 0 = root, 1 = padding, out ``V``.
* ``parser.step``: ``(v_s2, v_s1, v_s0, v_b0)``, attr = gold class, out ``(1,)``.
* ``loss_sum``.

A sentence of ``n`` words gives ``n (2 + 2 layers) + 2 layers + 2 + 2n`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.data._text import parsed
from edbatch.data.transitions import (
    LEFT_ARC,
    RIGHT_ARC,
    SHIFT,
    ArcStandardState,
    labelled_oracle,
    projective_only,
)
from edbatch.data.ud import UPOS_TAGS, DepSentence, Treebank, load_conllu
from edbatch.data.vocab import FrequentWords, word_counts
from edbatch.errors import DataFormatError, GraphError, InvalidActionError
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._seq import check_positive, declare_cell, lstm_params, unroll
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["ROOT", "PAD", "ParseInstance", "TransitionParser", "attachment_scores",
           "config_items"]

_P = "parser"
_SPLITS = ("train", "dev", "test")
#: Items of :func:`config_items`: the root 0 on the stack, and an empty slot.
ROOT, PAD = 0, -1
_TAGS = {t: i for i, t in enumerate(UPOS_TAGS)}


def _treebank(path: Path) -> Treebank:
    return parsed(load_conllu, path)  # type: ignore[no-any-return]  # (read once a process)


def config_items(stack: Sequence[int], next_word: int, n: int) -> tuple[int, int, int, int]:
    """The words the MLP reads in a configuration: ``(s2, s1, s0, b0)``; ``0`` is the root
    on the stack, :data:`PAD` an empty slot.

    Example:
        >>> config_items([0], 1, 3), config_items([0, 2, 3], 4, 3)
        ((-1, -1, 0, 1), (0, 2, 3, -1))
    """
    depth = len(stack)
    return (stack[-3] if depth >= 3 else PAD, stack[-2] if depth >= 2 else PAD,
            stack[-1], next_word if next_word <= n else PAD)


@dataclass(frozen=True, slots=True, eq=False)
class ParseInstance:
    """A projective sentence with its ids and its oracle's transition classes."""

    sentence: DepSentence
    embed_attrs: tuple[int, ...]
    classes: tuple[int, ...]

    def __len__(self) -> int:
        """Number of words."""
        return len(self.embed_attrs)


class TransitionParser(Workload):
    """BiLSTM-feature arc-standard parser over EWT (see the module docstring).

    Args:
        granularity: ``"cell"`` only.
        embed_dim / pos_dim: word and UPOS embedding sizes.
        hidden_dim: LSTM size ``H`` per direction (a feature is ``2H`` wide).
        mlp_dim: hidden size of the transition MLP.
        layers: BiLSTM depth, 1 or 2.
        labelled: predict the relation with each arc (LAS), else three classes.
        min_count: train occurrences a word needs for its own embedding row.
        max_words: leave sentences longer than this out of the graphs (``None``: keep all).
        data_dir: data root holding ``ud_ewt/en_ewt-ud-{train,dev,test}.conllu``.

    Example:
        >>> wl = TransitionParser(embed_dim=4, pos_dim=2, hidden_dim=3, mlp_dim=5)
        >>> inst = wl.load("dev")[0]
        >>> len(inst.classes) == 2 * len(inst), len(wl.load("train")), wl.nonprojective["train"]
        (True, 12256, 288)
        >>> wl.minibatch("dev", [0]).num_nodes == 8 * len(inst) + 4 + 2 + 1
        True
    """

    name = "transition_parser"
    default_eval_split = "dev"
    real_data = True
    hand_backward = True
    granularities = ("cell",)

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small sizes and few word ids (words seen 500 times or more in train);
        ``short``: sentences of at most 6 words (two layers: every kind is used)."""
        kw: dict[str, Any] = {"embed_dim": dim, "pos_dim": 3, "min_count": 500,
                              "hidden_dim": dim if hidden is None else hidden, "mlp_dim": 5}
        return {**kw, "layers": 2, "max_words": 6} if short else kw

    def __init__(self, granularity: str = "cell", embed_dim: int = 100, pos_dim: int = 25,
                 hidden_dim: int = 125, mlp_dim: int = 100, layers: int = 2,
                 labelled: bool = True, min_count: int = 2, max_words: int | None = None,
                 data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, data_dir)
        if self.granularity != "cell":
            raise GraphError(f"workload {self.name!r} has only the 'cell' granularity, got "
                             f"{granularity!r}; pass granularity=cell")
        check_positive(embed_dim=embed_dim, pos_dim=pos_dim, hidden_dim=hidden_dim,
                       mlp_dim=mlp_dim, min_count=min_count, max_words=max_words)
        if layers not in (1, 2):
            raise GraphError(f"layers must be 1 or 2, got {layers!r}")
        self.embed_dim, self.pos_dim, self.hidden_dim = embed_dim, pos_dim, hidden_dim
        self.mlp_dim, self.layers, self.labelled = mlp_dim, layers, bool(labelled)
        self.max_words = max_words
        train = self.sentences("train")
        self.words = FrequentWords(word_counts(s.words for s in train), min_count)
        self.num_words = len(self.words)
        rels = sorted({d for s in train for d in s.deprels}) if self.labelled else ["_"]
        self.labels: tuple[str, ...] = tuple(rels)
        self.label_ids = {r: i for i, r in enumerate(self.labels)}
        self.num_classes = 1 + 2 * len(self.labels)
        #: Sentences left out of each split's graphs: non-projective ones (per split, once
        #: loaded) and, with ``max_words``, longer ones.
        self.dropped: dict[str, int] = {}
        #: Of those, the non-projective ones.
        self.nonprojective: dict[str, int] = {}
        self._declare_vocab()
        ids = self.vocab.id
        self._embed, self._zero, self._feat, self._special, self._step = (
            ids(f"{_P}.{k}") for k in ("embed", "zero_state", "feat", "special", "step"))
        self._cells = tuple(ids(f"{_P}.l{k}_{d}") for k in range(1, layers + 1)
                            for d in ("fwd", "bwd"))

    # ------------------------------------------------------------------ vocabulary
    def _declare_cells(self, ops: OpSet) -> None:
        d, h = self.embed_dim + self.pos_dim, self.hidden_dim
        state, feat = (2 * h,), (2 * h,)
        declare_cell(ops, f"{_P}.embed", (), (d,), {f"{_P}.E_w": (self.num_words, self.embed_dim),
                                                    f"{_P}.E_p": (len(UPOS_TAGS), self.pos_dim)})
        declare_cell(ops, f"{_P}.zero_state", (), state)
        for direction in ("fwd", "bwd"):
            declare_cell(ops, f"{_P}.l1_{direction}", ((d,), state), state,
                         lstm_params(f"{_P}.l1_{direction}", d, h))
        if self.layers == 2:
            for direction in ("fwd", "bwd"):
                declare_cell(ops, f"{_P}.l2_{direction}", (state, state, state), state,
                             lstm_params(f"{_P}.l2_{direction}", 2 * h, h))
        declare_cell(ops, f"{_P}.feat", (state, state), feat)
        ops.add(OpType(f"{_P}.special", "lookup", (), feat, (f"{_P}.E_special",)),
                {f"{_P}.E_special": (2, 2 * h)})
        m, a = self.mlp_dim, self.num_classes
        declare_cell(ops, f"{_P}.step", (feat,) * 4, (1,),
                     {f"{_P}.W_h": (m, 8 * h), f"{_P}.W_h.b": (m,), f"{_P}.W_o": (a, m),
                      f"{_P}.W_o.b": (a,)})

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter the vocabulary names."""
        return dict(self._params)

    # ------------------------------------------------------------------ classes
    def class_of(self, action: int, label: str | None) -> int:
        """The class id of a transition (``label`` ignored for ``SHIFT`` or unlabelled)."""
        if action == SHIFT:
            return 0
        lab = self.label_ids.get(label, -1) if self.labelled else 0  # type: ignore[arg-type]
        if lab < 0:
            raise GraphError(f"relation {label!r} is not one of train's {len(self.labels)}")
        return 1 + lab + (len(self.labels) if action == RIGHT_ARC else 0)

    def action_of(self, cls: int) -> tuple[int, int]:
        """``(action, label id)`` of a class id (label -1 for ``SHIFT``).

        Raises:
            InvalidActionError: ``cls`` is not a class id (``0 .. num_classes - 1``).
        """
        if not 0 <= cls < self.num_classes:
            raise InvalidActionError(
                f"class id {cls!r} is outside 0..{self.num_classes - 1} (0: SHIFT, then "
                f"LEFT_ARC and RIGHT_ARC for each of the {len(self.labels)} labels); use a "
                "class of TransitionParser.class_of or of the instance's classes")
        if cls == 0:
            return SHIFT, -1
        lab = cls - 1
        nl = len(self.labels)
        return (LEFT_ARC, lab) if lab < nl else (RIGHT_ARC, lab - nl)

    def class_actions(self) -> np.ndarray:
        """The action of every class, ``int64[num_classes]`` (for legality masks)."""
        nl = len(self.labels)
        return np.array([SHIFT] + [LEFT_ARC] * nl + [RIGHT_ARC] * nl, dtype=np.int64)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``: EWT's own splits."""
        return _SPLITS

    def sentences(self, split: str) -> Treebank:
        """Every sentence of ``split`` as read (non-projective ones included)."""
        if split not in _SPLITS:
            self.load(split)  # raises the UnknownNameError
        return _treebank(self.data_dir / "ud_ewt" / f"en_ewt-ud-{split}.conllu")

    def embed_attrs(self, sentence: DepSentence) -> tuple[int, ...]:
        """The ``parser.embed`` attr ``word id * P + upos id`` of every word."""
        tags = len(UPOS_TAGS)
        return tuple(self.words.id(w) * tags + _TAGS[t]
                     for w, t in zip(sentence.words, sentence.upos, strict=True))

    def _load(self, split: str) -> list[ParseInstance]:
        kept, nonprojective = projective_only(self.sentences(split))
        if self.max_words is not None:
            kept = [s for s in kept if len(s) <= self.max_words]
        self.dropped[split] = len(self.sentences(split)) - len(kept)
        out = []
        for s in kept:
            try:
                classes = tuple(self.class_of(a, r) for a, r in
                                labelled_oracle(s.heads, s.deprels, path=s.path, line=s.line))
            except GraphError as e:
                raise DataFormatError(s.path, s.line, str(e), "a relation seen in train",
                                      "train on a treebank that has it") from None
            out.append(ParseInstance(s, self.embed_attrs(s), classes))
        self.nonprojective[split] = len(nonprojective)
        return out

    # ------------------------------------------------------------------ emission
    def emit(self, instance: ParseInstance, builder: GraphBuilder) -> list[int]:
        """Append one sentence's BiLSTM and its oracle transitions; return the step losses."""
        if not isinstance(instance, ParseInstance):
            raise GraphError(f"{self.name} emits ParseInstance objects (workload.load(split)"
                             f"[i]), got {type(instance).__name__}")
        add, n = builder.add, len(instance)
        xs = [add(self._embed, attr=a) for a in instance.embed_attrs]
        f = unroll(add(self._zero), lambda t, s: add(self._cells[0], xs[t], s), n)
        b = unroll(add(self._zero), lambda t, s: add(self._cells[1], xs[t], s), n,
                   backward=True)
        if self.layers == 2:
            f1, b1 = f, b
            f = unroll(add(self._zero), lambda t, s: add(self._cells[2], f1[t], b1[t], s), n)
            b = unroll(add(self._zero), lambda t, s: add(self._cells[3], f1[t], b1[t], s), n,
                       backward=True)
        feats = [add(self._feat, fw, bw) for fw, bw in zip(f, b, strict=True)]
        root, pad = add(self._special, attr=0), add(self._special, attr=1)
        vec = {ROOT: root, PAD: pad}
        state = ArcStandardState(n)
        losses = []
        for cls in instance.classes:
            items = config_items(state.stack, state.next, n)
            losses.append(add(self._step, *[vec[i] if i <= 0 else feats[i - 1] for i in items],
                              attr=cls))
            state.apply(self.action_of(cls)[0])
        return losses

    def __repr__(self) -> str:
        return (f"TransitionParser(hidden_dim={self.hidden_dim}, layers={self.layers}, "
                f"classes={self.num_classes}, num_words={self.num_words}, "
                f"ops={len(self.vocab)})")


def attachment_scores(sentences: Sequence[DepSentence], heads: Sequence[Sequence[int]],
                      labels: Sequence[Sequence[str]] | None = None) -> dict[str, float]:
    """UAS (and LAS with ``labels``) over every word of ``sentences``, punctuation included.

    Example:
        >>> s = DepSentence(("a", "b"), ("DET", "NOUN"), (2, 0), ("det", "root"),
        ...                 ("a", "b"), None, None, "<doc>", 1)
        >>> attachment_scores([s], [(2, 0)], [("amod", "root")])
        {'uas': 1.0, 'las': 0.5, 'words': 2}
    """
    if len(heads) != len(sentences) or (labels is not None and len(labels) != len(heads)):
        raise ValueError(f"one prediction per sentence: {len(sentences)} sentences, "
                         f"{len(heads)} head lists")
    words = head_ok = both_ok = 0
    for k, s in enumerate(sentences):
        if len(heads[k]) != len(s):
            raise ValueError(f"sentence {k} has {len(s)} words, {len(heads[k])} heads given")
        for i, (gh, ph) in enumerate(zip(s.heads, heads[k], strict=True)):
            words += 1
            if gh == ph:
                head_ok += 1
                if labels is not None and labels[k][i] == s.deprels[i]:
                    both_ok += 1
    out: dict[str, float] = {"uas": head_ok / max(words, 1)}
    if labels is not None:
        out["las"] = both_ok / max(words, 1)
    out["words"] = words
    return out
