"""Compiled passes over a segment's nodes and operands (numba, each one loop where numpy
takes several passes and temporaries): the expansion of bulk blocks into operand ids
(:func:`block_operands`, for :func:`~edbatch.api._bulk.operand_array`) and the layout of a
typed segment (:func:`type_scan`, :func:`type_order`, :func:`batch_rows`, :func:`read_layout`, for
:mod:`edbatch.api._typed`) and a round's renumbering (:func:`localise_reads`, for
:mod:`edbatch.api._programs`). Compiled on first call, cached on disk."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["batch_rows", "block_operands", "localise_reads", "read_layout", "type_edges",
           "type_order", "type_scan", "typed_layout"]


@njit(cache=True, nogil=True)
def block_operands(b, firsts, off0):  # type: ignore[no-untyped-def]
    """The operands of blocks ``b`` (rows ``(operand position, first node, n, offset into
    the first-node list)``) node-major: node ``i`` of a block reads ``firsts[j] + i`` in
    slot ``j`` (``firsts``: the block first-node list from offset ``off0``); and per block
    its operand count."""
    nb = b.shape[0]
    cnt = np.empty(nb, np.int64)
    total = 0
    for r in range(nb):
        nxt = b[r + 1, 3] - off0 if r + 1 < nb else len(firsts)
        cnt[r] = b[r, 2] * (nxt - (b[r, 3] - off0))
        total += cnt[r]
    out = np.empty(total, np.int64)
    p = 0
    for r in range(nb):
        off = b[r, 3] - off0
        s = b[r + 1, 3] - off0 - off if r + 1 < nb else len(firsts) - off
        for i in range(b[r, 2]):
            for j in range(s):
                out[p] = firsts[off + j] + i
                p += 1
    return out, cnt


@njit(cache=True, nogil=True)
def read_layout(operands, ptr, batch_of, row_of, sizes):  # type: ignore[no-untyped-def]
    """For :func:`~edbatch.api._typed._reads`: the producers' ``(batch, row)`` of every
    operand laid out slot by slot per consumer batch (``pb``, ``lr``: batch ``b``'s slot
    ``j`` rows at ``e0[b] + j * sizes[b]``, a variadic node's operands in order), and
    per batch its first position ``e0`` and operand count ``edges`` (``sizes``: rows per
    batch, as :func:`batch_rows` gives them)."""
    n, k = len(batch_of), len(sizes)
    edges = np.zeros(k, np.int64)
    for v in range(n):
        edges[batch_of[v]] += ptr[v + 1] - ptr[v]
    e0 = np.empty(k, np.int64)
    at = 0
    for b in range(k):
        e0[b] = at
        at += edges[b]
    m = len(operands)
    pb = np.empty(m, np.int64)
    lr = np.empty(m, np.int64)
    for v in range(n):
        b = batch_of[v]
        base = e0[b] + row_of[v]
        for e in range(ptr[v], ptr[v + 1]):
            pos = base + (e - ptr[v]) * sizes[b]
            u = operands[e]
            pb[pos] = batch_of[u]
            lr[pos] = row_of[u]
    return pb, lr, e0, edges


@njit(cache=True, nogil=True)
def type_scan(op_ids):  # type: ignore[no-untyped-def]
    """For :func:`~edbatch.api._typed.typed_program`: ``(types, counts, t_node, first)``,
    the op ids present (ascending), their node counts, each node's index among them and
    each type's first node, in two passes over ``op_ids`` (where ``bincount``,
    ``flatnonzero``, a lookup table and a reversed scatter took six)."""
    n = len(op_ids)
    top = 0
    for v in range(n):
        if op_ids[v] > top:
            top = op_ids[v]
    present = np.zeros(top + 1, np.int64)
    head = np.empty(top + 1, np.int64)
    for v in range(n):
        o = op_ids[v]
        if present[o] == 0:
            head[o] = v
        present[o] += 1
    lut = np.empty(top + 1, np.int64)
    k = 0
    for o in range(top + 1):
        if present[o]:
            lut[o] = k
            k += 1
    types = np.empty(k, np.int64)
    counts = np.empty(k, np.int64)
    first = np.empty(k, np.int64)
    for o in range(top + 1):
        if present[o]:
            t = lut[o]
            types[t], counts[t], first[t] = o, present[o], head[o]
    t_node = np.empty(n, np.int64)
    for v in range(n):
        t_node[v] = lut[op_ids[v]]
    return types, counts, t_node, first


@njit(cache=True, nogil=True)
def type_edges(t_node, ptr, operands, k):  # type: ignore[no-untyped-def]
    """``int64[k * k]``: per (producer type, consumer type) the number of operand edges
    (types: ``t_node``, ``k`` of them), for :func:`~edbatch.api._typed._type_order`."""
    edge = np.zeros(k * k, np.int64)
    for v in range(len(t_node)):
        t = t_node[v]
        for e in range(ptr[v], ptr[v + 1]):
            edge[t_node[operands[e]] * k + t] += 1
    return edge


@njit(cache=True, nogil=True)
def type_order(t_node, ptr, operands, first, k):  # type: ignore[no-untyped-def]
    """:func:`~edbatch.api._typed._type_order` (its Python twin, the oracle) compiled: each
    of the ``k`` op types' batch index, a topological order of the types (of the ready
    ones, the one whose first node ``first[t]`` comes first), or an empty array where a
    node reads one of its own type or the types form a cycle."""
    edge = type_edges(t_node, ptr, operands, k)
    indeg = np.zeros(k, np.int64)
    for a in range(k):
        if edge[a * k + a]:
            return np.empty(0, np.int64)
        for b in range(k):
            if edge[a * k + b]:
                indeg[b] += 1
    rank = np.full(k, -1, np.int64)
    for at in range(k):
        best = -1
        for t in range(k):
            if rank[t] < 0 and indeg[t] == 0 and (best < 0 or first[t] < first[best]):
                best = t
        if best < 0:
            return np.empty(0, np.int64)
        rank[best] = at
        for t in range(k):
            if edge[best * k + t]:
                indeg[t] -= 1
    return rank


@njit(cache=True, nogil=True)
def batch_rows(batch_of, k):  # type: ignore[no-untyped-def]
    """``(sizes, order, row_of)`` of nodes in batches ``batch_of`` (``k`` batches): rows per
    batch, the nodes batch by batch (in node order within a batch) and each node's row."""
    n = len(batch_of)
    sizes = np.zeros(k, np.int64)
    row_of = np.empty(n, np.int64)
    for v in range(n):
        b = batch_of[v]
        row_of[v] = sizes[b]
        sizes[b] += 1
    starts = np.empty(k, np.int64)
    at = 0
    for b in range(k):
        starts[b] = at
        at += sizes[b]
    order = np.empty(n, np.int64)
    for v in range(n):
        order[starts[batch_of[v]] + row_of[v]] = v
    return sizes, order, row_of


