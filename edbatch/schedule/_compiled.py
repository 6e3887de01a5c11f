"""The compiled scheduling core: a whole schedule in one numba call (``@njit(cache=True)``).

:func:`run_schedule` replays :class:`~edbatch.schedule.frontier.Frontier` and the policy loop
of :func:`~edbatch.schedule.policy.run_policy` on flat arrays, decision rules included, and
returns the batches as four arrays. The Python classes stay the oracle: the tests assert
identical schedules (op, node set, order, forced flags) on every workload, granularity and
rule, so tie-breaking here must follow the Python code line by line.

Frontier state, per op type ``a`` (``K`` types) and per node (``N`` nodes):

* ``ready[start[a]:start[a] + rlen[a]]``: ready nodes of ``a`` (a type's segment is as long as
  its node count, and a type's ready set empties whenever it runs); ``maxh[a]``: the largest
  critical-path height among them (``-1`` when empty);
* ``tw[a]``: ED-Batch's type-wise count ``T(a)``; ``rem[a]`` / ``remd[a]``: unexecuted nodes
  and the sum of their depths; ``pending[v]``: operand slots of ``v`` not yet executed;
* ``forced``: a LIFO stack of ready unbatchable nodes, run alone before each decision.

Decision rules (``RULE_*``) and FSM keys (``ENC_*``) read only those arrays. **Adding a state
key** (e.g. a new FSM encoding): write an ``@njit`` function with the signature of
:func:`_key_base`, ``(k, rlen, tw, maxh, rem, remd, batchable, out) -> length``, that writes
the key's ints into ``out`` (length ``4 * K + 8``) and returns how many it wrote; give it an
``ENC_*`` id, one branch in :func:`_encode` (and :func:`_key_last`), and its name in
:data:`edbatch.schedule.compiled.COMPILED_ENCODINGS`. Its Python twin must produce the same
tuple, because FSM tables are looked up by :func:`key_hash` of the tuple (FNV-1a, 64 bit,
identical in Python and here): tables travel as sorted ``int64`` hashes with their actions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled_hash import _hash, key_hash, key_hash_numba
from edbatch.schedule._compiled_keys import (
    CRIT_FEATURES,
    FILL_FEATURES,
    RICH_FEATURES,
    TIE_FEATURES,
    _critical,
    _ratio,
    key_crit,
    key_expert,
    key_fill,
    key_rich,
    key_tie,
)
from edbatch.schedule._compiled_sort import sort_nodes

__all__ = ["ENC_BASE", "ENC_COMPLETE", "ENC_CRIT", "ENC_EXPERT", "ENC_FILL", "ENC_HINTS", "ENC_MAX",
           "ENC_NONE", "ENC_RICH", "ENC_SORTED", "ENC_TIE", "RULE_CRITICAL_PATH",
           "RULE_DYNET_AGENDA", "RULE_ED_BATCH_AGENDA", "RULE_KEY_LAST", "RULE_MAX_FRONTIER",
           "RULE_TYPEWISE_GREEDY", "key_hash", "key_hash_numba", "run_schedule", "start_state"]

RULE_DYNET_AGENDA = 0
RULE_ED_BATCH_AGENDA = 1
RULE_MAX_FRONTIER = 2
RULE_TYPEWISE_GREEDY = 3
RULE_CRITICAL_PATH = 4
#: ED-Batch's fallback: the op named by the last entry of the state key (needs an encoding).
RULE_KEY_LAST = 5

ENC_NONE = -1
ENC_BASE = 0
ENC_SORTED = 1
ENC_MAX = 2
ENC_COMPLETE = 3
ENC_HINTS = 4
ENC_EXPERT = 5
ENC_RICH = 6
ENC_FILL = 7
ENC_CRIT = 8
ENC_TIE = 9
_EXPERT_FEATURES = 6  # entries per ready type of the expert key (envs.encoding)


# ---------------------------------------------------------------------- decision rules
@njit(cache=True)
def _typewise_greedy(k, rlen, tw, batchable):  # type: ignore[no-untyped-def]
    best, best_ratio = -1, -1.0
    for a in range(k):
        if rlen[a] and batchable[a]:
            ratio = _ratio(rlen, tw, a)
            if ratio > best_ratio:
                best, best_ratio = a, ratio
    return best


@njit(cache=True)
def _max_frontier(k, rlen, batchable):  # type: ignore[no-untyped-def]
    best, best_count = -1, 0
    for a in range(k):
        if rlen[a] and batchable[a] and rlen[a] > best_count:
            best, best_count = a, rlen[a]
    return best


@njit(cache=True)
def _rule(rule, k, rlen, tw, maxh, rem, remd, batchable, mean, cplx):  # type: ignore[no-untyped-def]
    if rule == RULE_CRITICAL_PATH:
        return _critical(k, rlen, tw, maxh, batchable)
    if rule == RULE_TYPEWISE_GREEDY:
        return _typewise_greedy(k, rlen, tw, batchable)
    if rule == RULE_MAX_FRONTIER:
        return _max_frontier(k, rlen, batchable)
    best, best_avg = -1, np.inf
    for a in range(k):
        if rlen[a] and batchable[a]:
            if rule == RULE_DYNET_AGENDA:
                avg = mean[a]
                if avg < best_avg or (avg == best_avg and not cplx[a]):
                    best, best_avg = a, avg
            else:  # RULE_ED_BATCH_AGENDA: exact remaining mean (a ready type has rem > 0)
                avg = remd[a] / rem[a]
                if avg < best_avg:
                    best, best_avg = a, avg
    return best


# ---------------------------------------------------------------------- FSM state keys
@njit(cache=True)
def _key_base(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """Ready batchable op types, ascending (``envs.encoding._base``)."""
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            out[n] = a
            n += 1
    return n


@njit(cache=True)
def _key_sorted(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """Ready types by ready count, largest first, ties by smaller id (stable insertion)."""
    n = _key_base(k, rlen, tw, maxh, rem, remd, batchable, out)
    for i in range(1, n):
        x = out[i]
        j = i - 1
        while j >= 0 and rlen[out[j]] < rlen[x]:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = x
    return n


@njit(cache=True)
def _key_max(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``base`` then the type with the most ready nodes (ties: smallest id)."""
    n = _key_base(k, rlen, tw, maxh, rem, remd, batchable, out)
    out[n] = _max_frontier(k, rlen, batchable)
    return n + 1


