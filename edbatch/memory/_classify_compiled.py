"""The planner's read classification in one compiled pass (numba).

:func:`classify_compiled` returns exactly what :mod:`edbatch.memory._classify_numpy` (vectorised
numpy, the oracle; ``tests/memory/test_classify_compiled.py`` compares them) computes: the
operand reads of every batch, grouped by ``(batch, slot)``, and whether each group's rows are
consecutive (a view) or not (a gather). A variadic node alone in its batch reads all its
operands as one slot when they share an arena, else one read per operand; those per-operand
reads come first (the oracle gives them negative sort keys).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["classify_compiled", "frame_compiled"]


@njit(cache=True, nogil=True)
def _spans_arenas(v, optr, oids, node_arena):  # type: ignore[no-untyped-def]
    for e in range(optr[v] + 1, optr[v + 1]):
        if node_arena[oids[e]] != node_arena[oids[optr[v]]]:
            return True
    return False


@njit(cache=True, nogil=True)
def _emit(e0, e1, b, oids, node_row, node_arena, out, m, g):  # type: ignore[no-untyped-def]
    """Append edges ``e0:e1`` as one read of batch ``b``; return the new ``(m, g)``."""
    start, rbatch, rows, arena = out
    start[g] = m
    rbatch[g] = b
    for e in range(e0, e1):
        rows[m] = node_row[oids[e]]
        arena[m] = node_arena[oids[e]]
        m += 1
    return m, g + 1


@njit(cache=True, nogil=True)
def _slot(lo, hi, s, b, cons, optr, oids, node_row, node_arena, out, m, g):  # type: ignore[no-untyped-def]
    """Append slot ``s`` of the nodes ``cons[lo:hi]`` that have one as one read."""
    start, rbatch, rows, arena = out
    first = True
    for i in range(lo, hi):
        e = optr[cons[i]] + s
        if e >= optr[cons[i] + 1]:
            continue
        if first:
            start[g] = m
            rbatch[g] = b
            g += 1
            first = False
        rows[m] = node_row[oids[e]]
        arena[m] = node_arena[oids[e]]
        m += 1
    return m, g


@njit(cache=True, nogil=True)
def classify_compiled(cons, bptr, optr, oids, op_ids, variadic, node_row, node_arena, forced):  # type: ignore[no-untyped-def]
    """``(read_start, read_batch, read_view, read_rows, read_arena, num_views)``.

    ``cons``: the batches' nodes in row order, concatenated; batch ``b`` is
    ``cons[bptr[b]:bptr[b + 1]]``. ``variadic[a]``: op type ``a`` has no fixed arity.
    """
    nb = len(bptr) - 1
    total = 0
    for i in range(len(cons)):
        total += optr[cons[i] + 1] - optr[cons[i]]
    out = (np.empty(total + 1, np.int64), np.empty(total + 1, np.int64),
           np.empty(total, np.int64), np.empty(total, np.int32))
    m = g = np.int64(0)  # edges and reads written (np.int64: not Literal[int], one _emit)
    alone = np.zeros(nb, np.int64)  # 1: a variadic node alone, 2: ... over several arenas
    for b in range(nb):
        if bptr[b + 1] - bptr[b] == 1 and variadic[op_ids[cons[bptr[b]]]]:
            v = cons[bptr[b]]
            alone[b] = 2 if _spans_arenas(v, optr, oids, node_arena) else 1
            if alone[b] == 2:  # one read per operand, before all others
                for e in range(optr[v], optr[v + 1]):
                    m, g = _emit(e, e + 1, b, oids, node_row, node_arena, out, m, g)
    for b in range(nb):
        lo, hi = bptr[b], bptr[b + 1]
        if alone[b] == 1:  # all operands as one read
            v = cons[lo]
            if optr[v + 1] > optr[v]:
                m, g = _emit(optr[v], optr[v + 1], b, oids, node_row, node_arena, out, m, g)
        elif alone[b] == 0:
            top = 0
            for i in range(lo, hi):
                top = max(top, optr[cons[i] + 1] - optr[cons[i]])
            for s in range(top):
                m, g = _slot(lo, hi, s, b, cons, optr, oids, node_row, node_arena, out, m, g)
    start, rbatch, rows, arena = out
    start[g] = m
    view, views = _views(start, rbatch, rows, forced, g)
    return start[:g].copy(), rbatch[:g].copy(), view, rows, arena, views


@njit(cache=True, nogil=True)
def _views(start, rbatch, rows, forced, g):  # type: ignore[no-untyped-def]
    """Whether each read's rows ascend by one, and how many such reads of unforced batches."""
    view = np.ones(g, np.bool_)
    views = 0
    for k in range(g):
        for e in range(start[k] + 1, start[k + 1]):
            if rows[e] != rows[e - 1] + 1:
                view[k] = False
                break
        if view[k] and not forced[rbatch[k]]:
            views += 1
    return view, views


@njit(cache=True, nogil=True)
def frame_compiled(op_ids, bptr, place, width):  # type: ignore[no-untyped-def]
    """The planner frame's arrays (``planner._frame_numpy``, the oracle): ``(widths, arena,
    start, stop, rows, pos_row, pos_arena)`` of batches of op types ``op_ids`` and nodes
    ``bptr`` (offsets), one arena per distinct ``width[op]`` (ascending), each arena filled
    from row 0 by the batches in ``place`` order; ``pos_row``/``pos_arena``: the row and
    arena of each position of the batches' concatenated row orders."""
    nb = len(op_ids)
    bw = np.empty(nb, np.int64)
    for b in range(nb):
        bw[b] = width[op_ids[b]]
    widths = np.unique(bw)
    arena = np.searchsorted(widths, bw)
    fill = np.zeros(len(widths), np.int64)
    start = np.empty(nb, np.int64)
    stop = np.empty(nb, np.int64)
    for j in range(nb):
        b = place[j]
        a = arena[b]
        start[b] = fill[a]
        fill[a] += bptr[b + 1] - bptr[b]
        stop[b] = fill[a]
    pos_row = np.empty(bptr[nb], np.int64)
    pos_arena = np.empty(bptr[nb], np.int32)
    for b in range(nb):
        for i in range(bptr[b], bptr[b + 1]):
            pos_row[i] = start[b] + i - bptr[b]
            pos_arena[i] = arena[b]
    return widths, arena, start, stop, fill, pos_row, pos_arena
