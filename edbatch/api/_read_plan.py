"""A typed segment's reads planned in one compiled pass (:func:`read_plan`, for
:func:`~edbatch.api._typed._reads`): the operand layout, each read's range, whether it is
one batch's consecutive rows, the reads grouped by the set of producer batches they hit,
and every grouped read's rows in its group's joined outputs. Where Python built the ranges,
a producer list per read and a concatenation per group (about 75 us less per large MoE
segment, of about 225). :func:`read_plan_py` is its Python twin, the tests' oracle.
Compiled on first call, cached on disk."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from edbatch.api._bulk_scan import read_layout, read_runs

__all__ = ["read_plan", "read_plan_py"]


@njit(cache=True, nogil=True)
def _same_row(hit, a, b):  # type: ignore[no-untyped-def]
    for t in range(hit.shape[1]):
        if hit[a, t] != hit[b, t]:
            return False
    return True


@njit(cache=True, nogil=True)
def _bounds(e0, edges, sizes, arity):  # type: ignore[no-untyped-def]
    """Per read (slot by slot, batch by batch) its ``(batch, slot, lo, hi)``."""
    k = len(sizes)
    reads = 0
    for b in range(k):
        reads += 1 if arity[b] < 0 else arity[b]
    rb = np.empty((reads, 4), np.int64)
    r = 0
    for b in range(k):
        if arity[b] < 0:
            rb[r, 0], rb[r, 1], rb[r, 2], rb[r, 3] = b, 0, e0[b], e0[b] + edges[b]
            r += 1
        else:
            for j in range(arity[b]):
                lo = e0[b] + j * sizes[b]
                rb[r, 0], rb[r, 1], rb[r, 2], rb[r, 3] = b, j, lo, lo + sizes[b]
                r += 1
    return rb


@njit(cache=True, nogil=True)
def _groups(whole, hit):  # type: ignore[no-untyped-def]
    """Per read its group (-1 when ``whole``; one per distinct row of ``hit``, numbered
    by first read) and each group's first read."""
    reads = len(whole)
    gid = np.full(reads, -1, np.int64)
    reps = np.empty(reads, np.int64)
    g = 0
    for r in range(reads):
        if whole[r]:
            continue
        for q in range(g):
            if _same_row(hit, reps[q], r):
                gid[r] = q
                break
        if gid[r] < 0:
            reps[g] = r
            gid[r] = g
            g += 1
    return gid, reps[:g]


@njit(cache=True, nogil=True)
def read_plan(operands, ptr, batch_of, row_of, sizes, arity):  # type: ignore[no-untyped-def]
    """``(pb, lr, rb, whole, gid, ghit, flat)`` of a typed segment's reads (``arity``: per
    batch its op's arity, -1 for a variadic op, one read of all its operands): the layout of
    :func:`~edbatch.api._bulk_scan.read_layout`; per read (slot by slot, batch by batch) its
    ``(batch, slot, lo, hi)`` in ``rb``, whether it is one batch's consecutive rows
    (``whole``) and else its group (``gid``, -1 when whole: groups numbered by first read,
    one per set of producer batches hit, ``ghit[g]`` that set as a mask); ``flat[e]`` for a
    grouped read's position ``e``: its row in the group's producers' outputs joined in batch
    order (other positions unset)."""
    pb, lr, e0, edges = read_layout(operands, ptr, batch_of, row_of, sizes)
    k = len(sizes)
    rb = _bounds(e0, edges, sizes, arity)
    whole, hit = read_runs(pb, lr, rb[:, 2].copy(), rb[:, 3].copy(), k)
    gid, reps = _groups(whole, hit)
    ghit = np.empty((len(reps), k), np.bool_)
    flat = np.empty(len(pb), np.int64)
    at = np.zeros(k, np.int64)
    for q in range(len(reps)):
        s = 0
        for b in range(k):
            ghit[q, b] = hit[reps[q], b]
            if ghit[q, b]:
                at[b] = s
                s += sizes[b]
        for r in range(len(gid)):
            if gid[r] == q:
                for e in range(rb[r, 2], rb[r, 3]):
                    flat[e] = lr[e] + at[pb[e]]
    return pb, lr, rb, whole, gid, ghit, flat


def read_plan_py(operands: NDArray[Any], ptr: NDArray[np.int64], batch_of: NDArray[np.int64],
                 row_of: NDArray[np.int64], sizes: NDArray[np.int64], arity: NDArray[np.int64]
                 ) -> tuple[NDArray[Any], ...]:
    """:func:`read_plan` in Python and numpy (its oracle): the same arrays (``flat`` with
    zeros where it leaves positions unset)."""
    pb, lr, e0, edges = read_layout(operands, ptr, batch_of, row_of, sizes)
    bounds: list[tuple[int, int, int, int]] = []
    for b, (a, lo) in enumerate(zip(arity.tolist(), e0.tolist(), strict=True)):
        size = int(sizes[b])
        if a < 0:
            bounds.append((b, 0, lo, lo + int(edges[b])))
        else:
            bounds.extend((b, j, lo + j * size, lo + (j + 1) * size) for j in range(a))
    rb = np.array(bounds, np.int64).reshape(-1, 4)
    whole = np.ones(len(bounds), np.bool_)
    gid = np.full(len(bounds), -1, np.int64)
    keys: dict[tuple[int, ...], int] = {}
    flat = np.zeros(len(pb), np.int64)
    for r, (_, _, lo, hi) in enumerate(bounds):
        run = pb[lo:hi], lr[lo:hi]
        if (run[0] == run[0][0]).all() and (np.diff(run[1]) == 1).all():
            continue
        whole[r] = False
        used = tuple(np.unique(run[0]).tolist())
        gid[r] = keys.setdefault(used, len(keys))
        at = np.zeros(len(sizes), np.int64)
        src = np.array(used, np.int64)
        at[src] = np.cumsum(sizes[src]) - sizes[src]
        flat[lo:hi] = run[1] + at[run[0]]
    ghit = np.zeros((len(keys), len(sizes)), np.bool_)
    for used, q in keys.items():
        ghit[q, list(used)] = True
    return pb, lr, rb, whole, gid, ghit, flat
