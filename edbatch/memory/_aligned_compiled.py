"""The ``aligned`` row orders with the per-batch backward pass in numba.

:func:`aligned_orders_compiled` returns exactly what
:func:`edbatch.memory._aligned.aligned_orders` returns (the Python version is the oracle; the
tests compare them): each producer's first read is one compiled pass over the edges
(:func:`_first_reads`, the same result as the numpy
:func:`~edbatch.memory._first_reads.first_reads` the oracle uses, without its sorts), and the
loop over batches, one small sort per batch, runs compiled on the concatenated node ids
instead of costing a few numpy calls per batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.schedule.schedule import Schedule

__all__ = ["aligned_cons_compiled", "aligned_orders_compiled"]


@njit(cache=True)
def _deferred_batches(optr, oids, step, forced):  # type: ignore[no-untyped-def]
    """``(arity, deferred)``: a batch is deferred if no edge of a batched consumer reads it
    and it is not forced (as :func:`~edbatch.memory._first_reads.first_reads`)."""
    n, nb = len(optr) - 1, len(forced)
    arity = np.empty(n, np.int64)
    feeds = np.zeros(nb, np.bool_)
    for v in range(n):
        arity[v] = optr[v + 1] - optr[v]
        if not forced[step[v]]:
            for e in range(optr[v], optr[v + 1]):
                feeds[step[oids[e]]] = True
    deferred = np.empty(nb, np.bool_)
    for b in range(nb):
        deferred[b] = not feeds[b] and not forced[b]
    return arity, deferred


@njit(cache=True)
def _first_reads(optr, oids, step, forced):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.memory._first_reads.first_reads` in one pass over the edges (consumer
    by consumer, slots in order): a producer's first read is the smallest (consumer step,
    slot, consumer id), kept by a strict comparison so that ties keep the earliest edge as
    the stable sort there does. ``step`` of an unscheduled node is -1 (read as numpy does)."""
    n = len(optr) - 1
    arity, deferred = _deferred_batches(optr, oids, step, forced)
    kept = 0
    for v in range(n):
        if not forced[step[v]] and not deferred[step[v]]:
            kept += arity[v]
    consumer = np.empty(kept, np.int64)
    slot = np.empty(kept, np.int64)
    first = np.full(n, -1, np.int64)
    i, slots = 0, 1
    for v in range(n):
        s = step[v]
        if forced[s] or deferred[s]:
            continue
        for e in range(optr[v], optr[v + 1]):
            p, k = oids[e], e - optr[v]
            consumer[i], slot[i] = v, k
            slots = max(slots, k + 1)
            f = first[p]
            if f < 0 or s < step[consumer[f]] or (s == step[consumer[f]] and (
                    k < slot[f] or (k == slot[f] and v < consumer[f]))):
                first[p] = i
            i += 1
    return arity, consumer, slot, deferred, first, slots


@njit(cache=True)
def _backward(nodes, bptr, deferred, first, consumer, slot, step, slots, n):  # type: ignore[no-untyped-def]
    """Row order of every batch, last batch first: ascending first-read key, unread last."""
    pos = np.zeros(n, np.int64)
    out = nodes.copy()
    unread = np.int64(1) << 62
    for b in range(len(bptr) - 2, -1, -1):
        lo, hi = bptr[b], bptr[b + 1]
        ids = nodes[lo:hi].copy()
        any_read = False
        for v in ids:
            if first[v] >= 0:
                any_read = True
                break
        if hi - lo > 1 and not deferred[b] and any_read:
            key = np.empty(hi - lo, np.int64)
            for i in range(hi - lo):
                e = first[ids[i]]
                if e >= 0:
                    c = consumer[e]
                    key[i] = (step[c] * slots + slot[e]) * (n + 1) + pos[c]
                else:
                    key[i] = unread + ids[i]
            ids = ids[np.argsort(key, kind="mergesort")]
        for i in range(hi - lo):
            pos[ids[i]] = i
            out[lo + i] = ids[i]
    return out, pos


@njit(cache=True)
def _deferred(out, bptr, deferred, arity, optr, oids, pos, step, width, op):  # type: ignore[no-untyped-def]
    """Deferred batches follow their slot-0 producers' rows: (width, step, position), as
    one stable sort of a single key per batch (the oracle's ``lexsort`` of three keys; the
    three stable argsorts this took before were ~0.4 ms of a Tree-LSTM mini-batch)."""
    k = len(width)
    rank = np.empty(k, np.int64)  # each op type's width as its rank among the widths
    for a in range(k):
        r = 0
        for c in range(k):
            if width[c] < width[a] and _first_of(width, c):
                r += 1
        rank[a] = r
    steps = len(bptr) + 1  # step[p] + 1 in [0, steps)
    rows = len(pos) + 1
    for b in range(len(bptr) - 1):
        lo, hi = bptr[b], bptr[b + 1]
        if not deferred[b] or hi - lo < 2:
            continue
        ids = out[lo:hi].copy()
        if arity[ids].min() == 0:
            continue
        key = np.empty(hi - lo, np.int64)
        for i in range(hi - lo):
            p = oids[optr[ids[i]]]
            key[i] = (rank[op[p]] * steps + step[p] + 1) * rows + pos[p]
        out[lo:hi] = ids[np.argsort(key, kind="mergesort")]


@njit(cache=True)
def _first_of(width, c):  # type: ignore[no-untyped-def]
    """Whether op type ``c`` is the first with its width (each width counted once)."""
    for a in range(c):
        if width[a] == width[c]:
            return False
    return True


def aligned_orders_compiled(graph: Graph, schedule: Schedule) -> list[NDArray[np.int32]]:
    """:func:`~edbatch.memory._aligned.aligned_orders`, with its loops compiled."""
    batches = schedule.batches
    if not batches:
        return []
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    bptr = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bptr[1:])
    nodes = np.concatenate([b.node_ids for b in batches]).astype(np.int64)
    forced = np.array([b.forced for b in batches], dtype=np.bool_)
    out32 = aligned_cons_compiled(graph, nodes, bptr, forced).astype(np.int32)
    return [out32[bptr[i]:bptr[i + 1]] for i in range(len(batches))]


def aligned_cons_compiled(graph: Graph, nodes: NDArray[np.int64], bptr: NDArray[np.int64],
                          forced: NDArray[np.bool_], width: NDArray[np.int64] | None = None
                          ) -> NDArray[np.int64]:
    """:func:`aligned_orders_compiled`'s row orders concatenated (``int64``), of the
    schedule whose batches are ``nodes[bptr[b]:bptr[b + 1]]`` (``forced[b]``: forced);
    ``width``: each op type's flattened output width, if known."""
    n = graph.num_nodes
    if not len(forced):
        return np.zeros(0, np.int64)
    step = np.full(n, -1, dtype=np.int64)
    step[nodes] = np.repeat(np.arange(len(forced), dtype=np.int64), np.diff(bptr))
    optr = graph.operand_ptr.astype(np.int64)
    oids = graph.operand_ids.astype(np.int64)
    arity, consumer, slot, deferred, first, slots = _first_reads(optr, oids, step, forced)
    out, pos = _backward(nodes, bptr, deferred, first, consumer, slot, step, slots, n)
    if deferred.any():
        if width is None:
            width = np.array([math.prod(op.out_shape) for op in graph.vocab], dtype=np.int64)
        _deferred(out, bptr, deferred, arity, optr, oids, pos, step, width,
                  graph.op_ids.astype(np.int64))
    return out  # type: ignore[no-any-return]
