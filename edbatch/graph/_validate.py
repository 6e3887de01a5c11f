"""Graph checks: every invariant of :meth:`Graph.from_arrays
<edbatch.graph.ir.Graph.from_arrays>`'s arrays, and node depths.

:func:`validated_depth` runs every per-node and per-edge check and the depth in one compiled
pass (:mod:`edbatch.graph._scan`, numba, loaded on first use). Only when that pass finds a
problem does :func:`validate_arrays`, the vectorised numpy version, run to raise its
:class:`~edbatch.errors.GraphError` naming the first offending node and the fix. The numpy
checks and :func:`compute_depth` stay the oracle of the compiled pass
(``tests/graph/test_validate.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import GraphError

#: An :class:`edbatch.graph.ir.Vocab` (not imported: :mod:`edbatch.graph.ir` imports this).
Vocab = Any
Shape = tuple[int, ...]

__all__ = ["compute_depth", "shape_tables", "validate_arrays", "validated_depth"]


def shape_tables(vocab: Vocab) -> tuple[NDArray, NDArray, NDArray]:  # type: ignore[type-arg]
    """``(arity_of int64[K], out_sid int64[K], in_sid int64[K, max(arity, 1)])``: each op
    type's fixed arity (``-1``: variadic), and its output and slot shapes as small ids (a
    slot past the arity is ``-1``)."""
    arity_of = np.array([-1 if op.arity is None else op.arity for op in vocab], dtype=np.int64)
    shape_ids: dict[Shape, int] = {}
    out_sid = np.array([shape_ids.setdefault(op.out_shape, len(shape_ids)) for op in vocab],
                       dtype=np.int64)
    max_arity = max([op.arity or 0 for op in vocab], default=0)
    in_sid = np.full((len(vocab), max(max_arity, 1)), -1, dtype=np.int64)
    for i, op in enumerate(vocab):
        for s, shape in enumerate(op.in_shapes or ()):
            in_sid[i, s] = shape_ids.setdefault(shape, len(shape_ids))
    return arity_of, out_sid, in_sid


def validated_depth(vocab: Vocab, op_ids: NDArray, operand_ptr: NDArray,  # type: ignore[type-arg]
                    operand_ids: NDArray, attrs: NDArray, instance: NDArray,  # type: ignore[type-arg]
                    outputs: NDArray) -> NDArray:  # type: ignore[type-arg]
    """Check the arrays as :func:`validate_arrays` does and return ``int32[N]`` depths.

    Raises:
        GraphError: as :func:`validate_arrays` (the same message for the same arrays).
    """
    n = len(op_ids)
    if (len(operand_ptr) == n + 1 and operand_ptr[0] == 0 and len(attrs) == n
            and len(instance) == n and operand_ptr[-1] == len(operand_ids)):
        try:
            from edbatch.graph._scan import scan
        except ImportError:  # pragma: no cover - numba missing: the numpy checks
            pass
        else:
            arity_of, out_sid, in_sid = vocab.shape_tables
            depth, ok = scan(op_ids, operand_ptr, operand_ids, outputs, arity_of, out_sid,
                             in_sid)
            if ok:
                return depth  # type: ignore[no-any-return]
    validate_arrays(vocab, op_ids, operand_ptr, operand_ids, attrs, instance, outputs)
    return compute_depth(operand_ptr, operand_ids)


def compute_depth(operand_ptr: NDArray[np.int64], operand_ids: NDArray[np.int32]) -> NDArray:  # type: ignore[type-arg]
    n = len(operand_ptr) - 1
    depth = [0] * n
    ptr = operand_ptr.tolist()
    ids = operand_ids.tolist()
    for v in range(n):
        a, b = ptr[v], ptr[v + 1]
        if a != b:
            depth[v] = max([depth[u] for u in ids[a:b]]) + 1
    return np.asarray(depth, dtype=np.int32)


def validate_arrays(vocab: Vocab, op_ids: NDArray, operand_ptr: NDArray,  # type: ignore[type-arg]
                     operand_ids: NDArray, attrs: NDArray, instance: NDArray,  # type: ignore[type-arg]
                     outputs: NDArray) -> None:  # type: ignore[type-arg]
    n, k = len(op_ids), len(vocab)
    if len(operand_ptr) != n + 1 or (n >= 0 and len(operand_ptr) and operand_ptr[0] != 0):
        raise GraphError(f"operand_ptr must have N+1 = {n + 1} entries starting at 0, "
                         f"got {len(operand_ptr)}; build graphs with GraphBuilder")
    if np.any(np.diff(operand_ptr) < 0) or operand_ptr[-1] != len(operand_ids):
        raise GraphError("operand_ptr must be non-decreasing and end at len(operand_ids)")
    if len(attrs) != n or len(instance) != n:
        raise GraphError(f"attrs and instance must have one entry per node ({n})")
    bad = np.flatnonzero((op_ids < 0) | (op_ids >= k))
    if len(bad):
        v = int(bad[0])
        raise GraphError(f"node %{v} has unknown op id {int(op_ids[v])}; the vocabulary has "
                         f"{k} op types (ids 0..{k - 1}). Add the op type to the vocabulary")
    consumer = np.repeat(np.arange(n, dtype=np.int64), np.diff(operand_ptr))
    bad = np.flatnonzero((operand_ids < 0) | (operand_ids >= consumer))
    if len(bad):
        e = int(bad[0])
        v, u = int(consumer[e]), int(operand_ids[e])
        what = "itself (a cycle)" if u == v else (
            f"%{u}, which does not exist yet" if u >= 0 else f"invalid id {u}")
        raise GraphError(
            f"node %{v} ({vocab[int(op_ids[v])].name}) refers to {what}: nodes may only use "
            f"earlier nodes (topological order). Create the operand before its user; a graph "
            f"that needs a later node contains a cycle")
    _check_arity_and_shapes(vocab, op_ids, operand_ptr, operand_ids, consumer)
    bad = np.flatnonzero((outputs < 0) | (outputs >= n))
    if len(bad):
        raise GraphError(f"output {int(outputs[bad[0]])} is not a node id (graph has {n} nodes)")


def _check_arity_and_shapes(vocab: Vocab, op_ids: NDArray, operand_ptr: NDArray,  # type: ignore[type-arg]
                            operand_ids: NDArray, consumer: NDArray) -> None:  # type: ignore[type-arg]
    arity_of = vocab.shape_tables[0]
    arity = np.diff(operand_ptr)
    want = arity_of[op_ids] if len(op_ids) else np.zeros(0, np.int64)
    bad = np.flatnonzero((want >= 0) & (want != arity))
    if len(bad):
        v = int(bad[0])
        op = vocab[int(op_ids[v])]
        raise GraphError(f"node %{v} ({op.name}) has {int(arity[v])} operands; op type "
                         f"{op.name!r} takes exactly {op.arity}. Pass {op.arity} operands")
    # Shapes: compare the producer's out_shape with the consumer slot's in_shape, per edge.
    _, out_sid, in_sid = vocab.shape_tables
    if not len(operand_ids):
        return
    slot = np.arange(len(operand_ids)) - np.repeat(operand_ptr[:-1], arity)
    cop = op_ids[consumer]
    checked = arity_of[cop] >= 0
    want_sid = np.where(checked, in_sid[cop, np.minimum(slot, in_sid.shape[1] - 1)], -1)
    got_sid = out_sid[op_ids[operand_ids]]
    bad = np.flatnonzero(checked & (want_sid != got_sid))
    if len(bad):
        e = int(bad[0])
        v, u, s = int(consumer[e]), int(operand_ids[e]), int(slot[e])
        op, prod = vocab[int(op_ids[v])], vocab[int(op_ids[u])]
        raise GraphError(
            f"shape mismatch at node %{v} ({op.name}) operand {s}: %{u} ({prod.name}) produces "
            f"shape {prod.out_shape}, but {op.name!r} expects {op.in_shapes[s]} in slot {s}. "  # type: ignore[index]
            f"Fix the operand order or the op types' shapes")
