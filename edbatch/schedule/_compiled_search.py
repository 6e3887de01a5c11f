"""Local search over a schedule's op-type sequence, compiled; see
:mod:`edbatch.schedule.search` (its Python twin, the oracle in tests, mirrors every line).

A schedule of the batching MDP is fixed by the sequence of op types it batches: replaying a
sequence pops every ready node of the next type that has ready nodes (types with none are
skipped), runs ready unbatchable nodes alone first, and once the sequence is spent takes the
type of the highest ready node (critical path; ties: the lowest op id). The search mutates
the sequence (delete one entry, move one within ``window`` places, insert a random batchable
type), replays it, and keeps a mutant that needs no more batches, or a worse one with the
simulated-annealing probability ``exp(-(worse by) / T)``, ``T`` falling linearly from
``temperature`` to 0. Random numbers come from a Park-Miller generator (``state * 48271 mod
2^31 - 1``), which the Python twin reproduces exactly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["replay_count", "search_sequence"]

_MOD = 2147483647


@njit(cache=True)
def _push(u, op, batchable, head, nxt, cnt, forced, nf):  # type: ignore[no-untyped-def]
    t = op[u]
    if batchable[t]:
        nxt[u] = head[t]
        head[t] = u
        cnt[t] += 1
        return nf
    forced[nf] = u
    return nf + 1


@njit(cache=True)
def _release(v, op, uptr, uids, indeg, batchable, head, nxt, cnt, forced, nf):  # type: ignore[no-untyped-def]
    for e in range(uptr[v], uptr[v + 1]):
        u = uids[e]
        indeg[u] -= 1
        if indeg[u] == 0:
            nf = _push(u, op, batchable, head, nxt, cnt, forced, nf)
    return nf


@njit(cache=True)
def _highest(k, head, nxt, cnt, height):  # type: ignore[no-untyped-def]
    best, best_h = -1, -1
    for t in range(k):
        if cnt[t] > 0:
            v = head[t]
            while v >= 0:
                if height[v] > best_h:
                    best, best_h = t, height[v]
                v = nxt[v]
    return best


@njit(cache=True)
def replay_count(seq, op, uptr, uids, arity, batchable, height, k, out):  # type: ignore[no-untyped-def]
    """Batches of the schedule ``seq`` stands for; ``out[:L]`` gets its decisions' op types
    (skipped entries dropped, the critical-path tail added). Returns ``(batches, L)``."""
    n = len(op)
    indeg = arity.copy()
    head = np.full(k, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    cnt = np.zeros(k, np.int64)
    forced = np.empty(n, np.int64)
    buf = np.empty(n, np.int64)
    nf = np.int64(0)  # not Literal[int](0): one compiled _push
    for v in range(n):
        if indeg[v] == 0:
            nf = _push(v, op, batchable, head, nxt, cnt, forced, nf)
    done, batches, length, i = 0, 0, 0, 0
    while True:
        while nf > 0:
            nf -= 1
            v = forced[nf]
            batches += 1
            done += 1
            nf = _release(v, op, uptr, uids, indeg, batchable, head, nxt, cnt, forced, nf)
        if done == n:
            return batches, length
        a = -1
        while i < len(seq) and a < 0:
            if cnt[seq[i]] > 0:
                a = seq[i]
            i += 1
        if a < 0:
            a = _highest(k, head, nxt, cnt, height)
        c, v = 0, head[a]
        while v >= 0:
            buf[c] = v
            c += 1
            v = nxt[v]
        head[a], cnt[a] = -1, 0
        batches += 1
        done += c
        out[length] = a
        length += 1
        for j in range(c):
            nf = _release(buf[j], op, uptr, uids, indeg, batchable, head, nxt, cnt, forced, nf)


@njit(cache=True)
def _mutate(cur, cand, kind, i, j, t):  # type: ignore[no-untyped-def]
    """``cand[:m]`` = ``cur`` with entry ``i`` deleted (kind 0), moved to ``j`` (1) or type
    ``t`` inserted before it (2); returns ``m``."""
    m = 0
    for q in range(len(cur)):
        if kind == 2 and q == i:
            cand[m] = t
            m += 1
        if kind != 2 and q == i:  # deleted, or moved to j
            continue
        if kind == 1 and q == j and j < i:
            cand[m] = cur[i]
            m += 1
        cand[m] = cur[q]
        m += 1
        if kind == 1 and q == j and j > i:
            cand[m] = cur[i]
            m += 1
    return m


@njit(cache=True)
def search_sequence(seq, op, uptr, uids, arity, batchable, height, k, types, iterations,  # type: ignore[no-untyped-def]
                    window, temperature, seed, floor):
    """The best sequence found from ``seq``: ``(batches, sequence, accepted mutants)``;
    ``types``: the batchable op ids an insertion draws from; the search stops once a
    sequence needs ``floor`` batches (a lower bound: nothing beats it)."""
    out = np.empty(len(op) + 1, np.int64)
    cand = np.empty(len(op) + 2, np.int64)
    b, length = replay_count(seq, op, uptr, uids, arity, batchable, height, k, out)
    cur = out[:length].copy()
    best, cur_b, best_seq, accepted = b, b, cur.copy(), 0
    state = seed % (_MOD - 1) + 1
    for it in range(iterations):
        if len(cur) == 0 or best <= floor:
            break
        state = state * 48271 % _MOD
        kind = state % 3
        state = state * 48271 % _MOD
        i = state % len(cur)
        state = state * 48271 % _MOD
        j = min(max(i + state % (2 * window + 1) - window, 0), len(cur) - 1)
        state = state * 48271 % _MOD
        t = types[state % len(types)]
        if kind == 1 and j == i:
            continue
        m = _mutate(cur, cand, kind, i, j, t)
        nb, length = replay_count(cand[:m], op, uptr, uids, arity, batchable, height, k, out)
        temp = temperature * (1.0 - it / iterations)
        state = state * 48271 % _MOD
        if nb <= cur_b or (temp > 0.0 and state / _MOD < math.exp((cur_b - nb) / temp)):
            cur_b, cur = nb, out[:length].copy()
            accepted += 1
            if nb < best:
                best, best_seq = nb, cur.copy()
    return best, best_seq, accepted