@njit(cache=True, nogil=True)
def read_runs(pb, lr, lo, hi, k):  # type: ignore[no-untyped-def]
    """For :func:`~edbatch.api._typed._reads`: per read ``r`` (positions ``lo[r]..hi[r]-1``
    of the layout ``pb``, ``lr`` of :func:`read_layout`) whether its rows are one batch's
    consecutive rows (``whole``, a slice) and, where not, which of the ``k`` producer
    batches it reads (``hit[r]``)."""
    reads = len(lo)
    whole = np.ones(reads, np.bool_)
    hit = np.zeros((reads, k), np.bool_)
    for r in range(reads):
        for e in range(lo[r] + 1, hi[r]):
            if pb[e] != pb[e - 1] or lr[e] != lr[e - 1] + 1:
                whole[r] = False
                break
        if not whole[r]:
            for e in range(lo[r], hi[r]):
                hit[r, pb[e]] = True
    return whole, hit


@njit(cache=True, nogil=True)
def _below(a, start, out, c):  # type: ignore[no-untyped-def]
    """Append the entries of ``a`` below ``start`` to ``out`` from position ``c``; the new
    count."""
    for i in range(len(a)):
        if a[i] < start:
            out[c] = a[i]
            c += 1
    return c


@njit(cache=True, nogil=True)
def _renumber(a, start, where, r, c):  # type: ignore[no-untyped-def]
    """``a`` renumbered: an entry below ``start`` as ``where[r]`` (``r`` counting up), any
    other ``v`` as ``v + c - start``; and the next ``r``."""
    out = np.empty(len(a), np.int64)
    for i in range(len(a)):
        if a[i] < start:
            out[i] = where[r]
            r += 1
        else:
            out[i] = a[i] + c - start
    return out, r


