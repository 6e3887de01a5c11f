"""Rollout values of the afterstate policy's decisions, on its compiled loop.

For every decision of the afterstate policy ``w`` (:mod:`edbatch.schedule._compiled_afterstate`)
on a graph with two or more ready types, and every ready type ``b`` there: the batches of
the whole schedule when that decision takes ``b`` and the *base* policy ``wb`` (afterstate
weights too) makes every later one, the state being the one ``w``'s own first decisions
reach. With ``wb = w`` this is ``Q^w(s_t, b)``: the teacher of approximate policy iteration
(:mod:`policies.afterstate_imitate`, a rollout over the student itself), the afterstate twin
of :func:`~edbatch.schedule._compiled_priority_q.priority_q_base`. Each value replays the
schedule from the start (the upkeep is incremental, so a state cannot be resumed cheaply);
past :data:`~edbatch.schedule._compiled_priority_q.LABEL_BUDGET` of that work only every
``s``-th contested decision is rolled out, as there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled_afterstate import NUM_AFTER, _schedule
from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES
from edbatch.schedule._compiled_priority_q import LABEL_BUDGET, decisions, label_stride, trace_ptr

__all__ = ["afterstate_forced_trace", "afterstate_q", "afterstate_q_tree"]


@njit(cache=True)
def afterstate_q(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                 total, down, w, wb, cap):  # type: ignore[no-untyped-def]
    """:func:`afterstate_q_tree` of linear scores (no trees)."""
    none = np.zeros((0, 5), np.float64)
    return afterstate_q_tree(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                             tw_ids, total, down, w, none, np.zeros(0, np.int64), wb, cap)


@njit(cache=True)
def afterstate_q_tree(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                      tw_ids, total, down, w, tree, roots, wb, cap):  # type: ignore[no-untyped-def]
    """``(rows, ids, ptr, q, batches)``: the rows ``[f_a, g_a]`` and op ids of the ready
    types of every decision of ``w`` (at most ``cap`` rows; decision ``t`` owns
    ``rows[ptr[t]:ptr[t + 1]]``), each type's rollout value (batches of the whole schedule
    when decision ``t`` takes the type and ``wb`` makes every later one) and ``w``'s own
    batches. Decisions with a single ready type, and the type ``w`` chose when ``wb`` is
    ``w``, get ``w``'s count (no rollout run)."""
    same = len(w) == len(wb) and len(roots) == 0
    notree = np.zeros((0, 5), np.float64)
    for m in range(len(w)):
        if same and w[m] != wb[m]:
            same = False
    width = NUM_PRIORITY_FEATURES + NUM_AFTER
    trace = np.zeros((cap, width), np.float64)
    trace_ids = np.empty(cap, np.int64)
    trace_dec = np.empty(cap, np.int64)
    none = np.empty(0, np.int64)
    res = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                    total, down, w, tree, roots, trace, trace_ids, trace_dec, none)
    batch_op, forced, nt = res[0], res[1], res[4]
    base = len(batch_op)
    seq = decisions(batch_op, forced)
    nd = len(seq)
    ptr = trace_ptr(trace_dec, nt, nd)
    q = np.full(nt, base, np.int64)
    prefix = np.empty(nd, np.int64)
    empty = np.zeros((0, width), np.float64)
    stride = label_stride(ptr, len(op), len(batchable), LABEL_BUDGET)
    c = -1
    for t in range(nd):
        lo, hi = ptr[t], ptr[t + 1]
        if hi - lo < 2:
            continue
        c += 1
        if c % stride:
            continue
        prefix[:t] = seq[:t]
        for i in range(lo, hi):
            b = trace_ids[i]
            if b != seq[t] or not same:
                prefix[t] = b
                q[i] = len(_schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred,
                                     tw_ptr, tw_ids, total, down, wb, notree, none, empty,
                                     none, none,
                                     prefix[:t + 1])[0])
    return trace[:nt], trace_ids[:nt], ptr, q, base


@njit(cache=True)
def afterstate_forced_trace(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                            tw_ids, total, down, w, prefix, cap):  # type: ignore[no-untyped-def]
    """``(rows, ids, ptr, batches)``: the rows and op ids of the ready types of every
    decision of the schedule whose first ``len(prefix)`` decisions take ``prefix``'s types
    and ``w`` the rest (decision ``t`` owns ``rows[ptr[t]:ptr[t + 1]]``), and its batches:
    the afterstate view of another scheduler's states (a search's sequence)."""
    trace = np.zeros((cap, NUM_PRIORITY_FEATURES + NUM_AFTER), np.float64)
    trace_ids = np.empty(cap, np.int64)
    trace_dec = np.empty(cap, np.int64)
    res = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                    total, down, w, np.zeros((0, 5), np.float64), np.zeros(0, np.int64),
                    trace, trace_ids, trace_dec, prefix)
    nt, nd = res[4], res[6]
    ptr = trace_ptr(trace_dec, nt, nd)
    return trace[:nt], trace_ids[:nt], ptr, len(res[0])
