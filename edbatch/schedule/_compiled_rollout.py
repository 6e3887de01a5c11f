"""The compiled fortified rollout: :func:`edbatch.schedule.rollout.rollout_schedule` (batch
count objective) in one numba call, on the state arrays of :mod:`edbatch.schedule._compiled`.

The Python search stays the oracle: the tests assert the same batches (op, node set, order,
forced flags), so every step below follows :class:`edbatch.schedule.rollout._Search` line by
line: a complete rollout from the start before the first forced step, then at each decision
with more than one ready type (budget and lower bound permitting) every ready type other
than the planned one is popped on a copy and completed by every base in turn; a strictly
shorter completion replaces the kept plan; the plan's next decision is taken.

A frontier state is the tuple ``(ready, rlen, maxh, forced, pending, tw, tw_pending, rem,
remd, sc)`` with ``sc = [forced stack length, executed nodes]``; the graph's static arrays
travel as ``g = (op, depth, uptr, uids, batchable, height, tw_ptr, tw_ids, start, mean,
cplx, ranks)``. Base policies are rows ``(rule, encoding)`` with their FSM tables concatenated
(``tab_ptr`` delimits each base's slice of ``tab_hash`` / ``tab_act``). A rule
``REPLAY_RULE + r`` is the replay rule (:mod:`edbatch.schedule._compiled_replay`) on the
node ranks ``ranks[r]`` (one row per replayed heuristic; ``(0, N)`` when none).

``level=2`` nests the search (Bertsekas' rollout of a rollout): each candidate is completed
by a level-1 rollout over the bases (itself fortified, with ``inner_budget`` batches of
search per completion) instead of by the bases alone, and the first plan is a level-1
rollout with ``plan_budget`` (so the result needs no more batches than that rollout); the
outer ``budget`` counts every batch popped inside, so a graph always gets the same schedule.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import (
    ENC_NONE,
    _decide,
    _encode,
    _lookup,
    _retire,
    _typewise_freed,
    _typewise_start,
)
from edbatch.schedule._compiled import _release as _release_node
from edbatch.schedule._compiled_replay import replay_choice

__all__ = ["REPLAY_RULE", "run_rollout"]

#: Rule ids from here on are the replay rule on row ``rule - REPLAY_RULE`` of ``ranks``.
REPLAY_RULE = 1000

_INF = 1 << 62
# Constant int arguments of jitted callees are written np.int64(...): a bare 0 or -1 is typed
# Literal[int] and compiles the whole callee tree a second time (cold start, tests).


@njit(cache=True)
def _new_state(op, arity, batchable, k, tw_pred, track_tw):  # type: ignore[no-untyped-def]
    n = len(op)
    rem = np.zeros(k, np.int64)
    remd = np.zeros(k, np.float64)
    tw = _typewise_start(op, tw_pred, batchable, k, track_tw)
    return (np.empty(n, np.int64), np.zeros(k, np.int64), np.full(k, -1, np.int64),
            np.empty(n, np.int64), arity.copy(), tw, tw_pred.astype(np.int64), rem, remd,
            np.zeros(2, np.int64))


@njit(cache=True)
def _copy(s, d):  # type: ignore[no-untyped-def]
    """``d[:] = s`` for every array of a state (forced stack: its live part only)."""
    d[0][:] = s[0]
    d[1][:] = s[1]
    d[2][:] = s[2]
    d[3][:s[9][0]] = s[3][:s[9][0]]
    d[4][:] = s[4]
    d[5][:] = s[5]
    d[6][:] = s[6]
    d[7][:] = s[7]
    d[8][:] = s[8]
    d[9][:] = s[9]


@njit(cache=True)
def _release(v, g, st):  # type: ignore[no-untyped-def]
    """The scheduler's release of node ``v`` on the state arrays ``st``."""
    st[9][0] = _release_node(v, g[0], g[4], st[0], g[8], st[1], st[2], g[5], st[3], st[9][0])


@njit(cache=True)
def _pop(st, a, out, g):  # type: ignore[no-untyped-def]
    """Pop every ready node of ``a`` into ``out[:c]`` (ascending) and retire them; ``c``."""
    ready, rlen, maxh, sc = st[0], st[1], st[2], st[9]
    start = g[8]
    c = rlen[a]
    batch = out[:c]
    batch[:] = ready[start[a]:start[a] + c]
    batch.sort()
    rlen[a], maxh[a] = 0, -1
    if len(g[6]):
        st[5][a] += _typewise_freed(batch, g[6], g[7], st[6]) - c
    st[7][a] -= c
    for v in batch:
        st[8][a] -= g[1][v]
    sc[0] = _retire(batch, g[2], g[3], st[4], g[0], g[4], ready, start, rlen, maxh, g[5],
                    st[3], sc[0])
    sc[1] += c
    return c


