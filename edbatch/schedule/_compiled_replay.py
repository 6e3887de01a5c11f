"""The ``replay`` decision rule in compiled code: an FSM fallback that follows a whole-graph
heuristic's schedule while scheduling forward (see :mod:`edbatch.schedule.replay`).

``rank[v]`` is the index of the batch that ran node ``v`` in the replayed heuristic's own
schedule of the graph. At a decision the rule takes the ready batchable op type holding the
ready node of smallest rank; ties (two types holding nodes of one rank, impossible when the
ranks come from a schedule, whose batches each hold one op type) go to the smallest op id.
The FSM table, when it knows the state key, answers first, as in
:func:`~edbatch.schedule._compiled._decide`.

:func:`run_replay` is :func:`edbatch.schedule._compiled.run_schedule`'s loop with that rule
(same helpers, same order), and with ``record`` it also returns every decision's state key
and op type, as :func:`edbatch.schedule._compiled_trace.trace_schedule` does for the other
rules (the table search and the guard need them). The Python twin is
:class:`edbatch.schedule.replay.ReplayPolicy`; tests assert identical schedules.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import (
    ENC_NONE,
    _encode,
    _lookup,
    _retire,
    _typewise_freed,
    start_state,
)
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["level_agenda_ranks", "replay_choice", "run_replay"]

_NO_RANK = 1 << 62


@njit(cache=True)
def replay_choice(k, rlen, batchable, ready, start, rank):  # type: ignore[no-untyped-def]
    """The ready batchable type holding the ready node of smallest ``rank`` (ties: the
    smallest op id); ``-1`` when none is ready."""
    best, best_r = -1, _NO_RANK
    for a in range(k):
        if rlen[a] and batchable[a]:
            for i in range(start[a], start[a] + rlen[a]):
                r = rank[ready[i]]
                if r < best_r:
                    best, best_r = a, r
    return best


@njit(cache=True)
def run_replay(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
               rank, enc, table_hash, table_act, record):  # type: ignore[no-untyped-def]
    """Schedule one graph with the FSM table (``enc``; ``ENC_NONE``: none) and the replay
    rule on ``rank`` (``int64[N]``) for the states it lacks. Other arguments as
    :func:`~edbatch.schedule._compiled.run_schedule`.

    Returns:
        ``(batch_op, batch_forced, batch_ptr, nodes, hits, misses, keys, key_len, actions)``:
        the first six as ``run_schedule``'s; with ``record`` (and a key), decision ``i`` met
        the key ``keys[i, :key_len[i]]`` and batched ``actions[i]`` (else empty arrays).
    """
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    width = 4 * k + 8
    rec = record and enc != ENC_NONE
    keys = np.empty((n if rec else 0, width), np.int64)
    key_len = np.empty(n if rec else 0, np.int64)
    actions = np.empty(n if rec else 0, np.int64)
    key = np.empty(width, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)
    nb, nd, done, hits, misses = 0, 0, 0, 0, 0
    while True:
        while nf > 0:  # forced steps: the most recently released unbatchable node first
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
            nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                         height, forced, nf)
        if done == n:
            break
        a = -1
        if enc != ENC_NONE:
            m = _encode(enc, k, rlen, tw, maxh, rem, remd, batchable, key)
            a = _lookup(table_hash, table_act, key, m, k, rlen, batchable)
            if a >= 0:
                hits += 1
            else:
                misses += 1
            if rec:
                keys[nd, :m] = key[:m]
                key_len[nd] = m
        if a < 0:
            a = replay_choice(k, rlen, batchable, ready, start, rank)
        if rec:
            actions[nd] = a
        nd += 1
        c = rlen[a]
        batch = nodes[done:done + c]
        batch[:] = ready[start[a]:start[a] + c]
        sort_nodes(batch, mark)
        rlen[a], maxh[a] = 0, -1
        batch_op[nb] = a
        nb, done = nb + 1, done + c
        batch_ptr[nb] = done
        if track_tw:
            tw[a] += _typewise_freed(batch, tw_ptr, tw_ids, tw_pending) - c
        rem[a] -= c
        for v in batch:
            remd[a] -= depth[v]
        nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                     height, forced, nf)
    nk = nd if rec else 0
    return (batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, hits, misses,
            keys[:nk], key_len[:nk], actions[:nk])


@njit(cache=True)
def _whole_levels(lo, hi, a, ready, depth, pairs, w, cnt):  # type: ignore[no-untyped-def]
    """Whether the ready nodes ``ready[lo:hi]`` of type ``a`` are, per depth, all the
    unexecuted nodes of ``a`` at that depth (``cnt``: zeros, left so)."""
    for i in range(lo, hi):
        cnt[depth[ready[i]]] += 1
    ok = True
    for i in range(lo, hi):
        d = depth[ready[i]]
        if cnt[d] != pairs[a * w + d]:
            ok = False
    for i in range(lo, hi):
        cnt[depth[ready[i]]] = 0
    return ok


@njit(cache=True)
def _level_choice(k, rlen, batchable, ready, start, depth, pairs, w, cnt, qual, mean, cplx):  # type: ignore[no-untyped-def]
    """``CompleteLevelAgendaPolicy.choose``: the qualifying (else any) ready type of lowest
    static mean; on a tie the later type wins unless it is complex."""
    anyq = False
    for a in range(k):
        qual[a] = bool(rlen[a] and batchable[a]) and _whole_levels(
            start[a], start[a] + rlen[a], a, ready, depth, pairs, w, cnt)
        anyq = anyq or qual[a]
    best, best_avg = -1, np.inf
    for a in range(k):
        if rlen[a] and batchable[a] and (qual[a] or not anyq):
            avg = mean[a]
            if avg < best_avg or (avg == best_avg and not cplx[a]):
                best, best_avg = a, avg
    return best


@njit(cache=True)
def level_agenda_ranks(op, depth, arity, uptr, uids, batchable, mean, cplx):  # type: ignore[no-untyped-def]
    """Per node, the index of its batch in DyNet's level agenda's schedule
    (:class:`edbatch.schedule.heuristics.CompleteLevelAgendaPolicy`, line by line: among
    the ready types whose ready nodes make up whole (type, depth) groups of the unexecuted
    nodes, or all ready types if none does, the lowest static ``mean`` depth; on a tie the
    later type wins unless it is complex). The replay's ranks without the Python frontier."""
    n, k = len(op), len(batchable)
    height = np.zeros(0, np.int64)
    st = start_state(op, depth, arity, batchable, height, np.zeros(0, np.int32), height)
    start, ready, rlen, maxh, forced, pending, nf = st[0], st[3], st[4], st[5], st[6], st[7], st[11]
    w = depth.max() + 1 if n else 1
    pairs = np.zeros(k * w, np.int64)  # unexecuted nodes per (type, depth) the policy ran
    for v in range(n):
        pairs[op[v] * w + depth[v]] += 1
    cnt = np.zeros(w, np.int64)
    qual = np.zeros(k, np.bool_)
    rank = np.full(n, -1, np.int64)
    buf = np.empty(n, np.int64)
    nb, done = 0, 0
    while True:
        while nf > 0:
            nf -= 1
            buf[0] = forced[nf]
            rank[buf[0]] = nb
            nb, done = nb + 1, done + 1
            nf = _retire(buf[:1], uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                         height, forced, nf)
        if done == n:
            break
        a = _level_choice(k, rlen, batchable, ready, start, depth, pairs, w, cnt, qual, mean,
                          cplx)
        c = rlen[a]
        batch = buf[:c]
        batch[:] = ready[start[a]:start[a] + c]
        batch.sort()
        rlen[a], maxh[a] = 0, -1
        for v in batch:
            rank[v] = nb
            pairs[a * w + depth[v]] -= 1
        nb, done = nb + 1, done + c
        nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                     height, forced, nf)
    return rank
