"""The linear priority policy's run-time loop: one compiled function, no call per decision.

:func:`~edbatch.schedule._compiled_priority._schedule` with the lean pick called, per
decision, :func:`~edbatch.schedule._compiled_priority_lean.lean_pick` (22 arrays passed),
``_critical`` and, per batch, the release upkeep's ``retire_tracked`` and ``_mark_ready``:
on module_net about 1.8x critical path's loop, most of it spent passing arrays and
recomputing what had not changed. :func:`fused_schedule` is the same schedule written as
one loop body:

* **cached own terms**: the columns of a ready type that read only its own state (``fill``,
  ``complete``, counts, ``mean_gap``, ``top_share``, ``rel_height``, ``rem_share``,
  ``rel_log``, ``rel_self``, ``partial``) are kept as ``w_j * f_j`` per type and recomputed
  only for a *dirty* type: one whose ready list grew or whose release sums changed since it
  was last scored (a ready type's ``T(a)`` and ``rem(a)`` only change when it runs);
* **incremental join and wait**: ``join[a]`` (nodes of other ready types ``a`` releases) is
  kept exact edge by edge and per ready-set change (a ready-set change reads a column of the
  release counts as a row of their transpose ``relt``: contiguous, no branch); ``wait[a]``
  (the most any other type releases of ``a``'s) rises with a count at once and is rescanned
  only when the count that held its maximum falls (a type with no ready nodes has an
  all-zero release row, so the ready types' rows are all rows). Module_net test mini-batches
  of 64 with P (issue 30, 2026-11-27, load 2.6): 158 -> 154 us a graph, same schedules;
* critical path's choice read off the same pass that lists the ready types (its ``fill``
  is the cached one), the release upkeep and the type-wise count written out in the loop;
* **release sums from a type mask**: per node, its ready operands (a count) and the op types
  among them (one bit per type, ``ceil(K / 64)`` words) instead of
  :mod:`~edbatch.schedule._compiled_release`'s per-(node, operand type) counts, their
  numbering pass (``_user_slots``) and type sums. A ready batch takes every ready node of
  its type ``b``, so a user loses all its ready ``b`` operands at its first edge from the
  batch, and its credit is settled there from its counts before the batch: with ``b``
  alone it is released by the batch (credit out), with one other type left credit in.
  Module_net test mini-batches of 64 (2026-11-27, load 7): 230 -> 205 us a graph, 1.32x ->
  1.16x critical path's loop, same schedules on 40 graphs.

The score is the twin's sum, term by term in column order over the 23 columns (each term
``f_j * w_j`` computed by the same expression; a zero weight's term is +-0.0 and changes no
sum's comparison), so the same argmax, the first on ties: the same schedules
(``tests/policies/test_priority_fused.py`` against the full rows and the Python twin). No
array view and no call taking an array inside the loop but ``sort_nodes`` once a batch:
numba counts references to them with an atomic each way (18-24% of this loop's perf
samples before). Used for linear weights without context features
(:func:`~edbatch.schedule._compiled_priority_lean.lean_ok`), no prefix, nothing traced.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from edbatch.schedule._compiled import start_state
from edbatch.schedule._compiled_priority_ctx import FIRST_CONTEXT
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["fused_schedule"]

_OWN = (1, 2, 3, 4, 5, 6, 8, 9, 10, 13, 15, 17, 20)  # the columns cached per type


@njit(cache=True)
def fused_schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,  # noqa: C901
                   total, w, release):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.schedule._compiled_priority.run_priority`'s result for linear ``w``
    without context weights (``release``: whether a release weight is non-zero, so the
    release sums are kept): ``(batch_op, batch_forced, batch_ptr, nodes, overrides,
    decisions)``. One function on purpose (see the module doc)."""
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    hmax = 1.0
    for v in range(n):
        if height[v] + 1.0 > hmax:
            hmax = height[v] + 1.0
    tmax = 0
    for a in range(k):
        tmax = total[a] if total[a] > tmax else tmax
    logt = np.full(tmax + 1, -1.0)  # log1p(i), filled when first read (few i are)
    # the release sums (module doc): per node its ready operands and, one bit per op type,
    # the types they have; the sources are the first fresh ready nodes
    nw = (k + 63) // 64 if release else 0
    rdy = np.zeros(n if release else 0, np.int64)
    mask = np.zeros(n * nw, np.int64)
    rel = np.zeros((k, k), np.int64)
    relt = np.zeros((k, k), np.int64)  # rel transposed: its columns as rows
    tst = np.zeros((3, k), np.int64)
    fresh = np.empty(n if release else 0, np.int64)
    mf = 0
    if release:
        for a in range(k):
            for j in range(start[a], start[a] + rlen[a]):
                fresh[mf] = ready[j]
                mf += 1
    need_join = release and w[16] != 0.0
    need_wait = release and w[18] != 0.0
    term = np.zeros((k, FIRST_CONTEXT), np.float64)
    fill = np.zeros(k, np.float64)
    dirty = np.ones(k, np.bool_)
    seen = np.zeros(k, np.int64)
    sumh = np.zeros(k, np.int64)
    cmax = np.full(k, -1, np.int64)
    ctop = np.zeros(k, np.int64)
    join = np.zeros(k, np.int64)  # sum over ready t != a of rel[a, t]
    wait = np.zeros(k, np.int64)  # max over t != a of rel[t, a]
    wdirty = np.ones(k, np.bool_)
    ids = np.empty(k, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)
    nb, done, overrides, decisions, last = 0, 0, 0, 0, np.int64(-1)
    while True:
        # ---- the fresh ready nodes' users gain a ready operand (_mark_ready's result; a
        # fresh node was pending, so no user of it held a credit before)
        for i in range(mf):
            v = fresh[i]
            b = op[v]
            wb, bb = b >> 6, np.int64(1) << (b & 63)
            for e in range(uptr[v], uptr[v + 1]):
                u = uids[e]
                r = rdy[u] + 1
                rdy[u] = r
                q = u * nw + wb
                m = mask[q]
                if not m & bb:  # u's first ready operand of type b
                    m |= bb
                    mask[q] = m
                    tst[0, b] += 1
                    dirty[b] = True
                if r == pending[u] and m & (m - 1) == 0:  # one type (b) if no other word
                    one = True
                    for q2 in range(u * nw, u * nw + nw):
                        if q2 != q and mask[q2] != 0:
                            one = False
                    if one:  # u's credit in
                        t = op[u]
                        tst[1, b] += 1
                        dirty[b] = True
                        if batchable[t]:
                            tst[2, b] += 1
                            rx = rel[b, t] + 1
                            rel[b, t] = relt[t, b] = rx
                            if b != t and rx > wait[t]:  # (exact unless wdirty[t])
                                wait[t] = rx
                            if need_join and rlen[t] > 0 and b != t:
                                join[b] += 1
        mf = 0
        lo = done
        if nf > 0:  # a forced node, the most recently released first
            nf -= 1
            v = forced[nf]
            b = op[v]
            nodes[done] = v
            batch_op[nb], batch_forced[nb] = b, True
            nb, done = nb + 1, done + 1
            batch_ptr[nb] = done
            rem[b] -= 1
            remd[b] -= depth[v]
            was_ready = False
        else:
            if done == n:
                break
            # ---- the ready types, critical path's choice, the dirty types' own terms
            top, n_ready, r = -1, 0, 0
            cp, cp_top, cp_fill = -1, -1, -1.0
            for a in range(k):
                if rlen[a] and batchable[a]:
                    ids[r] = a
                    r += 1
                    n_ready += rlen[a]
                    if dirty[a]:
                        for j in range(start[a] + seen[a], start[a] + rlen[a]):
                            h = height[ready[j]]
                            sumh[a] += h
                            if h > cmax[a]:
                                cmax[a], ctop[a] = h, 1
                            elif h == cmax[a]:
                                ctop[a] += 1
                        seen[a] = rlen[a]
                        c, t = rlen[a], tw[a]
                        f = c / (t if t > 1 else 1)  # _ratio
                        fill[a] = f
                        term[a, 1] = f * w[1]
                        term[a, 2] = (1.0 if c >= t else 0.0) * w[2]
                        # log1p(i) from logt (-1.0: not yet computed); written out: a
                        # helper taking the array costs an atomic reference count each way
                        i3, i5, i6 = c, t - c if t > c else 0, rem[a] - c
                        x3, x5, x6 = logt[i3], logt[i5], logt[i6]
                        if x3 < 0.0:
                            x3 = logt[i3] = math.log1p(i3)
                        if x5 < 0.0:
                            x5 = logt[i5] = math.log1p(i5)
                        if x6 < 0.0:
                            x6 = logt[i6] = math.log1p(i6)
                        term[a, 3] = (x3 / 4.0) * w[3]
                        term[a, 4] = (c / rem[a]) * w[4]
                        term[a, 5] = (x5 / 4.0) * w[5]
                        term[a, 6] = (x6 / 8.0) * w[6]
                        mg = maxh[a] - sumh[a] / c
                        term[a, 8] = ((mg if mg < 16.0 else 16.0) / 16.0) * w[8]
                        term[a, 9] = (ctop[a] / c) * w[9]
                        term[a, 10] = (maxh[a] / hmax) * w[10]
                        term[a, 13] = (rem[a] / total[a]) * w[13]
                        if release:
                            i15 = tst[2, a]  # (may exceed every type's count)
                            x15 = logt[i15] if i15 <= tmax else -1.0
                            if x15 < 0.0:
                                x15 = math.log1p(i15)
                                if i15 <= tmax:
                                    logt[i15] = x15
                            term[a, 15] = (x15 / 4.0) * w[15]
                            term[a, 17] = (rel[a, a] / c) * w[17]
                            pc = (tst[0, a] - tst[1, a]) / c
                            term[a, 20] = ((pc if pc < 4.0 else 4.0) / 4.0) * w[20]
                        dirty[a] = False
                    h = maxh[a]
                    if h > top:
                        top = h
                    if h > cp_top or (h == cp_top and fill[a] > cp_fill):
                        cp, cp_top, cp_fill = a, h, fill[a]
            a = ids[0]
            if r > 1:
                top2, ntop1 = -1, 0
                if w[21] != 0.0:
                    for i in range(r):
                        h = maxh[ids[i]]
                        if h == top:
                            ntop1 += 1
                        elif h > top2:
                            top2 = h
                best, best_s = 0, -np.inf
                w0, w7, w11, w12, w14 = w[0], w[7], w[11], w[12], w[14]
                w16, w18, w19, w21, w22 = w[16], w[18], w[19], w[21], w[22]
                for i in range(r):
                    x = ids[i]
                    c = rlen[x]
                    gap = maxh[x] - top
                    t16 = t18 = t19 = t21 = t22 = 0.0
                    if need_join:
                        t16 = (join[x] / c) * w16
                    if need_wait:
                        if wdirty[x]:
                            m = 0
                            for jj in range(r):
                                y = ids[jj]
                                q = relt[x, y] if y != x else 0
                                m = q if q > m else m
                            wait[x] = m
                            wdirty[x] = False
                        t18 = (wait[x] / c) * w18
                    if release:
                        t19 = (rel[cp, x] / c if cp != x else 0.0) * w19
                    if w21 != 0.0:
                        other = top2 if (maxh[x] == top and ntop1 == 1) else top
                        ld = maxh[x] - other
                        t21 = ((ld if ld < 16 else 16) / 16.0 if ld > -16 else -1.0) * w21
                    if w22 != 0.0:
                        t22 = (math.log1p(-gap) / 4.0) * w22
                    # every column in order, as the twin sums (a zero weight's term is
                    # +-0.0 and leaves the sum and the argmax as they are)
                    s = 0.0
                    s += gap * w0
                    s += term[x, 1]
                    s += term[x, 2]
                    s += term[x, 3]
                    s += term[x, 4]
                    s += term[x, 5]
                    s += term[x, 6]
                    s += (1.0 if x == last else 0.0) * w7
                    s += term[x, 8]
                    s += term[x, 9]
                    s += term[x, 10]
                    s += (1.0 if gap == -1 else 0.0) * w11
                    s += (1.0 if gap == 0 else 0.0) * w12
                    s += term[x, 13]
                    s += (c / n_ready) * w14
                    s += term[x, 15]
                    s += t16
                    s += term[x, 17]
                    s += t18
                    s += t19
                    s += term[x, 20]
                    s += t21
                    s += t22
                    if s > best_s:
                        best, best_s = i, s
                a = ids[best]
            decisions += 1
            if a != cp:
                overrides += 1
            last = a
            c = rlen[a]
            for j in range(c):  # (index loops, no views: a view costs an atomic
                nodes[done + j] = ready[start[a] + j]  # reference count each way)
            sort_nodes(nodes[done:done + c], mark)
            if need_join:  # a leaves the ready set
                for y in range(k):  # (a contiguous row: no branch, vectorised)
                    join[y] -= relt[a, y]
                join[a] += relt[a, a]
            rlen[a], maxh[a] = 0, -1
            seen[a], sumh[a], cmax[a], ctop[a] = 0, 0, -1, 0
            dirty[a] = True
            batch_op[nb] = a
            nb, done = nb + 1, done + c
            batch_ptr[nb] = done
            if track_tw:  # (_compiled._typewise_freed written out: calling it here measured
                freed = 0  # 1.41x critical path's loop against 1.36x, priority_cost, load 1)
                for jv in range(done - c, done):
                    v = nodes[jv]
                    for i in range(tw_ptr[v], tw_ptr[v + 1]):
                        u = tw_ids[i]
                        tw_pending[u] -= 1
                        if tw_pending[u] == 0:
                            freed += 1
                tw[a] += freed - c
            rem[a] -= c
            for jv in range(done - c, done):
                remd[a] -= depth[nodes[jv]]
            was_ready = True
        # ---- retire nodes[lo:done]: Kahn's step, the release sums kept. A ready batch
        # takes every ready node of its type b, so each user loses all its ready operands of
        # type b at its first edge from the batch: its credit is settled there, from its
        # counts before the batch (all pending operands ready: r == p + 1 then). Credited
        # before (one type, b) it is released by this batch: credit out; with one other
        # type left: credit in. A forced node's users gain the credit when it is their last
        # non-ready operand and their ready ones have one type.
        for jv in range(lo, done):
            v = nodes[jv]
            b = op[v]
            wb, bb = b >> 6, np.int64(1) << (b & 63)
            for e in range(uptr[v], uptr[v + 1]):
                u = uids[e]
                p = pending[u] - 1
                pending[u] = p
                t = op[u]
                if release:
                    r = rdy[u]
                    y = -1  # the type u's credit goes in to
                    if was_ready:
                        rdy[u] = r - 1
                        q = u * nw + wb
                        m = mask[q]
                        if m & bb:  # u's first edge from this batch
                            m ^= bb
                            mask[q] = m
                            tst[0, b] -= 1
                            dirty[b] = True
                            if r == p + 1:
                                nz, qz = 0, -1
                                for q2 in range(u * nw, u * nw + nw):
                                    if mask[q2] != 0:
                                        nz, qz = nz + 1, q2
                                if nz == 0:  # u's credit out (b's nodes were all it waited on)
                                    tst[1, b] -= 1
                                    if batchable[t]:
                                        tst[2, b] -= 1
                                        rx = rel[b, t]
                                        rel[b, t] = relt[t, b] = rx - 1
                                        if b != t and rx == wait[t]:  # max may fall
                                            wdirty[t] = True
                                        if need_join and rlen[t] > 0 and b != t:
                                            join[b] -= 1
                                elif nz == 1 and mask[qz] & (mask[qz] - 1) == 0:
                                    y = (qz - u * nw) * 64 + trailing_zeros(mask[qz])
                    elif p > 0 and r == p:
                        nz, qz = 0, -1
                        for q2 in range(u * nw, u * nw + nw):
                            if mask[q2] != 0:
                                nz, qz = nz + 1, q2
                        if nz == 1 and mask[qz] & (mask[qz] - 1) == 0:
                            y = (qz - u * nw) * 64 + trailing_zeros(mask[qz])
                    if y >= 0:  # u's credit in
                        tst[1, y] += 1
                        dirty[y] = True
                        if batchable[t]:
                            tst[2, y] += 1
                            rx = rel[y, t] + 1
                            rel[y, t] = relt[t, y] = rx
                            if y != t and rx > wait[t]:  # (exact unless wdirty[t])
                                wait[t] = rx
                            if need_join and rlen[t] > 0 and y != t:
                                join[y] += 1
                if p == 0:  # released
                    if batchable[t]:
                        if need_join and rlen[t] == 0:  # t joins the ready set
                            for y in range(k):
                                join[y] += relt[t, y]
                            join[t] -= relt[t, t]
                        ready[start[t] + rlen[t]] = u
                        rlen[t] += 1
                        dirty[t] = True
                        if len(height) and height[u] > maxh[t]:
                            maxh[t] = height[u]
                        if release:
                            fresh[mf] = u
                            mf += 1
                    else:
                        forced[nf] = u
                        nf += 1
    return batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, overrides, decisions