@njit(cache=True, nogil=True)
def _localise_dense(flat, losses, start, share_at, old, lo, where):  # type: ignore[no-untyped-def]
    """:func:`localise_reads` where the earlier nodes read lie in ``lo..start-1`` (at most
    4x as many as reads): the distinct ones marked in one pass over the range, no sort."""
    c = len(old)
    span = start - lo
    lut = np.full(span, -1, np.int64)
    for i in range(c):
        lut[old[i] - lo] = 0
    d = 0
    for j in range(span):
        if lut[j] == 0:
            lut[j] = d
            d += 1
    if d * share_at <= c:
        distinct = np.empty(d, np.int64)
        for j in range(span):
            if lut[j] >= 0:
                distinct[lut[j]] = j + lo
        for i in range(c):
            where[i] = lut[old[i] - lo]
        old, c = distinct, d
    local, r = _renumber(flat, start, where, 0, c)
    loss_local, _ = _renumber(losses, start, where, r, c)
    return old, local, loss_local


@njit(cache=True, nogil=True)
def localise_reads(flat, losses, start, share_at):  # type: ignore[no-untyped-def]
    """:func:`edbatch.api._rounds.localise` (its Python twin, the oracle) in one compiled
    pass: ``(old, local, loss_local)``, the earlier nodes (ids below ``start``) read by
    operands ``flat`` and loss terms ``losses`` (one per read in order, or each distinct one
    once, sorted, when there are ``share_at`` reads or more per distinct node) and the
    operands and loss terms renumbered for the segment."""
    old = np.empty(len(flat) + len(losses), np.int64)
    c = _below(losses, start, old, _below(flat, start, old, 0))
    old = old[:c]
    where = np.arange(c)
    if c >= share_at * 2 and c > 0:
        lo = old.min()
        if start - lo <= 4 * c:  # a dense range (a layer's token rows): marks, no sort
            return _localise_dense(flat, losses, start, share_at, old, lo, where)
        s = np.sort(old)
        first = np.empty(c, np.bool_)
        first[0] = True
        first[1:] = s[1:] != s[:-1]
        if int(first.sum()) * share_at <= c:
            distinct = s[first]
            where = np.searchsorted(distinct, old)
            old = distinct
            c = len(distinct)
    local, r = _renumber(flat, start, where, 0, c)
    loss_local, _ = _renumber(losses, start, where, r, c)
    return old, local, loss_local


@njit(cache=True, nogil=True)
def typed_layout(op_ids, ptr, operands):  # type: ignore[no-untyped-def]
    """For :func:`~edbatch.api._typed.typed_program`, one call where it made four and the
    numpy between them: :func:`type_scan`'s ``(types, counts)``, :func:`type_order`'s
    ``rank`` (empty where the segment does not qualify, or has ``2**15`` types or more,
    which ``typed_program`` refuses: then nothing more is made) and,
    where it qualifies, each batch's op id ``type_of``, each node's batch ``batch_of``,
    :func:`batch_rows`' ``(sizes, order, row_of)`` and ``order`` as ``int32``."""
    types, counts, t_node, first = type_scan(op_ids)
    k = len(types)
    none = np.empty(0, np.int64)
    rank = type_order(t_node, ptr, operands, first, k) if k < 1 << 15 else none
    if len(rank) == 0:
        return types, counts, rank, none, none, none, none, none, np.empty(0, np.int32)
    type_of = np.empty(k, np.int64)
    for t in range(k):
        type_of[rank[t]] = types[t]
    n = len(op_ids)
    batch_of = np.empty(n, np.int64)
    for v in range(n):
        batch_of[v] = rank[t_node[v]]
    sizes, order, row_of = batch_rows(batch_of, k)
    order32 = order.astype(np.int32)
    return types, counts, rank, type_of, batch_of, sizes, order, row_of, order32
