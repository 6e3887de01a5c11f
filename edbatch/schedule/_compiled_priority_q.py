"""Rollout values of the priority policy's decisions, on the compiled core.

For every decision of the policy ``w`` on a graph with two or more ready types, and every
ready type ``b`` there: the batches of the whole schedule when that decision takes ``b``
and the policy makes every later one (``Q(s_t, b)``, the state reached by the policy's own
first ``t`` decisions). The chosen type's value is the policy's own count. This is what a
policy-iteration learner (:mod:`policies.priority_api`) fits its next weights to: the
feature rows of each decision's ready types and their values.

Each value replays a whole schedule, so a graph costs about (ready types over its contested
decisions) x (nodes + decisions x op types), some 50 ns each: a 1,000-node, 101-type DAG
(2e9) took 66 s, a 4,000-node, 401-type one would take hours. Past :data:`LABEL_BUDGET` of
that work (~50 s) only every ``s``-th contested decision is rolled out (:func:`label_stride`;
the others keep the policy's count for every type, so callers see them as uncontested).
Cell-level mini-batches of 64 stay far below it (lattice 1.7e7, module network 7.6e6) and
are labelled in full; primitive lattices (1.5e9) get every second decision.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, _schedule

__all__ = ["LABEL_BUDGET", "decisions", "label_stride", "priority_q", "priority_q_base",
           "trace_ptr"]

#: Rollout work per graph (rollouts x (nodes + decisions x op types)) labelled in full.
LABEL_BUDGET = 1_000_000_000


@njit(cache=True)
def label_stride(ptr, n, k, budget):  # type: ignore[no-untyped-def]
    """Every how many contested decisions (two or more ready types) one is rolled out so
    that the rollouts' work (module doc) stays within ``budget`` (1: all of them)."""
    nd = len(ptr) - 1
    rollouts = 0
    for t in range(nd):
        if ptr[t + 1] - ptr[t] >= 2:
            rollouts += ptr[t + 1] - ptr[t]
    work = rollouts * (n + nd * k)
    return max(np.int64(1), (work + budget - 1) // budget)


@njit(cache=True)
def decisions(batch_op, forced):  # type: ignore[no-untyped-def]
    """The op types a schedule's *decisions* took: its batches that were not forced (a
    single ready type), in order."""
    seq = np.empty(len(batch_op), np.int64)
    nd = 0
    for i in range(len(batch_op)):
        if not forced[i]:
            seq[nd] = batch_op[i]
            nd += 1
    return seq[:nd]


@njit(cache=True)
def trace_ptr(trace_dec, nt, nd):  # type: ignore[no-untyped-def]
    """``ptr``: decision ``t`` owns trace rows ``ptr[t]:ptr[t + 1]`` (``trace_dec``: each of
    the ``nt`` rows' decision; decisions past the trace's room own no rows)."""
    ptr = np.zeros(nd + 1, np.int64)
    for i in range(nt):
        ptr[trace_dec[i] + 1] = i + 1
    for t in range(nd):
        if ptr[t + 1] < ptr[t]:
            ptr[t + 1] = ptr[t]
    return ptr


@njit(cache=True)
def _same(w, nh, wb, nhb):  # type: ignore[no-untyped-def]
    """Whether ``(wb, nhb)`` is the policy ``(w, nh)``."""
    if nhb != nh or len(wb) != len(w):
        return False
    for m in range(len(w)):
        if wb[m] != w[m]:
            return False
    return True


@njit(cache=True)
def priority_q(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
               total, w, nh, cap):  # type: ignore[no-untyped-def]
    """:func:`priority_q_base` whose rollouts continue with the policy ``w`` itself."""
    return priority_q_base(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                           tw_ids, total, w, nh, w, nh, cap)


@njit(cache=True)
def priority_q_base(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                    tw_ids, total, w, nh, wb, nhb, cap):  # type: ignore[no-untyped-def]
    """``(rows, ids, ptr, q, batches)``: the feature rows and op ids of the ready types of
    every decision (at most ``cap`` rows; decision ``t`` owns ``rows[ptr[t]:ptr[t + 1]]``),
    each type's rollout value (batches of the whole schedule when decision ``t`` takes the
    type and the *base* policy ``wb`` (``nhb`` hidden units) makes every later one; the
    states are those ``w`` reaches) and ``w``'s own batches. Decisions with a single ready
    type, and the type ``w`` chose when ``wb`` is ``w``, get ``w``'s count.
    A DAgger teacher (:mod:`policies.priority_dagger`) labels the student's states with
    ``wb`` = critical path: the one-step rollout over critical path."""
    same = _same(w, nh, wb, nhb)
    trace = np.zeros((cap, NUM_PRIORITY_FEATURES), np.float64)
    trace_ids = np.empty(cap, np.int64)
    trace_dec = np.empty(cap, np.int64)
    none = np.empty(0, np.int64)
    res = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                    total, w, nh, trace, trace_ids, trace_dec, none, np.bool_(True))
    batch_op, forced, nt = res[0], res[1], res[6]
    base = len(batch_op)
    seq = decisions(batch_op, forced)
    nd = len(seq)
    ptr = trace_ptr(trace_dec, nt, nd)
    q = np.full(nt, base, np.int64)
    prefix = np.empty(nd, np.int64)
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
                                     tw_ptr, tw_ids, total, wb, nhb, trace[:0], trace_ids[:0],
                                     trace_dec[:0], prefix[:t + 1],
                                     np.bool_(False))[0])
    return trace[:nt], trace_ids[:nt], ptr, q, base
