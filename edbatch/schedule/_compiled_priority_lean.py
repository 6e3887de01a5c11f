"""The linear priority policy's run-time pick: only the features its weights read, scored
as they are computed.

:func:`~edbatch.schedule._compiled_priority.priority_features` writes all 23 columns of
every ready type's row and :func:`~edbatch.schedule._compiled_priority._best` then takes
``x . w`` over all 32 columns; a learned linear policy (``trainer=priority``) has 22
non-zero weights and no context ones. :func:`lean_pick` computes, per ready type, the sum
``w . f`` over the columns whose weight is non-zero, in column order, without writing a
row: the same score bit for bit (a skipped term is ``x * 0.0``, a signed zero, which
leaves the sum unchanged), so the same argmax (the first on ties) and the same schedules
(tested against the full rows). Critical path's choice is only computed here if
``cp_feed`` is read, the second-highest ready height only if ``lead`` is, the per-node
height sums only if ``mean_gap`` or ``top_share`` is.

Used for linear weights without context features (:func:`lean_ok`), when no feature row
is recorded (a trace or a learner that reads rows takes the full path).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from edbatch.schedule._compiled_keys import _ratio
from edbatch.schedule._compiled_priority_ctx import FIRST_CONTEXT

__all__ = ["lean_ok", "lean_pick"]


@njit(cache=True, inline="always")
def _join_wait(a, r, ids, rel):  # type: ignore[no-untyped-def]
    """Of ready type ``a`` among the ``r`` ready types ``ids``: the nodes of other ready
    types its batch would release (``join``) and the most any one other ready type would
    release of ``a``'s (``wait``), from the release sums ``rel``."""
    join, wait = 0, 0
    for j in range(r):
        b = ids[j]
        join += rel[a, b]
        v = rel[b, a] if b != a else 0
        wait = v if v > wait else wait
    return join - rel[a, a], wait


@njit(cache=True)
def lean_ok(w, nh):  # type: ignore[no-untyped-def]
    """Whether :func:`lean_pick` scores like the full rows: a linear scorer (``nh`` 0) whose
    context weights (columns 23-) are all 0."""
    if nh > 0:
        return False
    for j in range(FIRST_CONTEXT, len(w)):
        if w[j] != 0.0:
            return False
    return True


@njit(cache=True)
def lean_pick(k, rlen, tw, maxh, rem, batchable, ready, start, height, total, last, hmax,  # noqa: C901
              logt, seen, sumh, cmax, ctop, ids, rel, tst, w, cp):  # type: ignore[no-untyped-def]
    """The op id :func:`~edbatch.schedule._compiled_priority._best` picks over the full rows
    of this decision (linear ``w``, :func:`lean_ok`; ``cp``: critical path's choice; the
    state arrays as :func:`~edbatch.schedule._compiled_priority.priority_features` reads
    them, the release sums ``rel``/``tst`` only if a release weight is non-zero).

    One function on purpose: the same code split into helpers (plain or ``inline="always"``)
    ran 2-3x slower on module_net (measured), the branches are one per feature."""
    sums = w[8] != 0.0 or w[9] != 0.0
    top, n_ready, r = -1, 0, 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            ids[r] = a
            r += 1
            n_ready += rlen[a]
            if maxh[a] > top:
                top = maxh[a]
            if sums:
                for j in range(start[a] + seen[a], start[a] + rlen[a]):
                    h = height[ready[j]]
                    sumh[a] += h
                    if h > cmax[a]:
                        cmax[a], ctop[a] = h, 1
                    elif h == cmax[a]:
                        ctop[a] += 1
                seen[a] = rlen[a]
    if r == 1:
        return ids[0]
    top2, ntop1 = -1, 0
    if w[21] != 0.0:
        for i in range(r):
            h = maxh[ids[i]]
            if h == top:
                ntop1 += 1
            elif h > top2:
                top2 = h
    join_w = w[16] != 0.0 or w[18] != 0.0
    best, best_s = 0, -np.inf
    for i in range(r):
        a = ids[i]
        c, t = rlen[a], tw[a]
        gap = maxh[a] - top
        s = 0.0
        if w[0] != 0.0:
            s += gap * w[0]
        if w[1] != 0.0:
            s += _ratio(rlen, tw, a) * w[1]
        if w[2] != 0.0:
            s += (1.0 if c >= t else 0.0) * w[2]
        if w[3] != 0.0:
            s += (logt[c] / 4.0) * w[3]
        if w[4] != 0.0:
            s += (c / rem[a]) * w[4]
        if w[5] != 0.0:
            s += (logt[t - c if t > c else 0] / 4.0) * w[5]
        if w[6] != 0.0:
            s += (logt[rem[a] - c] / 8.0) * w[6]
        if w[7] != 0.0:
            s += (1.0 if a == last else 0.0) * w[7]
        if w[8] != 0.0:
            mg = maxh[a] - sumh[a] / c
            s += ((mg if mg < 16.0 else 16.0) / 16.0) * w[8]
        if w[9] != 0.0:
            s += (ctop[a] / c) * w[9]
        if w[10] != 0.0:
            s += (maxh[a] / hmax) * w[10]
        if w[11] != 0.0:
            s += (1.0 if gap == -1 else 0.0) * w[11]
        if w[12] != 0.0:
            s += (1.0 if gap == 0 else 0.0) * w[12]
        if w[13] != 0.0:
            s += (rem[a] / total[a]) * w[13]
        if w[14] != 0.0:
            s += (c / n_ready) * w[14]
        if w[15] != 0.0:
            s += (math.log1p(tst[2, a]) / 4.0) * w[15]
        join, wait = 0, 0
        if join_w:
            join, wait = _join_wait(a, r, ids, rel)
            if w[16] != 0.0:
                s += (join / c) * w[16]
        if w[17] != 0.0:
            s += (rel[a, a] / c) * w[17]
        if w[18] != 0.0:
            s += (wait / c) * w[18]
        if w[19] != 0.0:
            s += (rel[cp, a] / c if cp != a else 0.0) * w[19]
        if w[20] != 0.0:
            pc = (tst[0, a] - tst[1, a]) / c
            s += ((pc if pc < 4.0 else 4.0) / 4.0) * w[20]
        if w[21] != 0.0:
            other = top2 if (maxh[a] == top and ntop1 == 1) else top
            ld = maxh[a] - other
            s += ((ld if ld < 16 else 16) / 16.0 if ld > -16 else -1.0) * w[21]
        if w[22] != 0.0:
            s += (math.log1p(-gap) / 4.0) * w[22]
        if s > best_s:
            best, best_s = i, s
    return ids[best]
