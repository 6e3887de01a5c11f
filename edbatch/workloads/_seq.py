"""Private helpers shared by the lattice, BiLSTM-tagger and seq2seq workloads.

* Parameter-shape helpers whose names match :class:`~edbatch.workloads.primitives.OpSet`'s
  (``W`` and ``W.b`` for an affine map, ``W.rz`` / ``W.c`` for a GRU), so a workload's cell
  and primitive granularities declare *the same* parameters and can share one set of weights.
* :func:`declare_cell`: register a workload-specific (cell granularity) op type and its
  parameters on an :class:`OpSet`.
* :class:`PrimitiveLSTM` / :class:`PrimitiveGRU`: a recurrent cell at primitive granularity
  whose state is a tuple of node ids, ``(h, c)`` or ``(h,)`` (``state[0]`` is always ``h``).
* :func:`unroll`: run a recurrence forward or backward over a sequence.
* :func:`cap_id` and :func:`frequency_index`: token-id helpers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType
from edbatch.graph.ir import Shape
from edbatch.workloads.primitives import GRUNames, LSTMNames, OpSet, emit_gru, emit_lstm

__all__ = [
    "PrimitiveGRU",
    "PrimitiveLSTM",
    "affine_params",
    "cap_id",
    "check_positive",
    "declare_cell",
    "frequency_index",
    "gru_params",
    "lstm_params",
    "unroll",
]

Params = dict[str, Shape]
S = TypeVar("S")


def affine_params(weight: str, in_dim: int, out_dim: int) -> Params:
    """Shapes of ``W x + b``, named like :meth:`OpSet.affine`: ``weight`` and ``weight.b``."""
    return {weight: (out_dim, in_dim), f"{weight}.b": (out_dim,)}


def lstm_params(weight: str, in_dim: int, hidden: int) -> Params:
    """Shapes of a fused LSTM reading ``[x; h]`` (as :meth:`LSTMNames.declare` names them)."""
    return affine_params(weight, in_dim + hidden, 4 * hidden)


def gru_params(weight: str, in_dim: int, hidden: int) -> Params:
    """Shapes of a GRU reading ``[x; h]`` (as :meth:`GRUNames.declare` names them)."""
    return {**affine_params(f"{weight}.rz", in_dim + hidden, 2 * hidden),
            **affine_params(f"{weight}.c", in_dim + hidden, hidden)}


def declare_cell(ops: OpSet, name: str, in_shapes: Iterable[Shape], out_shape: Shape,
                 *param_groups: Mapping[str, Shape], kind: str | None = None) -> str:
    """Register a cell-granularity op type reading the union of ``param_groups``.

    Args:
        ops: the op set being declared.
        name: op type name, ``<workload>.<op>``.
        in_shapes: one shape per operand slot.
        out_shape: shape of one output.
        *param_groups: parameter name -> shape maps; the op's ``params`` keep their order.
        kind: kernel family; defaults to ``name`` (a cell has a kernel of its own).

    Returns:
        The op type name.
    """
    params: Params = {}
    for group in param_groups:
        params.update(group)
    op = OpType(name, kind or name, tuple(in_shapes), out_shape, tuple(params))
    return ops.add(op, params)


def check_positive(**values: int | None) -> None:
    """Raise :class:`GraphError` for any constructor size that is given but not positive."""
    for key, value in values.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise GraphError(f"{key} must be a positive int, got {value!r}")


def cap_id(token_id: int, vocab_size: int | None) -> int:
    """``token_id`` modulo ``vocab_size`` (ED-Batch's ``MAX_VOCAB_SIZE`` cap); ``None`` keeps it."""
    return token_id if vocab_size is None else token_id % vocab_size


def frequency_index(tokens: Iterable[str], vocab_size: int | None = None) -> dict[str, int]:
    """Ids by descending frequency, ties by token; id 0 is reserved for unknown tokens.

    Args:
        tokens: every token occurrence of the corpus the vocabulary is built from.
        vocab_size: total number of ids *including* the unknown id 0; the most frequent
            ``vocab_size - 1`` tokens are kept. ``None`` keeps every token.

    Returns:
        token -> id in ``1..``; look tokens up with ``.get(token, 0)``.
    """
    ranked = sorted(Counter(tokens).items(), key=lambda item: (-item[1], item[0]))
    if vocab_size is not None:
        ranked = ranked[:max(vocab_size - 1, 0)]
    return {token: i for i, (token, _) in enumerate(ranked, start=1)}


@dataclass(frozen=True, slots=True)
class PrimitiveLSTM:
    """An LSTM at primitive granularity: state ``(h, c)``, start state two zero vectors."""

    names: LSTMNames
    zero: str

    @classmethod
    def declare(cls, ops: OpSet, weight: str, in_dim: int, hidden: int) -> PrimitiveLSTM:
        """Declare the ops of one LSTM parameter set ``weight`` (see :func:`lstm_params`)."""
        return cls(LSTMNames.declare(ops, weight, in_dim, hidden), ops.zero(hidden))

    def start(self, b: GraphBuilder) -> tuple[int, ...]:
        """Emit the zero initial state ``(h0, c0)``."""
        return b.add(self.zero), b.add(self.zero)

    def step(self, b: GraphBuilder, x: int, state: tuple[int, ...]) -> tuple[int, ...]:
        """Emit one step on input ``x``; return the new ``(h, c)``."""
        return emit_lstm(b, self.names, x, state[0], state[1])


@dataclass(frozen=True, slots=True)
class PrimitiveGRU:
    """A GRU at primitive granularity: state ``(h,)``, start state one zero vector."""

    names: GRUNames
    zero: str

    @classmethod
    def declare(cls, ops: OpSet, weight: str, in_dim: int, hidden: int) -> PrimitiveGRU:
        """Declare the ops of one GRU parameter set ``weight`` (see :func:`gru_params`)."""
        return cls(GRUNames.declare(ops, weight, in_dim, hidden), ops.zero(hidden))

    def start(self, b: GraphBuilder) -> tuple[int, ...]:
        """Emit the zero initial state ``(h0,)``."""
        return (b.add(self.zero),)

    def step(self, b: GraphBuilder, x: int, state: tuple[int, ...]) -> tuple[int, ...]:
        """Emit one step on input ``x``; return the new ``(h,)``."""
        return (emit_gru(b, self.names, x, state[0]),)


def unroll(state: S, step: Callable[[int, S], S], length: int, *,
           backward: bool = False) -> list[S]:
    """Run a recurrence over positions ``0..length-1`` (or backwards) from ``state``.

    Args:
        state: the initial state (a node id, or a tuple of node ids).
        step: ``step(t, state) -> state`` emits the cell at position ``t``.
        length: number of positions.
        backward: visit positions ``length-1 .. 0`` instead.

    Returns:
        The state after each position, indexed by position (not by visiting order).
    """
    out: list[S] = [state] * length
    for t in (range(length - 1, -1, -1) if backward else range(length)):
        state = out[t] = step(t, state)
    return out
