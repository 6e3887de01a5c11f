"""The priority policy on the compiled core: a learned linear score per ready op type.

At every decision each ready batchable op type ``a`` gets a feature row ``f_a`` computed
here from the frontier's arrays (:mod:`edbatch.schedule._compiled`'s state: ``rlen``,
``tw``, ``maxh``, ``rem``, the ready lists and the critical-path heights) and the score
``s_a = w . f_a``; the type with the highest score runs (ties: the smallest id, as critical
path breaks them). The same ``w`` scores every type, so the policy does not depend on the
number or the order of op types (no table, no key): it reads what a type looks like now.

Features (:data:`PRIORITY_FEATURES`, ``F`` columns; ``top`` = the highest ready height,
``H`` = the graph's highest height + 1):

====================  ==========================================================
``gap``               ``maxh[a] - top`` (<= 0): critical path's criterion
``fill``              ``|F(a)| / max(T(a), 1)``: critical path's tie-breaker
``complete``          1 if ``|F(a)| >= T(a)``
``log_ready``         ``log1p(|F(a)|) / 4``
``ready_rem``         ``|F(a)| / rem(a)``: share of the type's unexecuted nodes ready now
``log_wait``          ``log1p(max(T(a) - |F(a)|, 0)) / 4``: type-wise free, not yet ready
``log_after``         ``log1p(rem(a) - |F(a)|) / 8``: nodes of the type left afterwards
``last``              1 if ``a`` was the previous decision
``mean_gap``          ``min(maxh[a] - mean ready height, 16) / 16``
``top_share``         share of ``a``'s ready nodes at height ``maxh[a]``
``rel_height``        ``maxh[a] / H``
``gap1``              1 if ``gap == -1``
``gap0``              1 if ``gap == 0``
``rem_share``         ``rem(a) / total(a)``: share of the type still unexecuted
``ready_share``       ``|F(a)|`` / all ready batchable nodes
``rel_log``           ``log1p(R(a))/4``: batchable nodes released if ``a`` runs now
``rel_join``          of those, the ones of another type with ready nodes, per ``|F(a)|``
``rel_self``          released nodes of type ``a`` itself, per ``|F(a)|``
``wait_gain``         most nodes of type ``a`` another ready type releases, per ``|F(a)|``
``cp_feed``           nodes of type ``a`` critical path's choice (if not ``a``) releases,
                      per ``|F(a)|``: the fill ``a`` gains if postponed one step
``partial``           ``min(users of a's ready nodes left waiting / |F(a)|, 4) / 4``
``lead``              ``clip(maxh[a] - highest other ready type's maxh, -16, 16) / 16``
``far``               ``log1p(-gap) / 4``: the gap on a log scale, so that a linear score
                      can charge a type far below the critical one less than ``gap`` does
====================  ==========================================================

Features 23-31 are *context* (:mod:`edbatch.schedule._compiled_priority_ctx`: critical
path's choice, the decision before last, the other ready types' most ``fill``,
``complete``, ``log_ready``, ``rel_join``, ``wait_gain``, ``cp_feed``), computed like the
release features only where the weights give them a say.

``R``, the release matrix ``M[b, t]`` (nodes of type ``t`` whose pending operands are all
ready nodes of type ``b``): what running a type *now* makes ready, no lookahead. Its sums are
kept up to date edge by edge (:mod:`edbatch.schedule._compiled_release`): a decision reads
them in O(ready types^2) instead of rescanning the users of every ready node.

The score is ``w . f`` (linear, :func:`critical_path_weights`) plus, with ``nh > 0`` hidden
units, ``sum_j v_j relu(W_j . f + b_j)`` (a one-hidden-layer MLP): the flat parameter vector
is ``[w (F), W_1 (F), b_1, ..., W_nh (F), b_nh, v (nh)]``
(:func:`num_params`).

With ``w = (1, 1e-3, 0, ...)`` (:func:`critical_path_weights`) the argmax is critical
path's choice exactly (integer gaps dominate, the fill breaks ties, then the smallest id).
The Python twin (``policies.priority.PriorityTwin``, a Policy over
:class:`~edbatch.schedule.FrontierView`) computes the same rows by rescanning; the tests
assert identical rows (:func:`priority_trace`) and schedules.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from edbatch.schedule._compiled import _typewise_freed, start_state
from edbatch.schedule._compiled_keys import _critical, _ratio
from edbatch.schedule._compiled_priority_ctx import CONTEXT_FEATURES, FIRST_CONTEXT, context_rows
from edbatch.schedule._compiled_priority_fused import fused_schedule
from edbatch.schedule._compiled_priority_lean import _join_wait, lean_ok, lean_pick
from edbatch.schedule._compiled_release import release_state, retire_step
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["PRIORITY_FEATURES", "V1_FEATURES", "V2_FEATURES", "V3_FEATURES",
           "critical_path_weights", "num_params", "priority_features", "priority_trace",
           "run_priority", "run_priority_counts"]

PRIORITY_FEATURES = ("gap", "fill", "complete", "log_ready", "ready_rem", "log_wait",
                     "log_after", "last", "mean_gap", "top_share", "rel_height", "gap1",
                     "gap0", "rem_share", "ready_share", "rel_log", "rel_join", "rel_self",
                     "wait_gain", "cp_feed", "partial", "lead", "far", *CONTEXT_FEATURES)
#: The first 15 features: artifact version 1's (its weights are these, the rest 0).
V1_FEATURES = PRIORITY_FEATURES[:15]
#: The first 22: artifact version 2's (15-21 are the release features).
V2_FEATURES = PRIORITY_FEATURES[:22]
#: The first 23: artifact version 3's (no context features).
V3_FEATURES = PRIORITY_FEATURES[:FIRST_CONTEXT]
NUM_PRIORITY_FEATURES = len(PRIORITY_FEATURES)
NUM_V1_FEATURES = len(V1_FEATURES)
NUM_V2_FEATURES = len(V2_FEATURES)


def num_params(nh: int = 0) -> int:
    """Length of the flat parameter vector with ``nh`` hidden units (0: linear)."""
    f = NUM_PRIORITY_FEATURES
    return f + nh * (f + 2)


def critical_path_weights(nh: int = 0) -> np.ndarray:
    """The parameters whose argmax is critical path's choice (``gap`` 1, ``fill`` 1e-3;
    hidden units, if any, with zero output weights)."""
    w = np.zeros(num_params(nh), np.float64)
    w[0], w[1] = 1.0, 1e-3
    return w


@njit(cache=True, inline="always")
def _release_row(a, r, ids, rlen, maxh, rel, tst, cp, row, top1, top2, ntop1):  # type: ignore[no-untyped-def]
    """Features 15-21 of ready type ``a`` (module doc) from the release sums; ``top1``: the
    highest ``maxh`` of the ready types, ``ntop1`` how many have it, ``top2`` the highest
    below it (so the highest other one is read in O(1)). Inlined: a call per row passing
    arrays cost more than its arithmetic."""
    c = rlen[a]
    tot = tst[2, a]
    join, wait = _join_wait(a, r, ids, rel)
    other = top2 if (maxh[a] == top1 and ntop1 == 1) else top1
    row[15] = math.log1p(tot) / 4.0  # tot may exceed every type's count: not logt
    row[16] = join / c
    row[17] = rel[a, a] / c
    row[18] = wait / c
    row[19] = rel[cp, a] / c if cp != a else 0.0
    pc = (tst[0, a] - tst[1, a]) / c
    row[20] = (pc if pc < 4.0 else 4.0) / 4.0
    ld = maxh[a] - other if r > 1 else 16
    row[21] = (ld if ld < 16 else 16) / 16.0 if ld > -16 else -1.0


@njit(cache=True)
def priority_features(k, rlen, tw, maxh, rem, batchable, ready, start, height, total, last,
                      hmax, logt, seen, sumh, cmax, ctop, ids, out, rel, tst,
                      release=True):  # type: ignore[no-untyped-def]
    """Write the feature rows of the ready batchable types (ascending id) into ``out`` and
    their ids into ``ids``; return how many.

    ``logt[i] = log1p(i)``; ``seen``/``sumh``/``cmax``/``ctop``: per type, the ready nodes
    already read, the sum of their heights, the highest and how many sit at it (a ready
    list only grows until its type runs, when the caller resets them): each ready node is
    read once. ``rel`` (``k x k``) and ``tst`` (``3 x k``): the release sums
    (:mod:`~edbatch.schedule._compiled_release`). ``release=False`` skips features 15-21
    (their upkeep is most of the cost), leaving them as they are in ``out``: for weights
    that give them no say.
    """
    top, n_ready, r = -1, 0, 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            ids[r] = a
            r += 1
            n_ready += rlen[a]
            if maxh[a] > top:
                top = maxh[a]
            for j in range(start[a] + seen[a], start[a] + rlen[a]):
                h = height[ready[j]]
                sumh[a] += h
                if h > cmax[a]:
                    cmax[a], ctop[a] = h, 1
                elif h == cmax[a]:
                    ctop[a] += 1
            seen[a] = rlen[a]
    cp = _critical(k, rlen, tw, maxh, batchable)
    top2, ntop1 = -1, 0
    for i in range(r):
        h = maxh[ids[i]]
        if h == top:
            ntop1 += 1
        elif h > top2:
            top2 = h
    for i in range(r):
        a = ids[i]
        c, t = rlen[a], tw[a]
        s, at_top = sumh[a], ctop[a]
        gap = maxh[a] - top
        row = out[i]
        row[0] = gap
        row[1] = _ratio(rlen, tw, a)
        row[2] = 1.0 if c >= t else 0.0
        row[3] = logt[c] / 4.0
        row[4] = c / rem[a]
        row[5] = logt[t - c if t > c else 0] / 4.0
        row[6] = logt[rem[a] - c] / 8.0
        row[7] = 1.0 if a == last else 0.0
        mg = maxh[a] - s / c
        row[8] = (mg if mg < 16.0 else 16.0) / 16.0
        row[9] = at_top / c
        row[10] = maxh[a] / hmax
        row[11] = 1.0 if gap == -1 else 0.0
        row[12] = 1.0 if gap == 0 else 0.0
        row[13] = rem[a] / total[a]
        row[14] = c / n_ready
        row[22] = math.log1p(-gap) / 4.0
        if release:
            _release_row(a, r, ids, rlen, maxh, rel, tst, cp, row, top, top2, ntop1)
    return r


@njit(cache=True)
def _uses_release(w, nh):  # type: ignore[no-untyped-def]
    """Whether features 15-21 can change a choice: hidden units, or a non-zero linear weight
    on one of them or on a context feature (23-, which read them; a linear score ignores a
    feature at weight 0)."""
    if nh > 0:
        return True
    for j in range(NUM_V1_FEATURES, NUM_PRIORITY_FEATURES):
        if w[j] != 0.0 and (j < NUM_V2_FEATURES or j >= FIRST_CONTEXT):
            return True
    return False


@njit(cache=True)
def _uses_context(w, nh):  # type: ignore[no-untyped-def]
    """Whether a context feature (23-) has a non-zero weight, in the linear part or in a
    hidden unit (else its columns are not computed: they stay 0)."""
    f = NUM_PRIORITY_FEATURES
    for u in range(nh + 1):
        o = 0 if u == 0 else f + (u - 1) * (f + 1)
        for j in range(FIRST_CONTEXT, f):
            if w[o + j] != 0.0:
                return True
    return False


@njit(cache=True)
def _best(r, x, w, nh):  # type: ignore[no-untyped-def]
    """Row of the highest score (the first on ties): ``x[i] . w[:F]`` plus the hidden
    units' ``v_j relu(W_j . x[i] + b_j)`` (layout: :func:`num_params`)."""
    f = x.shape[1]
    best, best_s = 0, -np.inf
    for i in range(r):
        s = 0.0
        for m in range(f):
            s += x[i, m] * w[m]
        for j in range(nh):
            o = f + j * (f + 1)
            z = w[o + f]
            for m in range(f):
                z += x[i, m] * w[o + m]
            if z > 0.0:
                s += w[f + nh * (f + 1) + j] * z
        if s > best_s:
            best, best_s = i, s
    return best


