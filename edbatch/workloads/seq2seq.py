"""LSTM encoder-decoder (ED-Batch's ``lstm_nmt``) over IWSLT15 English -> Vietnamese.

The model (docs/architecture.md 3.10), teacher forced: the encoder reads every source token
``<s> x_1 .. x_m </s>`` from a zero state; the decoder starts from the encoder's last state,
reads the target inputs ``<s> y_1 .. y_n`` and predicts ``y_1 .. y_n </s>``. Each encoder or
decoder step (with its own embedding table and weights) is an input projection followed by an
LSTM: ``x = tanh(E2H E[token] + b)``; ``[i f o u] = W [x; h] + b``;
``c' = sigmoid(f)*c + sigmoid(i)*tanh(u)``; ``h' = sigmoid(o)*tanh(c')``. A prediction costs
``pick_neg_log_softmax(W_out h + b_out, next token)`` over the whole target vocabulary.

**Splits.** The benchmark's ``train.en-vi.capped`` is missing from the data snapshot, so
``"train"`` is ``iwslt15/tst2012.en-vi.capped`` (the stand-in named in ``data/README.md``) and
``"test"`` pairs ``tst2013.en.capped`` with the raw ``tst2013.vi`` (out-of-vocabulary target
tokens become ``<unk>``). Token ids come from ``vocab.en`` / ``vocab.vi``.

**Caps.** ``vocab_size`` takes every token id modulo it (ED-Batch caps every vocabulary at
``MAX_VOCAB_SIZE = 256``; the default ``None`` keeps the full 17191 / 7709-word vocabularies,
so the softmax is as large as the real model's). ``max_len`` keeps only the first ``max_len``
tokens of each side (``<s>`` included; a cut target loses its ``</s>``), which bounds the
chain length of the graphs.

Op types at cell granularity (``S = (2H,)`` is a state ``[h; c]``): ``seq2seq.zero_state``
(no operands), ``seq2seq.enc`` (operand: previous state; ``attr`` = source token; the cell
does lookup, projection and LSTM), ``seq2seq.dec`` (operand: previous state; ``attr`` =
previous target token), ``seq2seq.loss`` (operand: decoder state; ``attr`` = next target
token; output ``(1,)``) and ``loss_sum``. At primitive granularity each step is a lookup,
``affine`` E2H, ``tanh`` and :func:`~edbatch.workloads.primitives.emit_lstm`; the initial
state is two ``zero/H`` vectors; a loss is ``affine`` to the target vocabulary + ``pick_nll``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edbatch.data.parallel import SentencePair, load_pairs, load_vocab, pair_files
from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder
from edbatch.workloads._seq import (
    PrimitiveLSTM,
    affine_params,
    cap_id,
    check_positive,
    declare_cell,
    lstm_params,
)
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["PairInstance", "Seq2Seq"]

_SIDES = (("enc", "src"), ("dec", "tgt"))  # (cell, embedding table) of each side


@dataclass(frozen=True, slots=True, eq=False)
class PairInstance:
    """A sentence pair with its token ids pre-computed (capped and truncated).

    Attributes:
        pair: the parsed pair (full length).
        source_ids: encoder inputs.
        target_ids: ``<s> y_1 .. y_n </s>``; the decoder reads ``[:-1]`` and predicts ``[1:]``.
    """

    pair: SentencePair
    source_ids: tuple[int, ...]
    target_ids: tuple[int, ...]


class Seq2Seq(Workload):
    """Teacher-forced LSTM encoder-decoder.

    Example:
        >>> w = Seq2Seq(vocab_size=256)
        >>> inst = w.load("train")[1]
        >>> inst.pair.target
        ('<s>', 'Câu', 'chuyện', 'này', 'chưa', 'kết', 'thúc', '.', '</s>')
        >>> g = w.minibatch("train", [1])
        >>> g.num_nodes == 1 + len(inst.source_ids) + 2 * (len(inst.target_ids) - 1) + 1
        True
    """

    name = "seq2seq"
    default_eval_split = "test"  # tst2013; tst2012 stands in for the missing train set
    default_val_split = "test"  # no dev set: experiments.train reports on the later test graphs
    real_data = True
    hand_backward = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small embeddings and states; ``short``: 50 word ids, sentences of 12 tokens."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden,
                **({"vocab_size": 50, "max_len": 12} if short else {})}

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int | None = None, max_len: int | None = None,
                 data_dir: str | Path | None = None) -> None:
        """Read both vocabularies and declare the ops.

        Args:
            granularity: ``"cell"`` (one op per encoder/decoder step) or ``"primitive"``.
            embed_dim: embedding size ``E``.
            hidden_dim: LSTM hidden size ``H``.
            vocab_size: token ids are taken modulo it (ED-Batch uses 256); ``None`` keeps the
                full vocabularies.
            max_len: keep the first ``max_len`` tokens of each side (at least 2); ``None``
                keeps whole sentences.
            data_dir: folder holding ``iwslt15/``; defaults to the repository's ``data/``.
        """
        super().__init__(granularity, data_dir)
        check_positive(embed_dim=embed_dim, hidden_dim=hidden_dim, vocab_size=vocab_size,
                       max_len=max_len)
        if max_len is not None and max_len < 2:
            raise GraphError(f"max_len must be >= 2 (the decoder needs <s> and one target "
                             f"token), got {max_len}")
        self.embed_dim, self.hidden_dim = embed_dim, hidden_dim
        self.vocab_size, self.max_len = vocab_size, max_len
        folder = self.data_dir / "iwslt15"
        self.source_vocab = load_vocab(folder / "vocab.en")
        self.target_vocab = load_vocab(folder / "vocab.vi")
        self.num_source = self._rows(len(self.source_vocab))
        self.num_target = self._rows(len(self.target_vocab))
        self._declare_vocab()
        if self.granularity == "cell":
            self._zero_id, self._enc_id, self._dec_id, self._loss_id = (
                self.vocab.id(f"seq2seq.{op}") for op in ("zero_state", "enc", "dec", "loss"))

    def _rows(self, size: int) -> int:
        return size if self.vocab_size is None else min(size, self.vocab_size)

    # ------------------------------------------------------------------ vocabulary
    def _step_params(self, cell: str, table: str) -> dict[str, tuple[int, ...]]:
        e, h = self.embed_dim, self.hidden_dim
        rows = self.num_source if table == "src" else self.num_target
        return {f"seq2seq.{table}_emb": (rows, e), **affine_params(f"seq2seq.{cell}_e2h", e, h),
                **lstm_params(f"seq2seq.{cell}_lstm", h, h)}

    def _declare_cells(self, ops: OpSet) -> None:
        state = (2 * self.hidden_dim,)
        declare_cell(ops, "seq2seq.zero_state", (), state)
        for cell, table in _SIDES:
            declare_cell(ops, f"seq2seq.{cell}", (state,), state, self._step_params(cell, table))
        declare_cell(ops, "seq2seq.loss", (state,), (1,),
                     affine_params("seq2seq.out", self.hidden_dim, self.num_target))

    def _declare_primitives(self, ops: OpSet) -> None:
        e, h = self.embed_dim, self.hidden_dim
        rows = {"src": self.num_source, "tgt": self.num_target}
        self._steps = tuple(
            (ops.lookup(f"seq2seq.{table}_emb", rows[table], e),
             ops.affine(f"seq2seq.{cell}_e2h", e, h), ops.unary("tanh", h),
             PrimitiveLSTM.declare(ops, f"seq2seq.{cell}_lstm", h, h))
            for cell, table in _SIDES)
        self._out = ops.affine("seq2seq.out", h, self.num_target)
        self._pick = ops.pick_nll(self.num_target)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (identical at both granularities)."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "test")``: tst2012 (stand-in for the missing train set) and tst2013."""
        return ("train", "test")

    def _load(self, split: str) -> Sequence[PairInstance]:
        folder = self.data_dir / "iwslt15"
        if split == "train":
            pairs = load_pairs(folder / "tst2012.en-vi.capped")
        else:
            pairs = pair_files(folder / "tst2013.en.capped", folder / "tst2013.vi",
                               self.target_vocab)
        return [PairInstance(p, self._encode(p.source, self.source_vocab),
                             self._encode(p.target, self.target_vocab)) for p in pairs]

    def _encode(self, tokens: Sequence[str], vocab: Mapping[str, int]) -> tuple[int, ...]:
        """Ids of the first ``max_len`` tokens (unknown -> ``<unk>`` = 0), capped."""
        size = self.vocab_size
        return tuple([cap_id(vocab.get(t, 0), size) for t in tokens[:self.max_len]])

    # ------------------------------------------------------------------ emission
    def emit(self, instance: PairInstance, builder: GraphBuilder) -> list[int]:
        """Append one pair's nodes; return its per-target-token loss node ids."""
        if self.granularity == "cell":
            return self._emit_cells(instance, builder)
        return self._emit_primitives(instance, builder)

    def _emit_cells(self, inst: PairInstance, b: GraphBuilder) -> list[int]:
        add, enc, dec, loss = b.add, self._enc_id, self._dec_id, self._loss_id
        state = add(self._zero_id)
        for token in inst.source_ids:
            state = add(enc, state, attr=token)
        target = inst.target_ids
        losses = []
        for t in range(len(target) - 1):
            state = add(dec, state, attr=target[t])
            losses.append(add(loss, state, attr=target[t + 1]))
        return losses

    def _emit_primitives(self, inst: PairInstance, b: GraphBuilder) -> list[int]:
        add = b.add
        (src_lookup, enc_e2h, tanh, enc), (tgt_lookup, dec_e2h, _, dec) = self._steps
        state = enc.start(b)
        for token in inst.source_ids:
            state = enc.step(b, add(tanh, add(enc_e2h, add(src_lookup, attr=token))), state)
        target = inst.target_ids
        losses = []
        for t in range(len(target) - 1):
            x = add(tanh, add(dec_e2h, add(tgt_lookup, attr=target[t])))
            state = dec.step(b, x, state)
            losses.append(add(self._pick, add(self._out, state[0]), attr=target[t + 1]))
        return losses