@njit(cache=True)
def _key_complete(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``2 * a + (|F(a)| >= T(a))`` for each ready type, ascending."""
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            out[n] = 2 * a + (1 if rlen[a] >= tw[a] else 0)
            n += 1
    return n


@njit(cache=True)
def _key_hints(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``base``, ``-1``, the critical-path type, the best ``|F(a)|/T(a)`` type."""
    n = _key_base(k, rlen, tw, maxh, rem, remd, batchable, out)
    out[n] = -1
    out[n + 1] = _critical(k, rlen, tw, maxh, batchable)
    out[n + 2] = _typewise_greedy(k, rlen, tw, batchable)
    return n + 3


@njit(cache=True)
def _encode(enc, k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    if enc == ENC_BASE:
        return _key_base(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_SORTED:
        return _key_sorted(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_MAX:
        return _key_max(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_COMPLETE:
        return _key_complete(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_EXPERT:
        return key_expert(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_RICH:
        return key_rich(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_FILL:
        return key_fill(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_CRIT:
        return key_crit(k, rlen, tw, maxh, rem, remd, batchable, out)
    if enc == ENC_TIE:
        return key_tie(k, rlen, tw, maxh, rem, remd, batchable, out)
    return _key_hints(k, rlen, tw, maxh, rem, remd, batchable, out)


@njit(cache=True)
def _key_last(enc, out, n):  # type: ignore[no-untyped-def]
    """``envs.encoding.fallback_action``: the op named by the key's last entry."""
    x = out[n - 1]
    if enc == ENC_EXPERT:
        return x // _EXPERT_FEATURES
    if enc == ENC_RICH:
        return x // RICH_FEATURES
    if enc == ENC_FILL:
        return x // FILL_FEATURES
    if enc == ENC_CRIT:
        return x // CRIT_FEATURES
    if enc == ENC_TIE:
        return x // TIE_FEATURES
    return x // 2 if enc == ENC_COMPLETE else x


# ---------------------------------------------------------------------- the loop
@njit(cache=True)
def _release(v, op, batchable, ready, start, rlen, maxh, height, forced, nf):  # type: ignore[no-untyped-def]
    a = op[v]
    if batchable[a]:
        ready[start[a] + rlen[a]] = v
        rlen[a] += 1
        if len(height) and height[v] > maxh[a]:
            maxh[a] = height[v]
        return nf
    forced[nf] = v
    return nf + 1


@njit(cache=True)
def _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh, height,
            forced, nf):  # type: ignore[no-untyped-def]
    """Kahn's step: decrement the users of ``batch``; release those that reach zero."""
    for v in batch:
        for i in range(uptr[v], uptr[v + 1]):
            u = uids[i]
            pending[u] -= 1
            if pending[u] == 0:
                nf = _release(u, op, batchable, ready, start, rlen, maxh, height, forced, nf)
    return nf


@njit(cache=True)
def _typewise_freed(batch, tw_ptr, tw_ids, tw_pending):  # type: ignore[no-untyped-def]
    """Retire ``batch`` from the type-wise graph; the number of nodes that join ``T(a)``."""
    freed = 0
    for v in batch:
        for i in range(tw_ptr[v], tw_ptr[v + 1]):
            u = tw_ids[i]
            tw_pending[u] -= 1
            if tw_pending[u] == 0:
                freed += 1
    return freed


@njit(cache=True)
def _lookup(table_hash, table_act, key, m, k, rlen, batchable):  # type: ignore[no-untyped-def]
    """The table's op for the key in ``key[:m]`` if it is ready, else ``-1``."""
    if len(table_hash) == 0:
        return -1
    h = _hash(key, m)
    j = np.searchsorted(table_hash, h)
    if j < len(table_hash) and table_hash[j] == h:
        b = table_act[j]
        if 0 <= b < k and rlen[b] and batchable[b]:
            return b
    return -1


@njit(cache=True)
def _typewise_start(op, tw_pred, batchable, k, track_tw):  # type: ignore[no-untyped-def]
    """``T(a)`` before the first step: batchable nodes without type-wise predecessors."""
    tw = np.zeros(k, np.int64)
    if track_tw:
        for v in range(len(op)):
            if tw_pred[v] == 0 and batchable[op[v]]:
                tw[op[v]] += 1
    return tw


@njit(cache=True)
def _decide(rule, enc, table_hash, table_act, key, k, rlen, tw, maxh, rem, remd, batchable,
            mean, cplx):  # type: ignore[no-untyped-def]
    """The next op type: the FSM table's if it knows the state, else the rule's.

    Returns ``(op id, 1 if the table answered else 0)``.
    """
    if enc != ENC_NONE:
        m = _encode(enc, k, rlen, tw, maxh, rem, remd, batchable, key)
        a = _lookup(table_hash, table_act, key, m, k, rlen, batchable)
        if a >= 0:
            return a, 1
        if rule == RULE_KEY_LAST:
            return _key_last(enc, key, m), 0
    return _rule(rule, k, rlen, tw, maxh, rem, remd, batchable, mean, cplx), 0


@njit(cache=True)
def start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr):  # type: ignore[no-untyped-def]
    """The state before the first step, the sources released: ``(start, rem, remd, ready,
    rlen, maxh, forced, pending, track_tw, tw, tw_pending, nf)`` (see the module doc)."""
    n, k = len(op), len(batchable)
    start = np.zeros(k + 1, np.int64)
    rem = np.zeros(k, np.int64)
    remd = np.zeros(k, np.float64)
    for v in range(n):
        rem[op[v]] += 1
        remd[op[v]] += depth[v]
    for a in range(k):
        start[a + 1] = start[a] + rem[a]
    ready = np.empty(n, np.int64)
    rlen = np.zeros(k, np.int64)
    maxh = np.full(k, -1, np.int64)
    forced = np.empty(n, np.int64)
    pending = arity.copy()
    track_tw = len(tw_ptr) > 0
    tw = _typewise_start(op, tw_pred, batchable, k, track_tw)
    tw_pending = tw_pred.astype(np.int64)
    nf = np.int64(0)  # not Literal[int](0): one compiled _release
    for v in range(n):
        if arity[v] == 0:
            nf = _release(v, op, batchable, ready, start, rlen, maxh, height, forced, nf)
    return (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
            nf)


@njit(cache=True)
def run_schedule(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids,
                 mean, cplx, rule, enc, table_hash, table_act):  # type: ignore[no-untyped-def]
    """Schedule one graph to the end; see the module docstring for the state.

    Args:
        op, depth, arity: ``int64[N]`` per node; ``uptr``/``uids``: users in CSR form.
        batchable: ``bool[K]``; ``height``: ``int64[N]`` critical-path heights (or empty).
        tw_pred, tw_ptr, tw_ids: the type-wise graph (``tw_ptr`` empty: ``T(a)`` untracked).
        mean, cplx: DyNet's static mean depth per type and its complex-op flags.
        rule: the decision rule (``RULE_*``), the FSM's fallback when a table is given.
        enc: ``ENC_*`` of the FSM key (``ENC_NONE``: no table).
        table_hash, table_act: the FSM table as sorted key hashes and their op ids.

    Returns:
        ``(batch_op, batch_forced, batch_ptr, nodes, hits, misses)``: batch ``i`` runs
        ``nodes[batch_ptr[i]:batch_ptr[i + 1]]`` (ascending).
    """
    n, k = len(op), len(batchable)
    (start, rem, remd, ready, rlen, maxh, forced, pending, track_tw, tw, tw_pending,
     nf) = start_state(op, depth, arity, batchable, height, tw_pred, tw_ptr)
    key = np.empty(4 * k + 8, np.int64)
    batch_op = np.empty(n, np.int64)
    batch_forced = np.zeros(n, np.bool_)
    batch_ptr = np.zeros(n + 1, np.int64)
    nodes = np.empty(n, np.int64)
    mark = np.zeros(n, np.bool_)  # sort_nodes' bitmap
    nb, done, hits, misses = 0, 0, 0, 0
    while True:
        # forced steps: the most recently released unbatchable node first
        while nf > 0:
            nf -= 1
            v = forced[nf]
            a = op[v]
            nodes[done] = v
            batch = nodes[done:done + 1]  # (a view: nodes[:done + 1] is final)
            batch_op[nb], batch_forced[nb] = a, True
            nb, done = nb + 1, done + 1
            batch_ptr[nb] = done
            rem[a] -= 1
            remd[a] -= depth[v]
            nf = _retire(batch, uptr, uids, pending, op, batchable, ready, start, rlen, maxh,
                         height, forced, nf)
        if done == n:
            break
        a, hit = _decide(rule, enc, table_hash, table_act, key, k, rlen, tw, maxh, rem, remd,
                         batchable, mean, cplx)
        hits += hit
        misses += 1 - hit if enc != ENC_NONE else 0
        # pop every ready node of type a as one batch
        c = rlen[a]
        batch = nodes[done:done + c]  # no per-batch allocation: sorted in place, a view
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
    return batch_op[:nb], batch_forced[:nb], batch_ptr[:nb + 1], nodes, hits, misses