@njit(cache=True)
def _scales(height, total):  # type: ignore[no-untyped-def]
    """``(H, logt)``: the highest height + 1 (at least 1) and ``log1p(i)`` for ``i`` up to
    the most nodes of one type."""
    hmax = 1.0
    for v in range(len(height)):
        if height[v] + 1.0 > hmax:
            hmax = height[v] + 1.0
    tmax = 0
    for a in range(len(total)):
        if total[a] > tmax:
            tmax = total[a]
    logt = np.empty(tmax + 1, np.float64)
    for i in range(tmax + 1):
        logt[i] = math.log1p(i)
    return hmax, logt


@njit(cache=True)
def _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
              total, w, nh, trace, trace_ids, trace_dec, prefix, full=False,
              lean=True):  # type: ignore[no-untyped-def]
    """:func:`run_priority`, also writing the feature rows of every decision (and their
    types' ids and the decision's index) into ``trace``/``trace_ids``/``trace_dec`` while
    they have room; returns its result and
    the number of rows traced. The first ``len(prefix)`` decisions take ``prefix``'s op types
    instead of the scores' choice (each must have ready nodes then): a rollout from the
    state those decisions reach. ``full``: compute the release features even where the
    weights give them no say (for a learner that reads the rows). ``lean`` (with nothing
    traced, not ``full``, a :func:`~edbatch.schedule._compiled_priority_lean.lean_ok`
    scorer): pick by :func:`~edbatch.schedule._compiled_priority_lean.lean_pick`, the same
    choices without the rows."""
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    hmax, logt = _scales(height, total)
    seen = np.zeros(k, np.int64)
    sumh = np.zeros(k, np.int64)
    cmax = np.full(k, -1, np.int64)
    ctop = np.zeros(k, np.int64)
    x = np.zeros((k, NUM_PRIORITY_FEATURES), np.float64)  # 15-21, 23- stay 0 unless
    release = full or _uses_release(w, nh)  # the weights give them a say
    context = full or _uses_context(w, nh)
    lean = lean and not full and len(trace) == 0 and lean_ok(w, nh)
    slot, scnt, nst, tst, rel, fresh = release_state(k, op, uptr, uids, ready, start, rlen,
                                                     pending, batchable, release)
    ids = np.empty(k, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)
    nb, done, overrides, decisions, last, nt = 0, 0, 0, 0, np.int64(-1), 0
    last2 = np.int64(-1)
    while True:
        while nf > 0:
            nf -= 1
            v = forced[nf]
            a = op[v]
            nodes[done] = v
            batch = nodes[done:done + 1]
            batch_op[nb], batch_forced[nb] = a, True
            nb, done = nb + 1, done + 1
            batch_ptr[nb] = done
            rem[a] -= 1
            remd[a] -= depth[v]
            nf = retire_step(batch, np.bool_(False), release, uptr, uids, pending, op,
                             batchable, ready, start, rlen, maxh, height, forced, nf, slot,
                             scnt, nst, tst, rel, fresh)
        if done == n:
            break
        cp = _critical(k, rlen, tw, maxh, batchable)
        if lean:
            a = prefix[decisions] if decisions < len(prefix) else lean_pick(
                k, rlen, tw, maxh, rem, batchable, ready, start, height, total, last, hmax,
                logt, seen, sumh, cmax, ctop, ids, rel, tst, w, cp)
        else:
            r = priority_features(k, rlen, tw, maxh, rem, batchable, ready, start, height,
                                  total, last, hmax, logt, seen, sumh, cmax, ctop, ids, x,
                                  rel, tst, release)
            if context:
                context_rows(r, ids, x, cp, last2)
            for i in range(r):
                if nt < len(trace):
                    trace[nt] = x[i]
                    trace_ids[nt] = ids[i]
                    trace_dec[nt] = decisions
                    nt += 1
            if decisions < len(prefix):
                a = prefix[decisions]
            else:
                a = ids[_best(r, x, w, nh)] if r > 1 else ids[0]
        decisions += 1
        if a != cp:
            overrides += 1
        last, last2 = a, last
        c = rlen[a]
        batch = nodes[done:done + c]
        batch[:] = ready[start[a]:start[a] + c]
        sort_nodes(batch, mark)
        rlen[a], maxh[a] = 0, -1
        seen[a], sumh[a], cmax[a], ctop[a] = 0, 0, -1, 0
        batch_op[nb] = a
        nb, done = nb + 1, done + c
        batch_ptr[nb] = done
        if track_tw:
            tw[a] += _typewise_freed(batch, tw_ptr, tw_ids, tw_pending) - c
        rem[a] -= c
        for v in batch:
            remd[a] -= depth[v]
        nf = retire_step(batch, np.bool_(True), release, uptr, uids, pending, op, batchable,
                         ready, start, rlen, maxh, height, forced, nf, slot, scnt, nst, tst,
                         rel, fresh)
    return (batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, overrides,
            decisions, nt)


