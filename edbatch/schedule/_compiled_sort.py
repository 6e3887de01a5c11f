"""Sorting a batch's node ids in the compiled core
(:func:`~edbatch.schedule._compiled.run_schedule`).

A batch leaves the core with its node ids ascending. Sorting was a quarter of
``run_schedule`` on a Tree-LSTM mini-batch: its few batches are large (every leaf, every
loss: about half the nodes each) and dense in the id range. :func:`sort_nodes` skips a
batch that is already ascending and sorts a dense one by marking its ids in a bitmap and
scanning the range between its smallest and largest id (``O(c + range)``, no comparisons);
a sparse one of at most :data:`SMALL` ids is sorted by insertion, a larger sparse one
(a lattice arc batch: about 25 ids spread over the mini-batch) still goes to
``ndarray.sort``. The result is the same ascending array either way.
"""

from __future__ import annotations

from numba import njit

__all__ = ["DENSE_RANGE", "SMALL", "sort_nodes"]

#: A batch of ``c`` distinct ids whose range (largest - smallest) is below ``DENSE_RANGE * c``
#: is sorted through the bitmap. (Per mini-batch of 64, fsm schedule, median of 60 runs:
#: ``run_schedule`` 0.264 -> 0.199 ms on Tree-LSTM, 0.72 -> 0.64 on lattice, 0.74 -> 0.64
#: on the BiLSTM tagger.)
DENSE_RANGE = 8
#: A sparse batch of at most ``SMALL`` ids is sorted by insertion, not ``ndarray.sort``
#: (module_net cells: the ~8-row attention batches spread over the mini-batch; the run-time
#: loops, critical path's and the priority policy's, 16-26 us shorter per mini-batch of 64).
SMALL = 16


@njit(cache=True)
def sort_nodes(batch, mark):  # type: ignore[no-untyped-def]  # noqa: C901
    """Sort the distinct node ids ``batch`` in place; ``mark``: ``bool[N]``, all ``False``
    (left so)."""
    c = len(batch)
    if c < 2:
        return
    lo, hi, ascending = batch[0], batch[0], True
    for j in range(1, c):
        v = batch[j]
        if v < batch[j - 1]:
            ascending = False
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
    if ascending:
        return
    if hi - lo < DENSE_RANGE * c:
        for j in range(c):
            mark[batch[j]] = True
        j = 0
        for v in range(lo, hi + 1):
            if mark[v]:
                mark[v] = False
                batch[j] = v
                j += 1
    elif c <= SMALL:  # insertion sort (cheaper than the call to numba's quicksort here)
        for j in range(1, c):
            v = batch[j]
            i = j - 1
            while i >= 0 and batch[i] > v:
                batch[i + 1] = batch[i]
                i -= 1
            batch[i + 1] = v
    else:
        batch.sort()
