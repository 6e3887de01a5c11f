"""The priority policy's release sums, kept up to date edge by edge (features 15-21 of
:mod:`edbatch.schedule._compiled_priority`).

For a ready op type ``b``: ``rel[b, t]`` counts the batchable nodes of type ``t`` whose
pending operands are all ready nodes of type ``b`` (running ``b`` now releases them),
``tst[2, b]`` their sum over ``t``, ``tst[1, b]`` the same with unbatchable users counted
too, and ``tst[0, b]`` the unexecuted nodes with at least one ready operand of type ``b``
(``tst[0, b] - tst[1, b]``: users left waiting for other operands).

Per unexecuted node ``u``, ``nst[:, u]`` holds its ready operands (edges), how many
distinct types they have and the sum of their types (with one type, the sum over the count
is that type); per group (``u``, operand type), ``scnt`` the ready operands in it
(:func:`_user_slots` numbers the groups). Each edge event, an operand joins a ready list
(:func:`_mark_ready`) or runs (:func:`retire_tracked`), takes ``u``'s credit out of the
sums, updates ``u`` and puts the credit back: O(1) per edge, so a graph's upkeep is
O(edges) and a decision reads the sums in O(ready types^2) instead of rescanning the users
of every ready node. The credit's arithmetic is written out where it is used: a numba call per
edge (arrays passed, reference counts) cost more than the arithmetic. The Python twin
(``policies.priority.PriorityTwin``) rescans: the oracle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import _retire

__all__ = ["release_state", "retire_step"]


@njit(cache=True)
def _user_slots(k, op, uptr, uids):  # type: ignore[no-untyped-def]
    """``slot[e]``: the group of edge ``e`` (its user ``uids[e]`` and its operand's type),
    numbered ``0 .. ns - 1``; returns ``(slot, ns)``. One pass over the edges: each user
    keeps a list of its groups (newest first; a list is as long as the distinct operand
    types met so far, at most ``min(arity, k)``). The four passes that built the operand
    lists first measured 17.5 us of a module_net mini-batch's priority loop (~265 us)."""
    n, m = len(op), len(uids)
    head = np.full(n, -1, np.int64)  # a user's newest group
    gtype = np.empty(m, np.int64)  # a group's operand type
    gnext = np.empty(m, np.int64)  # the user's group before it
    slot = np.empty(m, np.int64)
    ns = 0
    for v in range(n):
        t = op[v]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            g = head[u]
            while g >= 0 and gtype[g] != t:
                g = gnext[g]
            if g < 0:
                g = ns
                gtype[g], gnext[g] = t, head[u]
                head[u] = g
                ns += 1
            slot[e] = g
    return slot, ns


@njit(cache=True)
def _mark_ready(fresh, m, uptr, uids, slot, scnt, pending, nst, op, batchable, tst,
                rel):  # type: ignore[no-untyped-def]
    """Nodes ``fresh[:m]`` joined the ready lists: their users gain a ready operand."""
    rdy, nd, rsum = nst[0], nst[1], nst[2]
    for i in range(m):
        v = fresh[i]
        b = op[v]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            r = rdy[u]
            if r > 0 and r == pending[u] and nd[u] == 1:  # u's credit out (see the doc)
                c = rsum[u] // r
                tst[1, c] -= 1
                t = op[u]
                if batchable[t]:
                    tst[2, c] -= 1
                    rel[c, t] -= 1
            r += 1
            rdy[u] = r
            rsum[u] += b
            g = slot[e]
            scnt[g] += 1
            if scnt[g] == 1:
                nd[u] += 1
                tst[0, b] += 1
            if r == pending[u] and nd[u] == 1:  # and back in
                c = rsum[u] // r
                tst[1, c] += 1
                t = op[u]
                if batchable[t]:
                    tst[2, c] += 1
                    rel[c, t] += 1


@njit(cache=True)
def retire_tracked(batch, was_ready, uptr, uids, pending, op, batchable, ready, start, rlen,
                   maxh, height, forced, nf, slot, scnt, nst, tst, rel,
                   fresh):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.schedule._compiled._retire` (and its ``_release``) keeping the
    release sums up to date: ``batch`` ran (``was_ready``: from a ready list, else a forced
    node); ``fresh``: scratch for the nodes it makes ready. Returns the forced count."""
    rdy, nd, rsum = nst[0], nst[1], nst[2]
    m = np.int64(0)  # not Literal[int](0): one compiled _mark_ready
    for v in batch:
        b = op[v]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            r, p = rdy[u], pending[u]
            if r > 0 and r == p and nd[u] == 1:  # u's credit out
                c = rsum[u] // r
                tst[1, c] -= 1
                t = op[u]
                if batchable[t]:
                    tst[2, c] -= 1
                    rel[c, t] -= 1
            if was_ready:
                r -= 1
                rdy[u] = r
                rsum[u] -= b
                g = slot[e]
                scnt[g] -= 1
                if scnt[g] == 0:
                    nd[u] -= 1
                    tst[0, b] -= 1
            p -= 1
            pending[u] = p
            if p == 0:  # released (as the core's _release does)
                a = op[u]
                if batchable[a]:
                    ready[start[a] + rlen[a]] = u
                    rlen[a] += 1
                    if len(height) and height[u] > maxh[a]:
                        maxh[a] = height[u]
                    fresh[m] = u
                    m += 1
                else:
                    forced[nf] = u
                    nf += 1
            elif r > 0 and r == p and nd[u] == 1:  # and back in
                c = rsum[u] // r
                tst[1, c] += 1
                t = op[u]
                if batchable[t]:
                    tst[2, c] += 1
                    rel[c, t] += 1
    _mark_ready(fresh, m, uptr, uids, slot, scnt, pending, nst, op, batchable, tst, rel)
    return nf


@njit(cache=True)
def release_state(k, op, uptr, uids, ready, start, rlen, pending, batchable,
                  release):  # type: ignore[no-untyped-def]
    """``(slot, scnt, nst, tst, rel, fresh)`` after the sources joined the ready lists
    (empty per-node arrays when ``release`` is false: nothing is kept)."""
    n = len(op) if release else 0
    rel = np.zeros((k, k), np.int64)
    tst = np.zeros((3, k), np.int64)
    nst = np.zeros((3, n), np.int64)
    fresh = np.empty(n, np.int64)
    if not release:
        return np.empty(0, np.int64), np.empty(0, np.int64), nst, tst, rel, fresh
    slot, ns = _user_slots(k, op, uptr, uids)
    scnt = np.zeros(ns, np.int64)
    m = np.int64(0)  # not Literal[int](0): one compiled _mark_ready
    for a in range(k):
        for j in range(start[a], start[a] + rlen[a]):
            fresh[m] = ready[j]
            m += 1
    _mark_ready(fresh, m, uptr, uids, slot, scnt, pending, nst, op, batchable, tst, rel)
    return slot, scnt, nst, tst, rel, fresh


@njit(cache=True)
def retire_step(batch, was_ready, release, uptr, uids, pending, op, batchable, ready, start,
                rlen, maxh, height, forced, nf, slot, scnt, nst, tst, rel,
                fresh):  # type: ignore[no-untyped-def]
    """Retire ``batch``: :func:`retire_tracked` when the sums are kept, else the core's
    plain :func:`~edbatch.schedule._compiled._retire`."""
    if release:
        return retire_tracked(batch, was_ready, uptr, uids, pending, op, batchable, ready,
                              start, rlen, maxh, height, forced, nf, slot, scnt, nst, tst, rel,
                              fresh)
    return _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh, height,
                   forced, nf)