@njit(cache=True)
def run_priority(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                 total, w, nh, lean=True):  # type: ignore[no-untyped-def]
    """Schedule one graph with the policy ``w`` (``nh`` hidden units; ``total``: nodes per
    type): ``(batch_op, batch_forced, batch_ptr, nodes, overrides, decisions)``, the batches
    as :func:`~edbatch.schedule._compiled.run_schedule` returns them, the decisions where
    the choice differs from critical path's, all decisions. ``lean`` and a :func:`lean_ok`
    scorer: the fused loop (``_compiled_priority_fused``), the same schedule. ``total``
    empty: counted here (``graph.type_counts`` of a fresh graph cost ~7.5 us, this ~1)."""
    if len(total) == 0:
        total = np.zeros(len(batchable), np.int64)
        for v in range(len(op)):
            total[op[v]] += 1
    if lean and lean_ok(w, nh):
        return fused_schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                              tw_ids, total, w, _uses_release(w, nh))
    res = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                    total, w, nh, np.empty((0, NUM_PRIORITY_FEATURES), np.float64),
                    np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
                    np.bool_(False), lean)
    return res[0], res[1], res[2], res[3], res[4], res[5]


@njit(cache=True)
def priority_trace(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                   total, w, nh, cap):  # type: ignore[no-untyped-def]
    """The feature rows the policy ``w`` scored, decision after decision (at most ``cap``
    rows): ``(rows, op ids)``, the oracle tests' view of the compiled features."""
    trace = np.zeros((cap, NUM_PRIORITY_FEATURES), np.float64)
    trace_ids = np.empty(cap, np.int64)
    nt = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                   total, w, nh, trace, trace_ids, np.empty(cap, np.int64),
                   np.empty(0, np.int64), np.bool_(False))[6]
    return trace[:nt], trace_ids[:nt]


@njit(cache=True)
def run_priority_counts(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                        tw_ids, total, ws, nh):  # type: ignore[no-untyped-def]
    """Batch counts of one graph under each weight vector (rows of ``ws``): the trainer's
    inner loop, one call per graph for a whole population."""
    out = np.empty(len(ws), np.int64)
    for i in range(len(ws)):
        out[i] = len(run_priority(op, depth, arity, uptr, uids, batchable, height, tw_pred,
                                  tw_ptr, tw_ids, total, ws[i], nh)[0])
    return out
