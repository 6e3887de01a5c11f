"""The distilled priority FSM on the compiled core: a table over a ranked-candidate key.

The key of a decision is computed from the priority policy's feature rows
(:func:`~edbatch.schedule._compiled_priority.priority_features`), never from its weights:

1. the ready batchable types are ranked in critical path's order (highest ready height,
   then the fullest batch ``|F|/T``, then the smallest id), the first ``K`` are the
   *candidates* (slot 0 is critical path's own choice);
2. each candidate gets a small integer *code*: each feature ``qf[q]`` of its row is cut by
   the thresholds ``edges[q, :ne[q]]`` (the code digit is how many thresholds it reaches),
   the digits are read in mixed radix; with ``use_type`` the op id is a last digit;
3. the key is ``m`` (the number of ready types, capped at ``K + 1``) followed by the
   candidates' codes, packed into one int64 (:func:`pack_radix` says the radix).

The table maps a key to a *slot* (which candidate to run); a key the table does not know
runs slot 0, critical path. So the FSM never names an op type: the same table reads any
vocabulary, and keys recur across graphs whose ready types differ.

``_run`` is the one loop (the core's, as in :mod:`edbatch.schedule._compiled_priority`):
``mode`` 0 follows the teacher (the priority policy ``w``), 1 the table; either way every
decision with at least two ready types can be recorded as ``(key, teacher slot)`` (the slot
of the teacher's choice, ``K`` if it is not a candidate): the DAgger data set.
The Python twin of the key is :func:`policies.priority_fsm.rank_key` (tested equal).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import _typewise_freed, start_state
from edbatch.schedule._compiled_keys import _critical, _ratio
from edbatch.schedule._compiled_priority import (
    NUM_PRIORITY_FEATURES,
    _best,
    _join_wait,
    _scales,
    priority_features,
)
from edbatch.schedule._compiled_release import release_state, retire_step
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["LEAN_FEATURES", "LEAN_RELEASE", "act_index", "candidate_order", "decision_key",
           "lean_features", "run_rank_fsm", "teacher_label"]

#: Columns of :data:`~edbatch.schedule._compiled_priority.PRIORITY_FEATURES` that
#: :func:`lean_features` computes (``gap``, ``fill``, ``complete``, ``rel_height``,
#: ``gap1``, ``gap0``, ``rel_join``, ``rel_self``, ``wait_gain``, ``cp_feed``): a table
#: whose key reads only these runs without the other features' upkeep.
LEAN_FEATURES = (0, 1, 2, 10, 11, 12, 16, 17, 18, 19)
#: Of those, the ones read from the release sums (kept only when the key reads one).
LEAN_RELEASE = (16, 17, 18, 19)


@njit(cache=True)
def candidate_order(r, x, order):  # type: ignore[no-untyped-def]
    """Write ``0..r-1`` into ``order`` sorted by critical path's preference over the rows
    ``x`` (gap descending, fill descending; rows are in ascending op id, kept on ties)."""
    for i in range(r):
        j = i
        while j > 0:
            p = order[j - 1]
            if x[p, 0] > x[i, 0] or (x[p, 0] == x[i, 0] and x[p, 1] >= x[i, 1]):
                break
            order[j] = p
            j -= 1
        order[j] = i


@njit(cache=True)
def _code(x, i, a, qf, edges, ne, use_type, k):  # type: ignore[no-untyped-def]
    code = 0
    for q in range(len(qf)):
        v = x[i, qf[q]]
        c = 0
        for e in range(ne[q]):
            if v >= edges[q, e]:
                c += 1
        code = code * (ne[q] + 1) + c
    if use_type:
        code = code * k + a
    return code


@njit(cache=True)
def decision_key(r, x, ids, order, codes, kind, kk, qf, edges, ne, use_type, k,
                 radix):  # type: ignore[no-untyped-def]
    """The packed key of one decision (``r`` ready types, their rows ``x`` and ids); fills
    ``order`` (critical path's ranking) and ``codes`` (each ready row's code).

    ``kind`` 0 (*rank*): ``min(r, kk + 1)`` then the codes of the first ``kk`` in
    ``order``, in radix ``radix``. ``kind`` 1 (*bucket*): the set of codes present, as a
    bit mask (``radix`` <= 62).
    """
    candidate_order(r, x, order)
    for i in range(r):
        codes[i] = _code(x, i, ids[i], qf, edges, ne, use_type, k)
    if kind == 1:
        key = 0
        for i in range(r):
            key |= 1 << codes[i]
        return key
    key = r if r <= kk else kk + 1
    for s in range(min(r, kk)):
        key = key * radix + codes[order[s]]
    return key


@njit(cache=True)
def act_index(r, order, codes, kind, kk, s):  # type: ignore[no-untyped-def]
    """The row a table action ``s`` names (``-1``: none): *rank* the ``s``-th candidate,
    *bucket* the first row in critical path's order whose code is ``s``."""
    if kind == 1:
        for j in range(r):
            if codes[order[j]] == s:
                return order[j]
        return -1
    if 0 <= s < min(r, kk):
        return order[s]
    return -1


