"""The hoisted batches' graph readings in numba (:mod:`~edbatch.executor._hoist_ready`'s
numpy functions are their twins, run under ``EDBATCH_BACKEND=python`` and compared in
``tests/executor/test_hoist_ready.py``): per batch the latest producer of its hoisted slots
(:func:`late_batches`) and a slot's operand rows over a group's nodes (:func:`slot_rows`).
The numpy forms make a few array passes and temporaries per call, 40-60 us each on a BiLSTM
mini-batch's ~2,000 nodes a type; these are one loop."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["late_batches", "slot_rows"]


@njit(cache=True, nogil=True)
def late_batches(bptr, nodes, operand_ptr, operand_ids, step, batches, slots):  # type: ignore[no-untyped-def]
    """``late[j]``: the largest ``step`` (producer batch) of operand ``k`` (each of
    ``slots``) of the nodes of batch ``batches[j]`` (``nodes[bptr[b]:bptr[b+1]]``); -1 for
    a batch without nodes."""
    late = np.full(len(batches), -1, np.int64)
    for j in range(len(batches)):
        b = batches[j]
        m = -1
        for p in range(bptr[b], bptr[b + 1]):
            first = operand_ptr[nodes[p]]
            for k in slots:
                s = step[operand_ids[first + k]]
                if s > m:
                    m = s
        late[j] = m
    return late


@njit(cache=True, nogil=True)
def slot_rows(operand_ptr, operand_ids, nodes, k, node_arena, node_row, arena):  # type: ignore[no-untyped-def]
    """The rows of operand ``k`` of ``nodes`` (in order) and whether they ascend by one:
    ``(rows, consecutive)``; ``rows`` is empty if one of them lies outside ``arena``."""
    n = len(nodes)
    rows = np.empty(n, np.int64)
    consecutive = True
    for j in range(n):
        src = operand_ids[operand_ptr[nodes[j]] + k]
        if node_arena[src] != arena:
            return np.empty(0, np.int64), False
        rows[j] = node_row[src]
        if j and rows[j] != rows[j - 1] + 1:
            consecutive = False
    return rows, consecutive
