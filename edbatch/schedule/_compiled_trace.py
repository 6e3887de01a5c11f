"""The FSM's own decisions on a graph, in compiled code: every state key it met and its action.

:func:`trace_schedule` runs the loop of :func:`edbatch.schedule._compiled.run_schedule` (same
helpers, same order, so the same schedule) and records, per decision, the encoded state key
and the op type taken. The table search of ``policies.table_search`` needs exactly that (which
states a table visits on a graph, how often, with which action) for every candidate table; the
Python replay through a :class:`~edbatch.schedule.frontier.Frontier` costs about 0.5 s per
lattice graph, this about 10 ms. Tests assert equal keys, actions and batch counts.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import (
    RULE_KEY_LAST,
    _encode,
    _key_last,
    _lookup,
    _retire,
    _rule,
    _typewise_freed,
    start_state,
)

__all__ = ["trace_schedule"]


@njit(cache=True)
def trace_schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                   mean, cplx, rule, enc, table_hash, table_act):  # type: ignore[no-untyped-def]
    """Schedule one graph as ``run_schedule`` does (arguments alike; ``enc`` must name a
    key) and return ``(keys, key_len, actions, num_batches)``: decision ``i`` met the key
    ``keys[i, :key_len[i]]`` and batched op type ``actions[i]``."""
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    width = 4 * k + 8
    keys = np.empty((n, width), np.int64)
    key_len = np.empty(n, np.int64)
    actions = np.empty(n, np.int64)
    nb, nd, done = 0, 0, 0
    while True:
        while nf > 0:
            nf -= 1
            batch = forced[nf:nf + 1].copy()
            a = op[batch[0]]
            nb, done = nb + 1, done + 1
            rem[a] -= 1
            remd[a] -= depth[batch[0]]
            nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                         height, forced, nf)
        if done == n:
            break
        key = keys[nd]
        m = _encode(enc, k, rlen, tw, maxh, rem, remd, batchable, key)
        a = _lookup(table_hash, table_act, key, m, k, rlen, batchable)
        if a < 0:
            if rule == RULE_KEY_LAST:
                a = _key_last(enc, key, m)
            else:
                a = _rule(rule, k, rlen, tw, maxh, rem, remd, batchable, mean, cplx)
        key_len[nd], actions[nd] = m, a
        nd += 1
        c = rlen[a]
        batch = np.sort(ready[start[a]:start[a] + c])
        rlen[a], maxh[a] = 0, -1
        nb, done = nb + 1, done + c
        if track_tw:
            tw[a] += _typewise_freed(batch, tw_ptr, tw_ids, tw_pending) - c
        rem[a] -= c
        remd[a] -= depth[batch].sum()
        nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                     height, forced, nf)
    return keys[:nd], key_len[:nd], actions[:nd], nb