@njit(cache=True)
def teacher_label(r, order, codes, kind, kk, t):  # type: ignore[no-untyped-def]
    """The action naming row ``t`` (the teacher's choice): its slot (``kk`` if it is not
    a candidate) or its code."""
    if kind == 1:
        return codes[t]
    for s in range(min(r, kk)):
        if order[s] == t:
            return s
    return kk


@njit(cache=True)
def lean_features(k, rlen, tw, maxh, batchable, hmax, ids, out, rel,
                  release):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.schedule._compiled_priority.priority_features` restricted to the
    columns :data:`LEAN_FEATURES` (the others are left as they are in ``out``; ``release``
    false: :data:`LEAN_RELEASE` too), the same values: the rows a table reads when its key
    needs no other feature, without the per-node height sums the rest keep up. Returns the
    number of ready batchable types (ids ascending in ``ids``)."""
    top, r = -1, 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            ids[r] = a
            r += 1
            if maxh[a] > top:
                top = maxh[a]
    cp = _critical(k, rlen, tw, maxh, batchable) if release else -1
    for i in range(r):
        a = ids[i]
        c = rlen[a]
        gap = maxh[a] - top
        out[i, 0] = gap
        out[i, 1] = _ratio(rlen, tw, a)
        out[i, 2] = 1.0 if c >= tw[a] else 0.0
        out[i, 10] = maxh[a] / hmax
        out[i, 11] = 1.0 if gap == -1 else 0.0
        out[i, 12] = 1.0 if gap == 0 else 0.0
        if release:
            join, wait = _join_wait(a, r, ids, rel)
            out[i, 16] = join / c
            out[i, 17] = rel[a, a] / c
            out[i, 18] = wait / c
            out[i, 19] = rel[cp, a] / c if cp != a else 0.0
    return r


@njit(cache=True)
def _lookup(keys, acts, key):  # type: ignore[no-untyped-def]
    j = np.searchsorted(keys, key)
    if j < len(keys) and keys[j] == key:
        return acts[j]
    return -1


@njit(cache=True)
def _rows(lean, release, k, rlen, tw, maxh, rem, batchable, ready, start, height, total, last,
          hmax, logt, seen, sumh, cmax, ctop, ids, x, rel, tst):  # type: ignore[no-untyped-def]
    """The decision's feature rows: :func:`lean_features` or all of them."""
    if lean:
        return lean_features(k, rlen, tw, maxh, batchable, hmax, ids, x, rel, release)
    return priority_features(k, rlen, tw, maxh, rem, batchable, ready, start, height, total,
                             last, hmax, logt, seen, sumh, cmax, ctop, ids, x, rel, tst,
                             np.bool_(True))


@njit(cache=True)
def _bucket_pick(r, x, ids, codes, qf, edges, ne, use_type, k, tab_keys,
                 tab_acts):  # type: ignore[no-untyped-def]
    """A *bucket* table's row for one decision without sorting the candidates: the key
    (the set of codes present), then the first row in critical path's order whose code is
    the table's action (critical path's own row when the key is unknown or no row has that
    code); the same row as :func:`decision_key` + :func:`act_index`. Returns
    ``(row, hit)``."""
    key = 0
    for i in range(r):
        codes[i] = _code(x, i, ids[i], qf, edges, ne, use_type, k)
        key |= 1 << codes[i]
    s = _lookup(tab_keys, tab_acts, key)
    best, cp = -1, 0
    for i in range(r):  # the first maximum of (gap, fill): candidate_order's first
        if x[i, 0] > x[cp, 0] or (x[i, 0] == x[cp, 0] and x[i, 1] > x[cp, 1]):
            cp = i
        if codes[i] == s and (best < 0 or x[i, 0] > x[best, 0] or (
                x[i, 0] == x[best, 0] and x[i, 1] > x[best, 1])):
            best = i
    return (best, 1) if best >= 0 else (cp, 0)


@njit(cache=True)
def run_rank_fsm(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                 total, w, nh, mode, kind, kk, qf, edges, ne, use_type, radix, tab_keys, tab_acts,
                 rec_keys, rec_labels, lean=0, release=True):  # type: ignore[no-untyped-def]
    """Schedule one graph with the table (``mode`` 1) or the teacher ``w`` (``mode`` 0).

    ``tab_keys`` (sorted) and ``tab_acts``: the table, key -> slot. ``rec_keys`` /
    ``rec_labels``: filled with ``(key, teacher slot)`` for every decision with at least two
    ready types while they have room (pass empty arrays to record nothing; ``w`` is then
    only read in ``mode`` 0). ``lean`` 1 (only in ``mode`` 1 with nothing recorded and
    ``qf`` within :data:`LEAN_FEATURES`; the caller checks): the rows by
    :func:`lean_features`, the release sums kept only with ``release`` (which must be true
    unless ``lean``); 2: also, for a *bucket* key, :func:`_bucket_pick`; the same choices,
    less work per decision.

    Returns:
        ``(batch_op, batch_forced, batch_ptr, nodes, hits, choices, agree, nrec)``: the
        batches as the core returns them; the decisions with two or more ready types
        (``choices``), those the table answered (``hits``), those where the action equals
        the teacher's (``agree``, counted only while recording or in ``mode`` 0), and the
        number of records written.
    """
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    hmax, logt = _scales(height, total)
    seen = np.zeros(k, np.int64)
    sumh = np.zeros(k, np.int64)
    cmax = np.full(k, -1, np.int64)
    ctop = np.zeros(k, np.int64)
    x = np.zeros((k, NUM_PRIORITY_FEATURES), np.float64)
    slot, scnt, nst, tst, rel, fresh = release_state(k, op, uptr, uids, ready, start, rlen,
                                                     pending, batchable, release)
    ids = np.empty(k, np.int64)
    order = np.empty(k, np.int64)
    codes = np.empty(k, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)
    record = len(rec_keys) > 0
    nb, done, last, hits, choices, agree, nrec = 0, 0, np.int64(-1), 0, 0, 0, 0
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
        r = _rows(lean > 0, release, k, rlen, tw, maxh, rem, batchable, ready, start, height,
                  total, last, hmax, logt, seen, sumh, cmax, ctop, ids, x, rel, tst)
        if r == 1:
            a = ids[0]
        elif lean == 2:
            choices += 1
            i, hit = _bucket_pick(r, x, ids, codes, qf, edges, ne, use_type, k, tab_keys,
                                  tab_acts)
            hits += hit
            a = ids[i]
        else:
            choices += 1
            key = decision_key(r, x, ids, order, codes, kind, kk, qf, edges, ne, use_type, k,
                               radix)
            teach, t = -1, -1
            if mode == 0 or record:
                t = _best(r, x, w, nh)
                teach = teacher_label(r, order, codes, kind, kk, t)
                if record and nrec < len(rec_keys):
                    rec_keys[nrec], rec_labels[nrec] = key, teach
                    nrec += 1
            if mode == 0:
                a = ids[t]
                agree += 1
            else:
                i = act_index(r, order, codes, kind, kk, _lookup(tab_keys, tab_acts, key))
                hits += i >= 0
                i = i if i >= 0 else order[0]
                if i == t:
                    agree += 1
                a = ids[i]
        last = a
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
        nf = retire_step(batch, np.bool_(True), release, uptr, uids, pending, op,
                         batchable, ready, start, rlen, maxh, height, forced, nf, slot, scnt,
                         nst, tst, rel, fresh)
    return (batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, hits, choices, agree,
            nrec)
