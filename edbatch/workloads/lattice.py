"""Lattice-LSTM and Lattice-GRU over the character/word lattices of ``data/lattice/``.

A lattice has states ``0..L-1`` (state 0 is the start state) and arcs ``j -> i`` (``j < i``)
carrying a token: a *character* arc when ``j == i - 1``, a lexicon *word* arc otherwise (see
:mod:`edbatch.data.lattices`). Both models run one recurrent cell per arc:

* the state of 0 is the zero vector (``h0 = c0 = 0``);
* an arc ``j -> i`` with token ``t`` reads the state of ``j`` and the embedding of ``t``
  (``x = E_char[t]`` or ``E_word[t]``; character and word arcs have separate embedding tables
  and separate cell weights);
* the state of ``i`` is the sum of the outputs of its incoming arcs;
* every state ``i >= 1`` has a loss ``pick_neg_log_softmax(W_out h_i + b_out, tag_i)``.

The arc cells (``W`` is the cell's fused weight, ``[x; h]`` a concatenation):

* LSTM, state ``[h; c]``: ``[i f o u] = W [x; h_in] + b``; ``i, f, o = sigmoid(.)``,
  ``u = tanh(.)``; ``c = f*c_in + i*u``; ``h = o*tanh(c)``.
* GRU, state ``h``: ``[r z] = sigmoid(W_rz [x; h_in] + b_rz)``;
  ``c~ = tanh(W_c [x; r*h_in] + b_c)``; ``h = z*h_in + (1 - z)*c~``.

Token ids are taken modulo ``vocab_size`` (ED-Batch's ``MAX_VOCAB_SIZE = 256``).

Op types at cell granularity (``P`` is ``lattice_lstm`` or ``lattice_gru``, ``S`` the state
shape ``(2H,)`` for the LSTM and ``(H,)`` for the GRU):

* ``P.start``: no operands, the zero start state; all instances' start nodes batch together.
* ``P.char_arc`` / ``P.word_arc``: one operand (the source state), ``attr`` = token id; the
  cell does its own embedding lookup.
* ``P.sum{k}`` for ``k = 2..max_in_degree``: the state of a node with ``k`` incoming arcs (a
  ``k``-ary sum is its own op type, as DyNet's ``sum`` signature includes its arity).
* ``P.loss``: one operand (a state), ``attr`` = the state's tag; output ``(1,)``.
* ``loss_sum``: the mini-batch's final sum.

At primitive granularity the start state is ``zero/H`` vectors, an arc is a lookup followed
by :func:`~edbatch.workloads.primitives.emit_lstm` / ``emit_gru`` (char and word arcs have
different affine op types but share ``tanh/H``, ``cmult/H`` ...), a ``k``-way state sum is a
chain of ``k - 1`` binary ``add/H`` nodes (per state part: ``h`` and ``c`` for the LSTM), and
a loss is ``affine`` to ``num_tags`` plus ``pick_nll``. Both granularities declare the same
parameters (:meth:`param_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import numpy as np

from edbatch.data.lattices import Lattice, load_lattices
from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder
from edbatch.graph.ir import Shape
from edbatch.workloads._seq import (
    PrimitiveGRU,
    PrimitiveLSTM,
    affine_params,
    check_positive,
    declare_cell,
    gru_params,
    lstm_params,
)
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["LatticeGRU", "LatticeInstance", "LatticeLSTM"]

_ARC_KINDS = ("char", "word")  # arc kind 0 = character arc, 1 = word arc


@dataclass(frozen=True, slots=True, eq=False)
class LatticeInstance:
    """A lattice with its arcs pre-encoded for fast graph emission.

    Attributes:
        split: the split it was loaded from.
        index: its position in that split (named in error messages).
        lattice: the parsed lattice.
        tags: tag of each state.
        arc_ptr: arcs into state ``i`` are ``arc_ptr[i]:arc_ptr[i + 1]`` (``L + 1`` entries).
        arc_src: source state of each arc.
        arc_kind: 0 for a character arc, 1 for a word arc.
        arc_token: token id of each arc, already taken modulo the workload's ``vocab_size``.
        max_in_degree: the largest number of arcs into one state.
    """

    split: str
    index: int
    lattice: Lattice
    tags: tuple[int, ...]
    arc_ptr: tuple[int, ...]
    arc_src: tuple[int, ...]
    arc_kind: tuple[int, ...]
    arc_token: tuple[int, ...]
    max_in_degree: int

    @property
    def num_states(self) -> int:
        """Number of states ``L``, the start state included."""
        return len(self.tags)


@dataclass(frozen=True, slots=True)
class _CellFamily:
    """What differs between the LSTM and GRU lattices."""

    #: Number of state parts at primitive granularity: 2 for ``(h, c)``, 1 for ``(h,)``.
    state_parts: int
    #: Parameter shapes of one arc cell: ``(weight, in_dim, hidden) -> {name: shape}``.
    params: Callable[[str, int, int], dict[str, Shape]]
    #: The primitive-granularity cell.
    primitive: type[PrimitiveLSTM] | type[PrimitiveGRU]


class _LatticeWorkload(Workload):
    """Shared reader, vocabulary and emission of the two lattice workloads."""

    _family: ClassVar[_CellFamily]
    real_data = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small embeddings and states; ``short``: 50 word ids."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden,
                **({"vocab_size": 50} if short else {})}

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int = 256, num_tags: int = 18, max_in_degree: int = 16,
                 data_dir: str | Path | None = None) -> None:
        """Declare the op vocabulary.

        Args:
            granularity: ``"cell"`` (one op per arc cell) or ``"primitive"`` (DyNet ops).
            embed_dim: embedding size ``E`` of both token tables.
            hidden_dim: hidden size ``H``.
            vocab_size: rows of each embedding table; token ids are taken modulo it.
            num_tags: number of tag classes (the data uses ids 0..17).
            max_in_degree: the largest ``k`` with a ``sum{k}`` op type (cell granularity
                only); emitting a lattice with a state of more incoming arcs raises.
            data_dir: folder holding ``lattice/{train,dev,test}.txt``; defaults to ``data/``.
        """
        super().__init__(granularity, data_dir)
        check_positive(embed_dim=embed_dim, hidden_dim=hidden_dim, vocab_size=vocab_size,
                       num_tags=num_tags, max_in_degree=max_in_degree)
        self.embed_dim, self.hidden_dim = embed_dim, hidden_dim
        self.vocab_size, self.num_tags, self.max_in_degree = vocab_size, num_tags, max_in_degree
        self._declare_vocab()
        if self.granularity == "cell":
            ids = self.vocab.id
            p = self.name
            self._start_id = ids(f"{p}.start")
            self._arc_ids = (ids(f"{p}.char_arc"), ids(f"{p}.word_arc"))
            self._sum_ids = [-1, -1] + [ids(f"{p}.sum{k}") for k in range(2, max_in_degree + 1)]
            self._loss_id = ids(f"{p}.loss")

    # ------------------------------------------------------------------ vocabulary
    def _arc_params(self, kind: str) -> dict[str, Shape]:
        p, e, h = self.name, self.embed_dim, self.hidden_dim
        return {f"{p}.{kind}_emb": (self.vocab_size, e),
                **self._family.params(f"{p}.{kind}_cell", e, h)}

    def _declare_cells(self, ops: OpSet) -> None:
        p, h = self.name, self.hidden_dim
        state: Shape = (self._family.state_parts * h,)
        declare_cell(ops, f"{p}.start", (), state)
        for kind in _ARC_KINDS:
            declare_cell(ops, f"{p}.{kind}_arc", (state,), state, self._arc_params(kind))
        for k in range(2, self.max_in_degree + 1):
            declare_cell(ops, f"{p}.sum{k}", (state,) * k, state, kind="sum")
        declare_cell(ops, f"{p}.loss", (state,), (1,),
                     affine_params(f"{p}.out", h, self.num_tags))

    def _declare_primitives(self, ops: OpSet) -> None:
        p, e, h = self.name, self.embed_dim, self.hidden_dim
        self._lookups = tuple(ops.lookup(f"{p}.{kind}_emb", self.vocab_size, e)
                              for kind in _ARC_KINDS)
        self._cells = tuple(self._family.primitive.declare(ops, f"{p}.{kind}_cell", e, h)
                            for kind in _ARC_KINDS)
        self._add = ops.binary("add", h)
        self._out = ops.affine(f"{p}.out", h, self.num_tags)
        self._pick = ops.pick_nll(self.num_tags)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (identical at both granularities)."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``: the three files of ``data/lattice/``."""
        return ("train", "dev", "test")

    def _load(self, split: str) -> Sequence[LatticeInstance]:
        lattices = load_lattices(self.data_dir / "lattice" / f"{split}.txt",
                                 num_tags=self.num_tags)
        return [self._encode(split, i, lat) for i, lat in enumerate(lattices)]

    def _encode(self, split: str, index: int, lat: Lattice) -> LatticeInstance:
        """Pre-encode one lattice (``load_lattices`` checked its tags against ``num_tags``
        and that every state i >= 1 has an incoming arc, with ``file:line``)."""
        num_states = lat.num_states
        ptr = np.searchsorted(lat.arc_dst, np.arange(num_states + 1), side="left")
        degree = np.diff(ptr)
        kind = (~lat.is_char_arc()).astype(np.int64)
        return LatticeInstance(
            split, index, lat, tuple(lat.tags.tolist()), tuple(ptr.tolist()),
            tuple(lat.arc_src.tolist()), tuple(kind.tolist()),
            tuple((lat.arc_token % self.vocab_size).tolist()),
            int(degree.max()) if num_states else 0)

    # ------------------------------------------------------------------ emission
    def emit(self, instance: LatticeInstance, builder: GraphBuilder) -> list[int]:
        """Append one lattice's nodes; return its per-state loss node ids (states 1..L-1)."""
        if self.granularity == "cell":
            return self._emit_cells(instance, builder)
        return self._emit_primitives(instance, builder)

    def _emit_cells(self, inst: LatticeInstance, b: GraphBuilder) -> list[int]:
        if inst.max_in_degree > self.max_in_degree:
            self._raise_in_degree(inst)
        add = b.add
        arc_ids, sum_ids, loss_id = self._arc_ids, self._sum_ids, self._loss_id
        ptr, src, kind, token, tags = (inst.arc_ptr, inst.arc_src, inst.arc_kind,
                                       inst.arc_token, inst.tags)
        states = [add(self._start_id)]
        losses = []
        for i in range(1, inst.num_states):
            lo, hi = ptr[i], ptr[i + 1]
            if hi - lo == 1:
                s = add(arc_ids[kind[lo]], states[src[lo]], attr=token[lo])
            else:
                s = add(sum_ids[hi - lo], *[add(arc_ids[kind[a]], states[src[a]], attr=token[a])
                                            for a in range(lo, hi)])
            states.append(s)
            losses.append(add(loss_id, s, attr=tags[i]))
        return losses

    def _emit_primitives(self, inst: LatticeInstance, b: GraphBuilder) -> list[int]:
        add, add_op, lookups, cells = b.add, self._add, self._lookups, self._cells
        ptr, src, kind, token = inst.arc_ptr, inst.arc_src, inst.arc_kind, inst.arc_token
        states = [cells[0].start(b)]
        losses = []
        for i in range(1, inst.num_states):
            arcs = [cells[kind[a]].step(b, add(lookups[kind[a]], attr=token[a]), states[src[a]])
                    for a in range(ptr[i], ptr[i + 1])]
            state = arcs[0]
            for other in arcs[1:]:
                state = tuple([add(add_op, u, v) for u, v in zip(state, other, strict=True)])
            states.append(state)
            losses.append(add(self._pick, add(self._out, state[0]), attr=inst.tags[i]))
        return losses

    def _raise_in_degree(self, inst: LatticeInstance) -> NoReturn:
        degree = np.diff(np.asarray(inst.arc_ptr))
        state = int(np.argmax(degree > self.max_in_degree))
        raise GraphError(
            f"lattice #{inst.index} of split {inst.split!r}: state {state} has "
            f"{int(degree[state])} incoming arcs (a sum of arity {int(degree[state])}), but "
            f"{type(self).__name__}(max_in_degree={self.max_in_degree}) declares sum ops for "
            f"arities 2..{self.max_in_degree} only; construct it with max_in_degree >= "
            f"{inst.max_in_degree}")


class LatticeLSTM(_LatticeWorkload):
    """Lattice-LSTM (ED-Batch's ``lattice_lstm``): LSTM arc cells, state ``[h; c]``.

    Example:
        >>> w = LatticeLSTM()
        >>> g = w.minibatch("dev", range(2))
        >>> g.vocab[int(g.op_ids[0])].name, g.vocab[int(g.op_ids[-1])].name
        ('lattice_lstm.start', 'loss_sum')
    """

    name = "lattice_lstm"
    hand_backward = True
    _family = _CellFamily(2, lstm_params, PrimitiveLSTM)


class LatticeGRU(_LatticeWorkload):
    """Lattice-GRU (ED-Batch's ``lattice_gru``): GRU arc cells, state ``h``."""

    name = "lattice_gru"
    _family = _CellFamily(1, gru_params, PrimitiveGRU)
