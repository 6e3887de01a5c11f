"""Which read of each node comes first: the analysis both ``aligned`` layouts start from.

Shared by the numpy reference (:func:`edbatch.memory._aligned.aligned_orders_python`) and the
compiled layout (:mod:`edbatch.memory._aligned_compiled`), so the two cannot drift apart.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.schedule.schedule import Batch

__all__ = ["first_reads"]

Int64s = NDArray[np.int64]


def first_reads(graph: Graph, batches: list[Batch], step: NDArray[np.int64]
                ) -> tuple[Int64s, Int64s, Int64s, NDArray[np.bool_], Int64s, int]:
    """``(arity, consumer, slot, deferred, first, slots)`` of ``graph`` under ``batches``.

    ``consumer`` / ``slot``: every operand read by a batched, non-deferred consumer (the
    reads that order rows); ``deferred[b]``: batch ``b`` feeds no batched consumer (it is
    laid out after its producers, e.g. per-node losses); ``first[v]``: the index (into
    ``consumer`` / ``slot``) of node ``v``'s first read, the smallest (consumer step, slot,
    consumer id), or -1; ``slots``: one more than the largest slot read; ``step[v]``: the
    batch that runs ``v``.
    """
    n = graph.num_nodes
    forced = np.array([b.forced for b in batches], dtype=bool)
    arity = graph.arity.astype(np.int64)
    consumer = np.repeat(np.arange(n, dtype=np.int64), arity)
    slot = np.arange(len(graph.operand_ids), dtype=np.int64) - np.repeat(
        graph.operand_ptr[:-1], arity)
    producer = graph.operand_ids.astype(np.int64)
    cstep = step[consumer]
    feeds_batched = np.zeros(len(batches), dtype=bool)
    feeds_batched[step[producer[~forced[cstep]]]] = True
    deferred = ~feeds_batched & ~forced
    keep = ~forced[cstep] & ~deferred[cstep]
    consumer, slot, producer, cstep = consumer[keep], slot[keep], producer[keep], cstep[keep]
    # Each producer's first read: the smallest (consumer step, slot, consumer id).
    by_read = np.lexsort((consumer, slot, cstep))
    first = np.full(n, -1, dtype=np.int64)
    seen, at = np.unique(producer[by_read], return_index=True)
    first[seen] = by_read[at]
    slots = int(slot.max(initial=0)) + 1
    return arity, consumer, slot, deferred, first, slots
