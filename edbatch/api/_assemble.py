"""The fast graph assembly of a recorded mini-batch (:meth:`DynamicBatch.graph
<edbatch.api.DynamicBatch.graph>`): the recording's flat lists (and bulk blocks) packed into
arrays in a few calls, each node's instance, and the warning for nodes recorded outside every
instance.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
from numba import njit

from edbatch.api._bulk import with_blocks
from edbatch.api._handles import Handle, Recording, _fastrec
from edbatch.errors import GraphError, is_integer
from edbatch.graph import Graph, Vocab

__all__ = ["RecordingWarning", "assemble_graph", "layout_numpy", "node_layout", "take_graph",
           "warn_outside"]

#: A :class:`~edbatch.api.DynamicBatch` (typed loosely: it imports this module).
Batch = Any


def assemble_graph(vocab: Vocab, rec: Recording, outputs: Sequence[int]
                   ) -> tuple[Graph, int | None]:
    """Build a :class:`Graph` from a recording's flat lists in a few numpy calls.

    The loss terms (if any) become the operands of one final ``loss_sum`` node (the last
    op type of ``vocab``); the graph's outputs are that node, then ``outputs``. Returns the
    graph and the loss-sum node id (``None`` without loss terms). Shapes and operand
    counts are checked here, for the whole graph at once (``Graph.from_arrays``).
    """
    n, losses = len(rec.ops), rec.losses
    try:
        op_ids, flat, attr = _packed(rec, len(vocab) - 1)
    except struct.error:  # e.g. an attr that is no integer, or out of int64's range
        _check_attrs(vocab, rec)
        op_ids, flat, attr = _converted(rec, len(vocab) - 1)
    marks = _marks(rec.marks)
    counts = np.asarray(rec.counts, dtype=np.int64) if rec.counts else _NO_COUNTS
    ptr, inst, outside = node_layout(op_ids, vocab.shape_tables[0], counts, marks, n,
                                     len(losses))
    if outside < 0:  # counts that do not fit (or marks out of order): numpy says why
        ptr, inst, outside = layout_numpy(op_ids, vocab.shape_tables[0], rec.counts,
                                          rec.marks, n, len(losses))
    if outside:
        warn_outside(rec.batch, outside)
    head = n if losses else None
    heads = [head] if head is not None else []
    graph = Graph.from_arrays(vocab, op_ids, ptr, flat, attrs=attr, instance=inst,
                              outputs=np.asarray(heads + list(outputs), dtype=np.int32))
    return graph, head


_NO_COUNTS = np.zeros(0, np.int64)


def _marks(marks: Sequence[tuple[int, int]]) -> np.ndarray:  # type: ignore[type-arg]
    """The ``(first node, instance)`` marks as an ``int64[M, 2]`` array."""
    # (a flat ``fromiter`` over the pairs: a third of ``np.array``'s time on a list of tuples)
    return np.fromiter(chain.from_iterable(marks), np.int64, 2 * len(marks)).reshape(-1, 2)


@njit(cache=True, nogil=True)
def node_layout(op_ids, arity_of, counts, marks, n, losses):  # type: ignore[no-untyped-def]
    """``(operand_ptr int64[N+1], instance int32[N], outside)`` of a recording in one
    compiled pass (:func:`layout_numpy`, the numpy calls it replaces, is its oracle):
    ``op_ids`` (``N`` = ``n`` nodes, and the ``loss_sum`` node if ``losses`` > 0), each op
    type's arity (``-1``: variadic; those nodes take ``counts`` in order, when given), the
    ``marks`` (``int64[M, 2]``). Nodes outside every instance count as instance 0;
    ``outside`` says how many; ``-1`` where ``counts`` do not match the variadic nodes or
    the marks do not ascend (then the numpy path raises its error)."""
    m = len(op_ids)
    ptr = np.empty(m + 1, np.int64)
    ptr[0] = 0
    given = len(counts) > 0
    j = 0
    for v in range(m):
        c = arity_of[op_ids[v]]
        if v == n and losses:
            c = losses
        elif c < 0 and given and v < n:
            if j == len(counts):
                return ptr, np.empty(0, np.int32), -1
            c = counts[j]
            j += 1
        ptr[v + 1] = ptr[v] + c
    if (given and j != len(counts)) or m != n + (1 if losses else 0):
        return ptr, np.empty(0, np.int32), -1
    inst = np.zeros(m, np.int32)  # (the loss_sum node: instance 0)
    first = marks[0, 0] if len(marks) else n
    if first < 0 or first > n:
        return ptr, inst, -1
    outside = first  # before the first mark: outside every instance (counted as 0)
    for i in range(len(marks)):
        lo = marks[i, 0]
        hi = marks[i + 1, 0] if i + 1 < len(marks) else n
        if hi < lo or hi > n:
            return ptr, inst, -1
        value = marks[i, 1]
        if value < 0:
            outside += hi - lo
            value = 0
        for v in range(lo, hi):
            inst[v] = value
    return ptr, inst, outside


def layout_numpy(op_ids: np.ndarray, arity_of: np.ndarray, counts: list[int],  # type: ignore[type-arg]
                 marks: Sequence[tuple[int, int]], n: int, losses: int
                 ) -> tuple[np.ndarray, np.ndarray, int]:  # type: ignore[type-arg]
    """:func:`node_layout` in numpy (the oracle; it raises numpy's errors where the
    compiled pass returns ``-1``)."""
    counts_all = arity_of[op_ids]  # each op type's arity, -1: variadic
    if counts:
        mine = counts_all[:n]  # (a view)
        mine[mine < 0] = counts
    inst = _instances(marks, n)
    outside = 0
    if n and inst.min() < 0:
        negative = inst < 0
        outside = int(negative.sum())
        inst[negative] = 0
    if losses:
        counts_all[n] = losses
        inst = np.append(inst, np.int32(0))
    ptr = np.zeros(len(op_ids) + 1, dtype=np.int64)
    np.cumsum(counts_all, out=ptr[1:])
    return ptr, inst, outside


def _packed(rec: Recording, loss_op: int) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    """``(op_ids, operand ids, attrs)`` of the recording (the ``loss_sum`` node appended if
    it has loss terms), each list packed in one call (:func:`_pack`). Raises
    ``struct.error`` on an entry that is no integer or out of range."""
    ops, operands, attrs, losses = rec.ops, rec.operands, rec.attrs, rec.losses
    if rec.blocks:  # bulk blocks' operands: merged as arrays
        return with_blocks(rec, _pack(ops, "i"), _pack(attrs, "q"), loss_op)
    if losses:
        return _pack(ops, "i", [loss_op]), _pack(operands, "i", losses), _pack(attrs, "q", [-1])
    return _pack(ops, "i"), _pack(operands, "i"), _pack(attrs, "q")


_EMPTY: list[int] = []
_DTYPES = {"i": (np.int32, 4), "q": (np.int64, 8)}


def _pack(values: list[Any], code: str, more: list[Any] = _EMPTY
          ) -> np.ndarray:  # type: ignore[type-arg]
    """``values`` then ``more`` as an int32 (``code`` ``"i"``) or int64 (``"q"``) array:
    by ``_fastrec.pack`` where built (exact ints, ~2 ns each), else (or for entries it
    leaves) by one ``struct.pack`` (~9 ns each; half ``np.fromiter``'s time), which
    raises ``struct.error`` on an entry that is no integer or out of range."""
    dtype, size = _DTYPES[code]
    out = None if _fastrec is None else _fastrec.pack(values, size, more)
    if out is None:
        out = struct.pack(f"{len(values) + len(more)}{code}", *values, *more)
    return np.frombuffer(out, dtype)


def _check_attrs(vocab: Vocab, rec: Recording) -> None:
    """Raise :class:`GraphError` at the first attr that is no int64 integer (``struct``
    refused the packing: ``np.fromiter`` would truncate ``1.5`` or overflow on ``2**70``)."""
    for node, value in enumerate(rec.attrs):
        if not (is_integer(value) or isinstance(value, bool)) or \
                not -2 ** 63 <= int(value) < 2 ** 63:
            name = vocab[int(rec.ops[node])].name if node < len(rec.ops) else "a node"
            raise GraphError(f"node %{node} ({name}) has attr={value!r}; attrs are integers "
                             f"in int64's range: pass e.g. attr=int(x) or an index")


def _converted(rec: Recording, loss_op: int) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    """What :func:`_packed` returns, by ``np.fromiter`` (which converts what ``struct``
    refuses as it always did, or raises its own error)."""
    ops, operands, attrs, losses = rec.ops, rec.operands, rec.attrs, rec.losses
    op_ids = np.fromiter(ops, np.int32, len(ops))
    attr = np.fromiter(attrs, np.int64, len(attrs))
    if rec.blocks:
        return with_blocks(rec, op_ids, attr, loss_op)
    flat = np.fromiter(operands, np.int32, len(operands))
    if losses:
        op_ids = np.append(op_ids, np.int32(loss_op))
        flat = np.concatenate([flat, np.fromiter(losses, np.int32, len(losses))])
        attr = np.append(attr, np.int64(-1))
    return op_ids, flat, attr


class RecordingWarning(UserWarning):
    """Something recorded in a :class:`~edbatch.api.DynamicBatch` is probably not meant
    that way (e.g. nodes outside every ``with batch.instance()``)."""


def warn_outside(batch: Batch, count: int) -> None:
    """Warn (once per batch) that ``count`` nodes were recorded outside every instance."""
    if getattr(batch, "warned_outside", True):
        return
    batch.warned_outside = True
    warnings.warn(RecordingWarning(
        f"{count} node(s) of this mini-batch were recorded outside any `with "
        f"batch.instance():` block; they count as instance 0. Instances only label nodes "
        f"with their data item (no value, gradient or schedule changes; the lower bound "
        f"and policy training use them): wrap each data item's code in `with "
        f"batch.instance():` (or call batch.next_instance() first). Warned once per batch"),
        stacklevel=4)


def _instances(marks: Sequence[tuple[int, int]], n: int) -> np.ndarray:  # type: ignore[type-arg]
    """Each node's instance id from the ``(first node, instance)`` marks (-1: outside
    every instance)."""
    if not marks:
        return np.full(n, -1, dtype=np.int32)
    # (a flat ``fromiter`` over the pairs: a third of ``np.array``'s time on a list of tuples)
    m = np.fromiter(chain.from_iterable(marks), np.int64, 2 * len(marks)).reshape(-1, 2)
    starts = np.concatenate([[0], m[:, 0], [n]])
    values = np.concatenate([[-1], m[:, 1]]).astype(np.int32)
    return np.repeat(values, np.diff(starts))


def take_graph(batch: Batch, outputs: Sequence[Handle] = ()) -> tuple[Graph, int | None]:
    """The recorded mini-batch's graph (as :meth:`DynamicBatch.graph`), then start the next
    mini-batch without running this one (for callers that schedule and execute themselves,
    e.g. benchmarks that time each phase)."""
    graph = batch.graph(outputs)
    batch.discard()
    return graph
