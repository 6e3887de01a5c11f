"""The ``aligned`` row orders: one backward pass over the batches, vectorised per batch.

Each node is keyed by the read that will consume it first: ``(step of the consumer's batch,
operand slot, the consumer's position in its batch)``. Walking the schedule backwards, a
batch's consumers already have their positions, so sorting its nodes by that key lays its
rows out as one run per (consumer batch, slot), each run in its consumer's order: a
Tree-LSTM batch whose nodes are all children of one later batch becomes [left children in
parent order][right children in parent order], and both of the parent's reads are views.
Batches are placed in schedule order.

Batches whose only consumers are forced (unbatchable) batches, such as the per-node losses
feeding ``loss_sum``, are *deferred*: they impose nothing while the others are ordered and
afterwards follow their slot-0 producers' rows, so a loss read over whole state batches is a
view when those rows are consecutive. With batches placed in schedule order, one arena per
output width, a producer's row order is the order of (width, batch, position in the batch),
so no layout has to be built for that.

Unlike the chain planner (``planned``), a node gets one key only, from its first consumer, and
reads that span several producer batches are not joined, so it finds fewer views on
Tree-LSTM and lattice schedules; it costs ``O(E log E)`` numpy work in all, a few
milliseconds for a 64-instance mini-batch, against tenths of seconds for the chain planner.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.memory._first_reads import first_reads
from edbatch.schedule.schedule import Schedule

__all__ = ["aligned_orders", "aligned_orders_python"]


def aligned_orders(graph: Graph, schedule: Schedule,
                   backend: str | None = None) -> list[NDArray[np.int32]]:
    """Per-batch row orders: consumer order, deferred batches in their producers' order.

    ``backend`` (default ``$EDBATCH_BACKEND`` or ``compiled``): ``compiled`` runs the
    per-batch loop in numba (:mod:`edbatch.memory._aligned_compiled`), ``python`` runs
    :func:`aligned_orders_python`, the oracle; both give the same orders.
    """
    from edbatch.memory._aligned_compiled import aligned_orders_compiled
    from edbatch.schedule.compiled import resolve_backend

    if resolve_backend(backend) == "compiled":
        return aligned_orders_compiled(graph, schedule)
    return aligned_orders_python(graph, schedule)


def aligned_orders_python(graph: Graph, schedule: Schedule) -> list[NDArray[np.int32]]:
    """:func:`aligned_orders` in numpy, one batch at a time (the reference)."""
    batches = schedule.batches
    n = graph.num_nodes
    step = schedule.step_of(n)
    arity, consumer, slot, deferred, first, slots = first_reads(graph, batches, step)
    pos = np.zeros(n, dtype=np.int64)
    unread = 1 << 62  # nodes nobody batched reads go last, in id order
    orders: list[NDArray[np.int32]] = [np.zeros(0, dtype=np.int32)] * len(batches)
    for b in range(len(batches) - 1, -1, -1):
        ids = np.asarray(batches[b].node_ids, dtype=np.int64)
        e = first[ids]
        read = e >= 0
        if len(ids) > 1 and not deferred[b] and read.any():
            e = np.where(read, e, 0)
            c = consumer[e]
            key = np.where(read, (step[c] * slots + slot[e]) * (n + 1) + pos[c], unread + ids)
            ids = ids[np.argsort(key, kind="stable")]
        pos[ids] = np.arange(len(ids))
        orders[b] = ids.astype(np.int32)
    width = np.array([math.prod(op.out_shape) for op in graph.vocab], dtype=np.int64)
    for b in np.flatnonzero(deferred).tolist():
        ids = orders[b].astype(np.int64)
        if len(ids) > 1 and int(arity[ids].min()) > 0:
            p = graph.operand_ids[graph.operand_ptr[ids]]
            by_row = np.lexsort((pos[p], step[p], width[graph.op_ids[p]]))
            orders[b] = ids[by_row].astype(np.int32)
    return orders