@njit(cache=True)
def _pop_forced(st, out, g):  # type: ignore[no-untyped-def]
    """Run the most recently released unbatchable node alone (into ``out[0]``); its op."""
    sc = st[9]
    sc[0] -= 1
    v = st[3][sc[0]]
    a = g[0][v]
    out[0] = v
    st[7][a] -= 1
    st[8][a] -= g[1][v]
    sc[0] = _retire(out[:1], g[2], g[3], st[4], g[0], g[4], st[0], g[8], st[1], st[2], g[5],
                    st[3], sc[0])
    sc[1] += 1
    return a


@njit(cache=True)
def _base_decide(st, g, rule, enc, th, ta, key):  # type: ignore[no-untyped-def]
    k = len(g[4])
    if rule >= REPLAY_RULE:  # the FSM table first (as _decide), then the replay rule
        if enc != ENC_NONE:
            m = _encode(enc, k, st[1], st[5], st[2], st[7], st[8], g[4], key)
            a = _lookup(th, ta, key, m, k, st[1], g[4])
            if a >= 0:
                return a
        return replay_choice(k, st[1], g[4], st[0], g[8], g[11][rule - REPLAY_RULE])
    a, _ = _decide(rule, enc, th, ta, key, k, st[1], st[5], st[2], st[7], st[8], g[4], g[9],
                   g[10])
    return a


@njit(cache=True)
def _drive(st, g, rule, enc, th, ta, key, buf, dec):  # type: ignore[no-untyped-def]
    """Complete ``st`` with one base; ``(batches, decisions)``, decisions into ``dec``."""
    n = len(g[0])
    nb, nd = 0, 0
    while True:
        while st[9][0] > 0:
            _pop_forced(st, buf, g)
            nb += 1
        if st[9][1] == n:
            return nb, nd
        a = _base_decide(st, g, rule, enc, th, ta, key)
        dec[nd] = a
        nd += 1
        _pop(st, a, buf, g)
        nb += 1


@njit(cache=True)
def _keep(ss, best, total, first, dec, nd):  # type: ignore[no-untyped-def]
    """Keep ``[first,] dec[:nd]`` as the plan if ``total`` beats it (``ss``: spent, cost,
    plan head, plan length)."""
    if total < ss[1]:
        ss[1] = total
        off = 0
        if first >= 0:
            best[0] = first
            off = 1
        best[off:off + nd] = dec[:nd]
        ss[2], ss[3] = 0, off + nd


@njit(cache=True)
def _complete(start, prefix, first, g, bases, tabs, ws, ss, best):  # type: ignore[no-untyped-def]
    """Level 1: complete ``start`` with every base; keep the best complete schedule."""
    rules, encs = bases
    tab_ptr, tab_hash, tab_act = tabs
    work, key, buf, dec = ws
    for i in range(len(rules)):
        _copy(start, work)
        th = tab_hash[tab_ptr[i]:tab_ptr[i + 1]]
        ta = tab_act[tab_ptr[i]:tab_ptr[i + 1]]
        nb, nd = _drive(work, g, rules[i], encs[i], th, ta, key, buf, dec)
        ss[0] += nb
        _keep(ss, best, prefix + nb, first, dec, nd)


@njit(cache=True)
def _candidates(st, g, ss, budget, floor):  # type: ignore[no-untyped-def]
    """The ready types to try at this decision (empty when the search is over)."""
    k = len(g[4])
    ready = np.empty(k, np.int64)
    m = 0
    for a in range(k):
        if st[1][a] and g[4][a]:
            ready[m] = a
            m += 1
    if m <= 1 or ss[0] >= budget or not ss[1] > floor:
        return ready[:0]
    return ready[:m]


@njit(cache=True)
def _level1(start, prefix, first, g, bases, tabs, ws, trial, inner_budget, floor, retry,
            out):  # type: ignore[no-untyped-def]
    """A level-1 fortified rollout from ``start`` (consumed); its batch count, and its
    decisions in ``out`` (``out[0] = first`` when ``first >= 0``). Returns
    ``(batches after start, decisions, batches popped in its search)``."""
    n = len(g[0])
    best = np.empty(n + 1, np.int64)
    ss = np.array([0, _INF, 0, 0], np.int64)
    _complete(start, np.int64(0), np.int64(-1), g, bases, tabs, ws, ss, best)
    buf = ws[2]
    nb, nd = 0, 0
    if first >= 0:
        out[0] = first
        nd = 1
    while True:
        while start[9][0] > 0:
            _pop_forced(start, buf, g)
            nb += 1
        if start[9][1] == n:
            return nb, nd, ss[0]
        planned = best[ss[2]]
        for a in _candidates(start, g, ss, inner_budget, floor - prefix):
            if a != planned:
                _copy(start, trial)
                _pop(trial, a, buf, g)
                _complete(trial, nb + 1, a, g, bases, tabs, ws, ss, best)
        a = best[ss[2]]
        ss[2] += 1
        out[nd] = a
        nd += 1
        _pop(start, a, buf, g)
        nb += 1


