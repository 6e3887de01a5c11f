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
(:func:`_on_ready`) or runs (:func:`retire_tracked`), takes ``u``'s credit out of the sums,
updates ``u`` and puts the credit back: O(1) per edge, so a graph's upkeep is O(edges) and
a decision reads the sums in O(ready types^2) instead of rescanning the users of every
ready node. The Python twin (``policies.priority.PriorityTwin``) rescans: the oracle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled import _release, _retire

__all__ = ["release_state", "retire_step"]


@njit(cache=True)
def _user_slots(k, op, uptr, uids):  # type: ignore[no-untyped-def]
    """``slot[e]``: the group of edge ``e`` (its user ``uids[e]`` and its operand's type),
    numbered ``0 .. ns - 1``; returns ``(slot, ns)``. O(nodes + edges)."""
    n, m = len(op), len(uids)
    ptr = np.zeros(n + 1, np.int64)
    for e in range(m):
        ptr[uids[e] + 1] += 1
    for u in range(n):
        ptr[u + 1] += ptr[u]
    pos = ptr[:n].copy()
    edge = np.empty(m, np.int64)
    etype = np.empty(m, np.int64)
    for v in range(n):
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            edge[pos[u]], etype[pos[u]] = e, op[v]
            pos[u] += 1
    slot = np.empty(m, np.int64)
    mark = np.full(k, -1, np.int64)
    tslot = np.empty(k, np.int64)
    ns = 0
    for u in range(n):
        for j in range(ptr[u], ptr[u + 1]):
            t = etype[j]
            if mark[t] != u:
                mark[t], tslot[t] = u, ns
                ns += 1
            slot[edge[j]] = tslot[t]
    return slot, ns


@njit(cache=True)
def _credit(u, s, pending, nst, op, batchable, tst, rel):  # type: ignore[no-untyped-def]
    """Add ``s`` times node ``u``'s share of the release sums: if its pending operands are
    all ready and of one type ``b`` (``nst[:, u]``: ready operands, their distinct types,
    the sum of their types), running ``b`` releases it: ``tst[1, b]`` (every such user),
    ``tst[2, b]`` and ``rel[b, op[u]]`` (batchable users)."""
    r = nst[0, u]
    if r > 0 and r == pending[u] and nst[1, u] == 1:
        b = nst[2, u] // r
        tst[1, b] += s
        t = op[u]
        if batchable[t]:
            tst[2, b] += s
            rel[b, t] += s


@njit(cache=True)
def _on_ready(v, uptr, uids, slot, scnt, pending, nst, op, batchable, tst,
              rel):  # type: ignore[no-untyped-def]
    """Node ``v`` joined a ready list: its users gain a ready operand of type ``op[v]``
    (``tst[0, b]``: users with at least one ready operand of type ``b``)."""
    b = op[v]
    for e in range(uptr[v], uptr[v + 1]):
        u = uids[e]
        _credit(u, -1, pending, nst, op, batchable, tst, rel)
        nst[0, u] += 1
        nst[2, u] += b
        g = slot[e]
        scnt[g] += 1
        if scnt[g] == 1:
            nst[1, u] += 1
            tst[0, b] += 1
        _credit(u, 1, pending, nst, op, batchable, tst, rel)


@njit(cache=True)
def retire_tracked(batch, was_ready, uptr, uids, pending, op, batchable, ready, start, rlen,
                    maxh, height, forced, nf, slot, scnt, nst, tst,
                    rel):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.schedule._compiled._retire` keeping the release sums up to date:
    ``batch`` ran (``was_ready``: from a ready list, else a forced node)."""
    for v in batch:
        b = op[v]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            _credit(u, -1, pending, nst, op, batchable, tst, rel)
            if was_ready:
                nst[0, u] -= 1
                nst[2, u] -= b
                g = slot[e]
                scnt[g] -= 1
                if scnt[g] == 0:
                    nst[1, u] -= 1
                    tst[0, b] -= 1
            pending[u] -= 1
            _credit(u, 1, pending, nst, op, batchable, tst, rel)
            if pending[u] == 0:
                nf = _release(u, op, batchable, ready, start, rlen, maxh, height, forced, nf)
                if batchable[op[u]]:
                    _on_ready(u, uptr, uids, slot, scnt, pending, nst, op, batchable, tst, rel)
    return nf


@njit(cache=True)
def release_state(k, op, uptr, uids, ready, start, rlen, pending, batchable,
                  release):  # type: ignore[no-untyped-def]
    """``(slot, scnt, nst, tst, rel)`` after the sources joined the ready lists (empty
    per-node arrays when ``release`` is false: nothing is kept)."""
    n = len(op) if release else 0
    rel = np.zeros((k, k), np.int64)
    tst = np.zeros((3, k), np.int64)
    nst = np.zeros((3, n), np.int64)
    if not release:
        return np.empty(0, np.int64), np.empty(0, np.int64), nst, tst, rel
    slot, ns = _user_slots(k, op, uptr, uids)
    scnt = np.zeros(ns, np.int64)
    for a in range(k):
        for j in range(start[a], start[a] + rlen[a]):
            _on_ready(ready[j], uptr, uids, slot, scnt, pending, nst, op, batchable, tst, rel)
    return slot, scnt, nst, tst, rel


@njit(cache=True)
def retire_step(batch, was_ready, release, uptr, uids, pending, op, batchable, ready, start,
                rlen, maxh, height, forced, nf, slot, scnt, nst, tst,
                rel):  # type: ignore[no-untyped-def]
    """Retire ``batch``: :func:`retire_tracked` when the sums are kept, else the core's
    plain :func:`~edbatch.schedule._compiled._retire`."""
    if release:
        return retire_tracked(batch, was_ready, uptr, uids, pending, op, batchable, ready,
                              start, rlen, maxh, height, forced, nf, slot, scnt, nst, tst, rel)
    return _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh, height,
                   forced, nf)
