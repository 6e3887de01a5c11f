"""The afterstate priority: the priority policy's score plus a one-step afterstate value.

At every decision each ready batchable type ``a`` gets the priority row ``f_a`` of
:mod:`edbatch.schedule._compiled_priority` and an *afterstate* row ``g_a``: features of the
state reached by running ``a``'s ready nodes, whose frontier then holds the other ready
types' nodes and ``R_a``, the batchable nodes every pending operand of which is a ready node
of type ``a`` (a one-step lookahead: no rollout, no second decision; unbatchable nodes ``a``
releases are left out, with their users). The type with the highest ``w . f_a + u . g_a``
runs; ``u = 0`` is the priority policy (critical path's weights: critical path). Boosted
regression trees may be added to that score (:func:`run_afterstate_tree`, an experiment of
:mod:`policies.afterstate_trees`); the columns they split on are computed like those of
non-zero weights.

``R_b`` is kept up to date, not rescanned: it only grows until ``b`` runs (its members wait
for ``b`` alone), so each node is put in once, checked when one of its operands runs or
becomes ready (:func:`_check_users`, once per decision), with the most ``down`` over its
members per type in ``rdn[b]``: O(edges x operands) per schedule. (Rescanning the users of
every ready node per decision took 7.3 ms a lattice mini-batch of 64 against 1.7 without the
afterstate: an input type's list stays ready for hundreds of decisions.)

The afterstate reads the **remaining lower bound** ``LB_t = max over unexecuted nodes v of
down[v, t]`` (``down``: :func:`edbatch.schedule.bounds.type_chain_lengths`, the most type-``t``
nodes on a path from ``v``), held per ready type ``b`` as ``D[b, t]``, the most over ``b``'s
ready nodes (``LB_t = max_b D[b, t]``: every unexecuted node has a ready ancestor, and
``down`` only grows towards the sources). A batch of type ``a`` lowers ``LB_a`` by one iff
``D[a, a]`` is above every other ready type's ``D[b, a]`` (``a`` is *tight*), and no other
``LB_t``: a schedule needs ``LB + (batches that were not tight)`` batches. Features
(:data:`AFTER_FEATURES`):

====================  ==========================================================
``tight``             1 if running ``a`` lowers the remaining lower bound
``lag``               ``min(LB_a - D[a, a], 16) / 16``: how far ``a``'s ready nodes trail
                      its longest remaining chain
``n_tight``           tight types after ``a`` runs, ``/ 4``
``no_tight``          1 if types are ready after ``a`` runs and none is tight (the next
                      batch cannot lower the bound)
``n_types``           ready batchable types after ``a`` runs, ``/ 4``
``lag_sum``           ``min(sum over the ready types t after a of LB_t - D'[t, t], 64) / 64``
====================  ==========================================================

Five more columns follow (:mod:`edbatch.schedule._compiled_afterstate_x`: a two-step
lookahead with the pair releases ``R_ab``, per-type margins), kept up to date and computed only
where their weights are not 0. The Python twin (``policies.afterstate.AfterstateTwin``)
recomputes ``D`` and ``R_a`` by rescanning: the tests assert identical rows and schedules.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.graph._csr import users_csr
from edbatch.schedule._compiled import _typewise_freed, start_state
from edbatch.schedule._compiled_afterstate_x import (
    EXTRA_FEATURES,
    check_both,
    now_cols,
    reset_pairs,
    two_step,
)
from edbatch.schedule._compiled_keys import _critical
from edbatch.schedule._compiled_priority import (
    NUM_PRIORITY_FEATURES,
    _scales,
    _uses_context,
    _uses_release,
    priority_features,
)
from edbatch.schedule._compiled_priority_ctx import context_rows
from edbatch.schedule._compiled_release import release_state, retire_step
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["AFTER_FEATURES", "BASE_AFTER", "MAX_TWO_STEP_TYPES", "NUM_AFTER", "afterstate_rows",
           "afterstate_trace", "run_afterstate", "run_afterstate_counts", "run_afterstate_tree",
           "tree_score"]

#: The one-step columns; :data:`~edbatch.schedule._compiled_afterstate_x.EXTRA_FEATURES`
#: (two-step, margins) follow, computed only where their weights are not 0.
BASE_AFTER = 6
#: Graphs of more op types (the vocabulary's) get 0 in the two-step columns ``miss2`` and
#: ``n_tight2``: their pair releases take ``k^4`` counts (64 types: 134 MB, 101: 0.8 GB, 251:
#: 32 GB). The Python twin does the same.
MAX_TWO_STEP_TYPES = 64
AFTER_FEATURES = ("tight", "lag", "n_tight", "no_tight", "n_types", "lag_sum", *EXTRA_FEATURES)
NUM_AFTER = len(AFTER_FEATURES)


@njit(cache=True, inline="always")
def _tight(t, present, d, k):  # type: ignore[no-untyped-def]
    """``(tight, LB_t - D[t, t])`` of ready type ``t`` given the rows ``d`` of the ready
    types (``present``)."""
    other = 0
    for b in range(k):
        if present[b] and b != t and d[b, t] > other:
            other = d[b, t]
    own = d[t, t]
    return (own > other), (other - own if other > own else 0)


@njit(cache=True)
def _scan_ready(r, ids, start, rlen, ready, down, dseen, d, todo, ntodo):  # type: ignore[no-untyped-def]
    """Read the ready nodes of the ``r`` types ``ids`` not read yet (a ready list only grows
    until its type runs, ``dseen[b]`` of it read): their ``down`` rows into ``d[b]``, the
    nodes onto ``todo``; returns the new length of ``todo``."""
    for i in range(r):
        b = ids[i]
        for j in range(start[b] + dseen[b], start[b] + rlen[b]):
            v = ready[j]
            for t in range(d.shape[1]):
                if down[v, t] > d[b, t]:
                    d[b, t] = down[v, t]
            todo[ntodo] = v
            ntodo += 1
        dseen[b] = rlen[b]
    return ntodo


@njit(cache=True)
def _check_users(todo, ntodo, uptr, uids, pptr, pids, pending, executed, op, batchable, inr,
                 rdn, rpres, down):  # type: ignore[no-untyped-def]
    """For every user ``u`` of the nodes ``todo[:ntodo]`` (which ran or became ready): put
    an unexecuted batchable ``u`` in ``R_b`` if every operand it waits for is a ready node
    of one batchable type ``b`` (running ``b`` releases it): ``inr[u] = b`` and its
    ``down`` row into ``rdn[b, op[u]]``. ``R_b`` only grows until ``b`` runs (then its
    members are released), so a node is put in once. One call per decision: a call per
    edge (arrays passed) cost more than the check."""
    for i in range(ntodo):
        v = todo[i]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            if inr[u] >= 0 or pending[u] == 0 or not batchable[op[u]]:
                continue  # unbatchable nodes are no feature's (a loss: thousands of operands)
            b = -1
            for f in range(pptr[u], pptr[u + 1]):
                p = pids[f]
                if executed[p]:
                    continue
                t = op[p]
                if pending[p] != 0 or not batchable[t] or (b >= 0 and t != b):
                    b = -2
                    break
                b = t
            if b < 0:
                continue
            inr[u] = b
            t = op[u]
            rpres[b, t] = True
            for m in range(down.shape[1]):
                if down[u, m] > rdn[b, t, m]:
                    rdn[b, t, m] = down[u, m]


@njit(cache=True)
def afterstate_rows(r, ids, k, d, rlen, batchable, rdn, rpres, dn, present, out, two, nt2,
                    rdn2, rp2, lst, l2, dn2):  # type: ignore[no-untyped-def]
    """Write the afterstate columns (:data:`AFTER_FEATURES`) of the ``r`` ready types
    ``ids`` into ``out``: the first six, and the two-step ``miss2`` (``n_tight2`` if
    ``nt2``) if ``two`` (:func:`~edbatch.schedule._compiled_afterstate_x.two_step`, on the
    rows after ``a`` built here). ``d[b]``: the most ``down`` over ``b``'s ready nodes (0
    rows for the others); ``rdn[a, t]``: the most ``down`` over the type-``t`` nodes running
    ``a`` releases (``rpres[a, t]``: any), ``rdn2``/``rp2`` the pairs'; ``dn``, ``present``,
    ``lst``, ``l2``, ``dn2``: ``k x k`` / ``k`` scratch."""
    for b in range(k):
        present[b] = rlen[b] > 0 and batchable[b]
    for i in range(r):
        a = ids[i]
        tight, lag = _tight(a, present, d, k)
        out[i, 0] = 1.0 if tight else 0.0
        out[i, 1] = (lag if lag < 16 else 16) / 16.0
    for i in range(r):
        a = ids[i]
        for t in range(k):
            keep = rlen[t] > 0 and batchable[t] and t != a
            present[t] = keep or rpres[a, t]
            for m in range(k):
                x = d[t, m] if keep else 0
                dn[t, m] = x if x > rdn[a, t, m] else rdn[a, t, m]
        nt, ntypes, lsum = 0, 0, 0
        for t in range(k):
            if present[t]:
                lst[ntypes] = t
                ntypes += 1
                tt, lt = _tight(t, present, dn, k)
                nt += 1 if tt else 0
                lsum += lt
        out[i, 2] = nt / 4.0
        out[i, 3] = 1.0 if (ntypes > 0 and nt == 0) else 0.0
        out[i, 4] = ntypes / 4.0
        out[i, 5] = (lsum if lsum < 64 else 64) / 64.0
        if two:
            miss, ntb = two_step(a, k, d, rlen, batchable, rdn, rpres, rdn2, rp2, dn, lst,
                                  ntypes, l2, dn2, nt2)
            out[i, BASE_AFTER + 1] = miss / 2.0
            out[i, BASE_AFTER + 2] = ntb / 4.0


@njit(cache=True)
def tree_score(x, y, tree, roots):  # type: ignore[no-untyped-def]
    """The sum over the trees (roots ``roots``) of the leaf each reaches on the row
    ``[x, y]``: node ``tree[j] = (column, threshold, left, right, value)``, a leaf where
    the column is negative; ``x[c] <= threshold`` goes left."""
    f = len(x)
    s = 0.0
    for j in range(len(roots)):
        nd = roots[j]
        while tree[nd, 0] >= 0.0:
            c = int(tree[nd, 0])
            v = x[c] if c < f else y[c - f]
            nd = int(tree[nd, 2]) if v <= tree[nd, 1] else int(tree[nd, 3])
        s += tree[nd, 4]
    return s


@njit(cache=True)
def _pick(r, x, y, w, u, tree, roots):  # type: ignore[no-untyped-def]
    """Row of the highest ``x[i] . w + y[i] . u`` plus its trees' sum (:func:`tree_score`;
    none: linear) (the first on ties)."""
    best, best_s = 0, -np.inf
    for i in range(r):
        s = 0.0
        for m in range(x.shape[1]):
            s += x[i, m] * w[m]
        for m in range(y.shape[1]):
            s += y[i, m] * u[m]
        if len(roots) > 0:
            s += tree_score(x[i], y[i], tree, roots)
        if s > best_s:
            best, best_s = i, s
    return best


@njit(cache=True)
def _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,  # noqa: C901
              total, down, w, tree, roots, trace, trace_ids, trace_dec, prefix):  # type: ignore[no-untyped-def]
    """:func:`run_afterstate`, also writing the rows ``[f_a, g_a]`` of every decision, their
    types' ids and decision indices into ``trace``/``trace_ids``/``trace_dec`` while they
    have room; the first ``len(prefix)`` decisions take ``prefix``'s op types (a rollout,
    :mod:`edbatch.schedule._compiled_afterstate_q`; each must be ready then); returns
    ``(batch_op, batch_forced, batch_ptr, nodes, rows traced, overrides, decisions)``."""
    n, k = len(op), len(batchable)
    f = NUM_PRIORITY_FEATURES
    wp, wa = w[:f], w[f:]
    use = w.copy()  # the columns the score reads: non-zero weights and the trees' splits
    for j in range(len(tree)):
        if tree[j, 0] >= 0.0 and use[int(tree[j, 0])] == 0.0:
            use[int(tree[j, 0])] = 1.0
    up, ua = use[:f], use[f:]
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    hmax, logt = _scales(height, total)
    seen = np.zeros(k, np.int64)
    sumh = np.zeros(k, np.int64)
    cmax = np.full(k, -1, np.int64)
    ctop = np.zeros(k, np.int64)
    full = len(trace) > 0
    x = np.zeros((k, f), np.float64)
    y = np.zeros((k, NUM_AFTER), np.float64)
    release = full or _uses_release(up, 0)
    context = full or _uses_context(up, 0)
    after = full or np.any(ua != 0.0)  # else the afterstate has no say
    # the extra columns in two groups, each computed only where a weight of it is not 0:
    # the two-step ones (miss2, n_tight2: the pair releases' upkeep) and the others
    nt2 = full or ua[BASE_AFTER + 2] != 0.0
    two = (nt2 or ua[BASE_AFTER + 1] != 0.0) and k <= MAX_TWO_STEP_TYPES
    now = full or ua[BASE_AFTER] != 0.0 or ua[BASE_AFTER + 3] != 0.0 or \
        ua[BASE_AFTER + 4] != 0.0
    slot, scnt, nst, tst, rel, fresh = release_state(k, op, uptr, uids, ready, start, rlen,
                                                     pending, batchable, release)
    d = np.zeros((k, k), np.int64)
    dseen = np.zeros(k, np.int64)
    dn = np.zeros((k, k), np.int64)
    present = np.zeros(k, np.bool_)
    lst = np.zeros(k, np.int64)
    l2 = np.zeros(k, np.int64)
    dn2 = np.zeros((k, k), np.int64)
    kx = k if two else 0  # the pair releases R_ab: only for the two-step columns
    rdn2 = np.zeros((kx * kx, kx, kx), np.int64)
    rp2 = np.zeros((kx * kx, kx), np.bool_)
    inr2 = np.zeros(n if two else 0, np.bool_)
    rdn = np.zeros((k, k, k), np.int64)
    rpres = np.zeros((k, k), np.bool_)
    inr = np.full(n, -1, np.int64)
    todo = np.empty(2 * n + 1, np.int64)  # nodes run or made ready since the last check
    ntodo = 0
    executed = np.zeros(n, np.bool_)
    pptr, pids = users_csr(uptr, uids if after else uids[:0], n if after else 0)  # operands
    ids = np.empty(k, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)
    nb, done, last, last2, nt = 0, 0, np.int64(-1), np.int64(-1), 0
    overrides, decisions = 0, 0
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
            executed[v] = True  # its users are checked at the next decision
            todo[ntodo] = v
            ntodo += 1
        if done == n:
            break
        cp = _critical(k, rlen, tw, maxh, batchable)
        r = priority_features(k, rlen, tw, maxh, rem, batchable, ready, start, height, total,
                              last, hmax, logt, seen, sumh, cmax, ctop, ids, x, rel, tst,
                              release)
        if context:
            context_rows(r, ids, x, cp, last2)
        if after:
            ntodo = _scan_ready(r, ids, start, rlen, ready, down, dseen, d, todo, ntodo)
            if two:  # the pair releases too, in the same scan
                check_both(todo, ntodo, uptr, uids, pptr, pids, pending, executed, op,
                           batchable, inr, rdn, rpres, inr2, rdn2, rp2, down)
            else:
                _check_users(todo, ntodo, uptr, uids, pptr, pids, pending, executed, op,
                             batchable, inr, rdn, rpres, down)
            afterstate_rows(r, ids, k, d, rlen, batchable, rdn, rpres, dn, present, y, two,
                            nt2, rdn2, rp2, lst, l2, dn2)
            if now:
                now_cols(r, ids, k, d, rdn, rpres, y, BASE_AFTER)
        ntodo = 0
        for i in range(r):
            if nt < len(trace):
                trace[nt, :f] = x[i]
                trace[nt, f:] = y[i]
                trace_ids[nt] = ids[i]
                trace_dec[nt] = decisions
                nt += 1
        if decisions < len(prefix):
            a = prefix[decisions]
        else:
            a = ids[_pick(r, x, y, wp, wa, tree, roots)] if r > 1 else ids[0]
        decisions += 1
        overrides += a != cp
        last, last2 = a, last
        c = rlen[a]
        batch = nodes[done:done + c]
        batch[:] = ready[start[a]:start[a] + c]
        sort_nodes(batch, mark)
        rlen[a], maxh[a] = 0, -1
        seen[a], sumh[a], cmax[a], ctop[a], dseen[a] = 0, 0, -1, 0, 0
        d[a, :] = 0
        rdn[a], rpres[a] = 0, False
        reset_pairs(a, k, rdn2, rp2)
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
        for v in batch:
            executed[v] = True
            todo[ntodo] = v
            ntodo += 1
    return (batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, nt, overrides,
            decisions)


@njit(cache=True)
def run_afterstate_tree(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                        tw_ids, total, down, w, tree, roots):  # type: ignore[no-untyped-def]
    """:func:`run_afterstate` with trees added to the linear score (:func:`tree_score`)."""
    res = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                    total, down, w, tree, roots,
                    np.empty((0, NUM_PRIORITY_FEATURES + NUM_AFTER)),
                    np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
    return res[0], res[1], res[2], res[3], res[5], res[6]


@njit(cache=True)
def run_afterstate(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                   total, down, w):  # type: ignore[no-untyped-def]
    """Schedule one graph with the weights ``w`` (``[w (F priority features), u (afterstate
    features)]``): ``(batch_op, batch_forced, batch_ptr, nodes, overrides, decisions)``, the
    batches as :func:`~edbatch.schedule._compiled.run_schedule` returns them, the decisions
    where the choice differs from critical path's, all decisions."""
    return run_afterstate_tree(op, depth, arity, uptr, uids, batchable, height, tw_pred,
                               tw_ptr, tw_ids, total, down, w, np.zeros((0, 5), np.float64),
                               np.zeros(0, np.int64))


@njit(cache=True)
def afterstate_trace(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                     total, down, w, cap):  # type: ignore[no-untyped-def]
    """The rows ``[f_a, g_a]`` the policy ``w`` scored, decision after decision (at most
    ``cap``): ``(rows, op ids)``, the oracle tests' view."""
    trace = np.zeros((cap, NUM_PRIORITY_FEATURES + NUM_AFTER), np.float64)
    trace_ids = np.empty(cap, np.int64)
    nt = _schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                   total, down, w, np.zeros((0, 5), np.float64), np.zeros(0, np.int64),
                   trace, trace_ids, np.empty(cap, np.int64), np.empty(0, np.int64))[4]
    return trace[:nt], trace_ids[:nt]


@njit(cache=True)
def run_afterstate_counts(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                          tw_ids, total, down, ws):  # type: ignore[no-untyped-def]
    """Batch counts of one graph under each weight vector (rows of ``ws``)."""
    out = np.empty(len(ws), np.int64)
    for i in range(len(ws)):
        out[i] = len(run_afterstate(op, depth, arity, uptr, uids, batchable, height, tw_pred,
                                    tw_ptr, tw_ids, total, down, ws[i])[0])
    return out
