"""Compiled static analyses for the compiled core: type-wise graph and critical-path heights.

Node ids are a topological order (every operand id is smaller than its user's), so both are
single passes over the ids. The Python versions in :mod:`edbatch.schedule.bounds` stay the
oracle (tests compare them on every workload and on random DAGs).

* :func:`typewise_graph_numba`: for each node ``v``, a depth-first walk up its operands that
  stops at nodes of ``v``'s own type; those are its type-wise predecessors (some path reaches
  ``v`` without another node of the type). A per-walk stamp visits each ancestor once, and
  the walk enters only ancestors that have an ancestor of ``v``'s type (per-node bit sets of
  the types above it, one pass over the edges). Cost: O(edges x types / 64) for the bit
  sets, plus the ancestors of ``v`` above its nearest same-type ones *that lead to one*: a
  loss node, whose type has no node above it, visits only its operands instead of its whole
  instance.
* :func:`heights_numba`: longest path to a sink, in nodes.
* :func:`flat_arrays`: the core's per-node arrays and its users CSR in one pass over the
  edges (:func:`flat_arrays_numpy`, the numpy calls it replaces, is its oracle).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["core_inputs", "flat_arrays", "flat_arrays_numpy", "heights_numba",
           "typewise_graph_numba"]


@njit(cache=True)
def typewise_graph_numba(op, optr, oids):  # type: ignore[no-untyped-def]
    """``(pred_count int32[N], succ_ptr int64[N+1], succ_ids int32[T])``, rows ascending."""
    n = len(op)
    reach = _type_reach(op, optr, oids)
    cap = max(16, 2 * (n + len(oids)))  # a guess; untouched capacity costs no page
    src = np.empty(cap, np.int64)
    dst = np.empty(cap, np.int64)
    m = _typewise_edges(op, optr, oids, reach, src, dst)
    if m > cap:  # more type-wise edges than the guess: walk again into exact buffers
        src = np.empty(m, np.int64)
        dst = np.empty(m, np.int64)
        _typewise_edges(op, optr, oids, reach, src, dst)
    pred_count = np.zeros(n, np.int32)
    succ_ptr = np.zeros(n + 1, np.int64)
    for e in range(m):
        pred_count[dst[e]] += 1
        succ_ptr[src[e] + 1] += 1
    for v in range(n):
        succ_ptr[v + 1] += succ_ptr[v]
    fill = succ_ptr[:-1].copy()
    succ_ids = np.empty(m, np.int32)
    for e in range(m):  # edges come in ascending dst order, so each row is ascending
        succ_ids[fill[src[e]]] = dst[e]
        fill[src[e]] += 1
    return pred_count, succ_ptr, succ_ids


@njit(cache=True)
def _typewise_edges(op, optr, oids, reach, src, dst):  # type: ignore[no-untyped-def]
    """The type-wise edges ``src[e] -> dst[e]`` in ascending ``dst`` order, as many as fit
    in ``src`` and ``dst``; returns how many there are (possibly more than fit).

    The edge buffers are never reallocated here: an array variable reassigned inside the
    loop (growing it on demand) made numba reference-count it on every iteration, which
    cost about 25 times the walk itself on a Tree-LSTM mini-batch (0.26 against 0.01 ms).
    """
    n = len(op)
    cap = len(src)
    stamp = np.full(n, -1, np.int64)
    stack = np.empty(max(n, 1), np.int64)
    m = 0
    for v in range(n):
        t = op[v]
        word = t >> 6
        bit = np.int64(1) << (t & 63)
        sp = 0
        u = v
        while True:  # u: v itself, then each popped ancestor of another type than t
            for i in range(optr[u], optr[u + 1]):
                w = oids[i]
                if stamp[w] != v and reach[w, word] & bit:
                    stamp[w] = v
                    if op[w] == t:  # a type-wise predecessor: the walk stops there
                        if m < cap:
                            src[m] = w
                            dst[m] = v
                        m += 1
                    else:
                        stack[sp] = w
                        sp += 1
            if sp == 0:
                break
            sp -= 1
            u = stack[sp]
    return m


@njit(cache=True)
def _type_reach(op, optr, oids):  # type: ignore[no-untyped-def]
    """``int64[N, W]`` bit sets: bit ``t`` of row ``x`` is set when ``x`` or one of its
    ancestors has type ``t`` (one pass over the edges)."""
    n = len(op)
    k = 1
    for v in range(n):
        if op[v] + 1 > k:
            k = op[v] + 1
    words = (k + 63) >> 6
    reach = np.zeros((n, words), np.int64)
    for v in range(n):
        reach[v, op[v] >> 6] |= np.int64(1) << (op[v] & 63)
        for i in range(optr[v], optr[v + 1]):
            u = oids[i]
            for w in range(words):
                reach[v, w] |= reach[u, w]
    return reach


@njit(cache=True)
def heights_numba(uptr, uids):  # type: ignore[no-untyped-def]
    """``int64[N]``: nodes on the longest path from each node to a sink."""
    n = len(uptr) - 1
    h = np.ones(n, np.int64)
    for v in range(n - 1, -1, -1):
        best = 0
        for i in range(uptr[v], uptr[v + 1]):
            if h[uids[i]] > best:
                best = h[uids[i]]
        h[v] += best
    return h


@njit(cache=True)
def flat_arrays(op_ids, optr, oids, depth, k):  # type: ignore[no-untyped-def]
    """``(op, depth, arity, user_ptr, user_ids, mean)`` of a graph's ``int32`` op ids,
    ``int64`` operand pointers, ``int32`` operand ids and ``int32`` depths, all ``int64``
    but ``mean`` (``float64[k]``: each op type's mean depth, as DyNet's agenda weighs it);
    the users in edge order, as :attr:`Graph.users <edbatch.graph.ir.Graph.users>`. One
    compiled call instead of ten numpy calls and a users pass (0.14 against 0.03 ms on a
    64x64 Tree-LSTM mini-batch)."""
    n, e = len(op_ids), len(oids)
    op = np.empty(n, np.int64)
    dep = np.empty(n, np.int64)
    arity = np.empty(n, np.int64)
    count = np.zeros(k, np.int64)
    total = np.zeros(k, np.float64)
    uptr = np.zeros(n + 1, np.int64)
    for v in range(n):
        a = op_ids[v]
        op[v], dep[v], arity[v] = a, depth[v], optr[v + 1] - optr[v]
        count[a] += 1
        total[a] += depth[v]
    for i in range(e):
        uptr[oids[i] + 1] += 1
    for v in range(n):
        uptr[v + 1] += uptr[v]
    fill = uptr[:-1].copy()
    uids = np.empty(e, np.int64)
    for v in range(n):
        for i in range(optr[v], optr[v + 1]):
            u = oids[i]
            uids[fill[u]] = v
            fill[u] += 1
    mean = np.empty(k, np.float64)
    for a in range(k):
        mean[a] = total[a] / (count[a] + 1e-3)
    return op, dep, arity, uptr, uids, mean


def flat_arrays_numpy(graph: Any) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    """:func:`flat_arrays` of ``graph`` in numpy (the oracle)."""
    uptr, uids = graph.users
    total = np.bincount(graph.op_ids, weights=graph.depth, minlength=len(graph.vocab))
    mean = total / (graph.type_counts + 1e-3)
    return (graph.op_ids.astype(np.int64), graph.depth.astype(np.int64),
            graph.arity.astype(np.int64), uptr.astype(np.int64), uids.astype(np.int64),
            mean.astype(np.float64))


@njit(cache=True)
def core_inputs(op_ids, optr, oids, depth, k, need_h, need_tw):  # type: ignore[no-untyped-def]
    """:func:`flat_arrays`, then (``need_h``) :func:`heights_numba` and (``need_tw``)
    :func:`typewise_graph_numba` (on ``oids`` as given: no ``int64`` copy) in one compiled
    call: ``(op, depth, arity, user_ptr, user_ids, mean, heights, tw_pred, tw_ptr,
    tw_ids)``, the ones not asked for empty. The same arrays as the three calls (tested)."""
    op, dep, arity, uptr, uids, mean = flat_arrays(op_ids, optr, oids, depth, k)
    height = heights_numba(uptr, uids) if need_h else np.empty(0, np.int64)
    if need_tw:
        pred, sptr, sids = typewise_graph_numba(op, optr, oids)
    else:
        pred, sptr, sids = np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int32)
    return op, dep, arity, uptr, uids, mean, height, pred, sptr, sids