@njit(cache=True)
def _complete2(start, prefix, first, g, bases, tabs, ws, ws2, ss, best, inner_budget, floor,
               retry):  # type: ignore[no-untyped-def]
    """Level 2: complete ``start`` by a level-1 rollout; keep it if it beats the plan."""
    work, trial, dec = ws2
    _copy(start, work)
    nb, nd, spent = _level1(work, prefix, np.int64(-1), g, bases, tabs, ws, trial,
                            inner_budget, floor, retry, dec)
    ss[0] += spent + nb
    _keep(ss, best, prefix + nb, first, dec, nd)


@njit(cache=True)
def _start(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids, mean,
           cplx, ranks):  # type: ignore[no-untyped-def]
    """A rollout's start: the graph tuple ``g`` (with the per-type node offsets), the real
    state with every operand-free node released, and whether type-wise counts are tracked."""
    n, k = len(op), len(batchable)
    start = np.zeros(k + 1, np.int64)
    for v in range(n):
        start[op[v] + 1] += 1
    for a in range(k):
        start[a + 1] += start[a]
    g = (op, depth, uptr, uids, batchable, height, tw_ptr, tw_ids, start, mean, cplx, ranks)
    track = len(tw_ptr) > 0
    real = _new_state(op, arity, batchable, k, tw_pred, track)
    for v in range(n):
        real[7][op[v]] += 1
        real[8][op[v]] += depth[v]
        if arity[v] == 0:
            _release(v, g, real)
    return g, real, track


@njit(cache=True)
def run_rollout(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                mean, cplx, rules, encs, tab_ptr, tab_hash, tab_act, budget, floor, retry,
                level, inner_budget, plan_budget, ranks):  # type: ignore[no-untyped-def]
    """Fortified rollout over the bases ``(rules[i], encs[i], table slice i)``.

    Args: the graph arrays as :func:`~edbatch.schedule._compiled.run_schedule`; ``budget``:
    most batches popped inside rollouts; ``floor``: the lower bound (the search stops once
    the plan meets it); ``retry``: ``retry_planned``; ``level``: 1 (Bertsekas' rollout) or 2
    (each candidate completed by a level-1 rollout with ``inner_budget``; the first plan
    by one with ``plan_budget``, so level 2 is never worse than that level-1 rollout);
    ``ranks``: ``int64[R, N]``, the node ranks of the replay rules ``REPLAY_RULE + r``.

    Returns:
        ``(batch_op, batch_forced, batch_ptr, nodes, spent)`` (``spent``: batches popped
        inside rollouts).
    """
    n, k = len(op), len(batchable)
    g, real, track = _start(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                            tw_ids, mean, cplx, ranks)
    ws = (_new_state(op, arity, batchable, k, tw_pred, track), np.empty(4 * k + 8, np.int64),
          np.empty(n, np.int64), np.empty(n + 1, np.int64))
    ws2 = (_new_state(op, arity, batchable, k, tw_pred, track),
           _new_state(op, arity, batchable, k, tw_pred, track), np.empty(n + 1, np.int64))
    bases, tabs = (rules, encs), (tab_ptr, tab_hash, tab_act)
    best = np.empty(n + 1, np.int64)
    ss = np.array([0, _INF, 0, 0], np.int64)  # spent, best cost, plan head, plan length
    cand = _new_state(op, arity, batchable, k, tw_pred, track)
    if level == 2:  # the first plan: a level-1 rollout searching plan_budget batches
        _complete2(real, np.int64(0), np.int64(-1), g, bases, tabs, ws, ws2, ss, best,
                   plan_budget, floor, retry)
    else:
        _complete(real, np.int64(0), np.int64(-1), g, bases, tabs, ws, ss, best)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    nb, prefix = 0, 0
    while True:
        while real[9][0] > 0:
            done = real[9][1]
            batch_op[nb] = _pop_forced(real, nodes[done:], g)
            batch_forced[nb] = True
            nb += 1
            batch_ptr[nb] = real[9][1]
            prefix += 1
        if real[9][1] == n:
            break
        planned = best[ss[2]]
        for a in _candidates(real, g, ss, budget, floor):
            if a != (best[ss[2]] if retry else planned):
                _copy(real, cand)
                _pop(cand, a, ws[2], g)
                if level == 2:
                    _complete2(cand, prefix + 1, a, g, bases, tabs, ws, ws2, ss, best,
                               inner_budget, floor, retry)
                else:
                    _complete(cand, prefix + 1, a, g, bases, tabs, ws, ss, best)
        a = best[ss[2]]
        ss[2] += 1
        done = real[9][1]
        _pop(real, a, nodes[done:], g)
        batch_op[nb] = a
        nb += 1
        batch_ptr[nb] = real[9][1]
        prefix += 1
    return batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, ss[0]
