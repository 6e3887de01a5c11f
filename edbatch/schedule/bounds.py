"""Static analyses behind the lower bound and the type-wise frontier count.

See docs/architecture.md 3.2.

* :func:`type_chain_lengths` gives, per node and op type, the largest number of nodes of that
  type on any path *starting* at the node. Because the unexecuted part of a graph is closed
  under users, the longest same-type chain among unexecuted nodes starts at a ready node, so
  the bound of any frontier is one ``max`` over the ready rows (:func:`remaining_lower_bound`).
* :func:`lower_bound` is ED-Batch's LB: unbatchable nodes + sum over types of the longest
  same-type chain.
* :func:`typewise_graph` gives each node's *type-wise predecessors* (nearest ancestors of its
  own type), computed with word-parallel bitsets level by level.
"""

from __future__ import annotations

import weakref

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.graph.merge import merge_provenance

__all__ = ["heights", "lower_bound", "remaining_lower_bound", "type_chain_lengths",
           "typewise_graph"]


def _segments(ptr: NDArray[np.int64], nodes: NDArray[np.int64]) -> tuple[NDArray, NDArray]:  # type: ignore[type-arg]
    """Flat indices of the CSR rows ``nodes`` and each row's length."""
    starts = ptr[nodes]
    lens = ptr[nodes + 1] - starts
    total = int(lens.sum())
    idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total)
    return idx, lens


_CHAINS: weakref.WeakKeyDictionary[Graph, NDArray[np.int32]] = weakref.WeakKeyDictionary()
_TYPEWISE: weakref.WeakKeyDictionary[Graph, tuple[NDArray, NDArray, NDArray]] = (  # type: ignore[type-arg]
    weakref.WeakKeyDictionary())


def type_chain_lengths(graph: Graph) -> NDArray[np.int32]:
    """``int32[N, K]``: max number of type-``k`` nodes on a path starting at each node.

    Cached per graph object (graphs are immutable); the result is read-only.
    """
    cached = _CHAINS.get(graph)
    if cached is None:
        cached = _CHAINS[graph] = _type_chain_lengths(graph)
        cached.setflags(write=False)
    return cached


def longest_from(graph: Graph, values: NDArray) -> NDArray:  # type: ignore[type-arg]
    """``values[v] += max(values[u] for u in users(v))``, from the sinks up, in place (one
    pass per topological level): with each node's own weight in ``values`` (a row per node,
    any number of columns), the largest total weight over the paths starting at each node.
    Returns ``values``."""
    order, lptr = graph.levels
    uptr, uids = graph.users
    for d in range(len(lptr) - 2, -1, -1):
        nodes = order[lptr[d]:lptr[d + 1]]
        nodes = nodes[uptr[nodes + 1] > uptr[nodes]]
        if len(nodes):
            idx, lens = _segments(uptr, nodes)
            values[nodes] += np.maximum.reduceat(values[uids[idx]], np.cumsum(lens) - lens,
                                                 axis=0)
    return values


def _type_chain_lengths(graph: Graph) -> NDArray[np.int32]:
    n, k = graph.num_nodes, len(graph.vocab)
    down = np.zeros((n, k), dtype=np.int32)
    if n == 0:
        return down
    down[np.arange(n), graph.op_ids] = 1
    return longest_from(graph, down)


_HEIGHTS: weakref.WeakKeyDictionary[Graph, NDArray[np.int64]] = weakref.WeakKeyDictionary()


def heights(graph: Graph) -> NDArray[np.int64]:
    """``int64[N]``: number of nodes on the longest path from each node to a sink.

    The critical-path length of the unexecuted graph is the largest height among the ready
    nodes. Cached per graph; read-only.
    """
    cached = _HEIGHTS.get(graph)
    if cached is None:
        h = longest_from(graph, np.ones(graph.num_nodes, dtype=np.int64))
        h.setflags(write=False)
        cached = _HEIGHTS[graph] = h
    return cached


_HEIGHT_LISTS: weakref.WeakKeyDictionary[Graph, list[int]] = weakref.WeakKeyDictionary()


def height_list(graph: Graph) -> list[int]:
    """:func:`heights` as one shared Python list per graph (do not modify it).

    Policies index it per node, and :meth:`FrontierView.max_over_ready` keeps its running
    maxima per values list, so every user of a graph's heights should pass this one.
    """
    cached = _HEIGHT_LISTS.get(graph)
    if cached is None:
        cached = _HEIGHT_LISTS[graph] = heights(graph).tolist()
    return cached


def lower_bound(graph: Graph, down: NDArray[np.int32] | None = None) -> int:
    """ED-Batch's LB: number of unbatchable nodes + sum over types of the longest chain."""
    if graph.num_nodes == 0:
        return 0
    down = type_chain_lengths(graph) if down is None else down
    batchable = graph.vocab.batchable
    return int((~graph.batchable_node).sum()) + int(down[:, batchable].max(axis=0).sum())


def remaining_lower_bound(down: NDArray[np.int32], batchable: NDArray[np.bool_],
                          ready_nodes: NDArray[np.int64], unbatchable_left: int) -> int:
    """LB of the unexecuted part of a graph, given all ready nodes (any type)."""
    if not len(ready_nodes):
        return unbatchable_left
    return unbatchable_left + int(down[ready_nodes][:, batchable].max(axis=0).sum())


_CHUNK_BITS = 4096
#: Graphs up to this many nodes use Python big-int bitsets (fast for small graphs).
_SMALL_GRAPH = 20_000


#: Above this many nodes, bitsets over the whole graph cost more than a pass per instance.
_SPLIT_ABOVE = 6000
_TypewiseArrays = tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.int32]]


def typewise_graph(graph: Graph) -> _TypewiseArrays:
    """Type-wise predecessor counts and successor lists (cached per graph, read-only).

    ``u`` is a type-wise predecessor of ``v`` when both have the same op type and some path
    from ``u`` to ``v`` has no other node of that type. A node is in the type-wise frontier
    when all its type-wise predecessors have run, i.e. it has no unexecuted ancestor of its
    type.

    Returns:
        ``(pred_count int32[N], succ_ptr int64[N+1], succ_ids int32[T])``.
    """
    cached = _TYPEWISE.get(graph)
    if cached is None:
        merged = _typewise_from_parts(graph)
        if merged is None:
            merged = _typewise_through_dedupe(graph)
        if merged is None and graph.num_nodes > _SPLIT_ABOVE:
            merged = _typewise_by_instance(graph)
        if merged is not None:
            cached = merged
        elif graph.num_nodes <= _SMALL_GRAPH:
            cached = _typewise_small(graph)
        else:
            cached = _typewise_bitset(graph)
        _TYPEWISE[graph] = cached
        for a in cached:
            a.setflags(write=False)
    return cached  # type: ignore[return-value]


def _typewise_through_dedupe(graph: Graph) -> _TypewiseArrays | None:
    """The original graph's type-wise graph, restricted to the nodes ``dedupe_leaves`` kept.

    The dropped nodes are operand-free nodes of operand-free types, which have no type-wise
    predecessor or successor, so only a renumbering is needed.
    """
    from edbatch.graph.cse import dedupe_origin

    origin = dedupe_origin(graph)
    if origin is None:
        return None
    original, keep, new_id = origin
    pred, ptr, ids = typewise_graph(original)
    counts = np.diff(ptr)[keep]
    rows = np.repeat(keep, np.diff(ptr))
    succ_ptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=succ_ptr[1:])
    return (pred[keep].astype(np.int32), succ_ptr,
            new_id[ids[rows]].astype(np.int32))


def _typewise_from_parts(graph: Graph) -> _TypewiseArrays | None:
    """Assemble a merged graph's type-wise graph from its (cached) parts.

    Parts are disjoint, so type-wise relations stay inside a part; the one reduce node
    added by the merge only matters if its op type also occurs inside the parts.
    """
    prov = merge_provenance(graph)
    if prov is None:
        return None
    if prov.reduce_node is not None:
        op = int(graph.op_ids[prov.reduce_node])
        if graph.vocab[op].batchable and any(p.type_counts[op] for p in prov.parts):
            return None
    counts, ptrs, ids = [], [np.zeros(1, np.int64)], []
    edge_base = 0
    for part, off in zip(prov.parts, prov.node_offsets):
        pc, sp, si = typewise_graph(part)
        counts.append(pc)
        ptrs.append(sp[1:] + edge_base)
        ids.append(si + np.int32(off))
        edge_base += len(si)
    if prov.reduce_node is not None:
        counts.append(np.zeros(1, np.int32))
        ptrs.append(np.array([edge_base], np.int64))
    return (np.concatenate(counts).astype(np.int32), np.concatenate(ptrs).astype(np.int64),
            np.concatenate(ids).astype(np.int32))


def _typewise_by_instance(graph: Graph) -> _TypewiseArrays | None:
    """:func:`_typewise_small` one instance at a time (bitsets as wide as an instance).

    Two kinds of node have no type-wise relation and are skipped: *inert* nodes, operand-free
    nodes of a type whose nodes are all operand-free (a leaf shared by several instances after
    :func:`~edbatch.graph.dedupe_leaves`), and unused nodes of a type that occurs once (the
    mini-batch's ``loss_sum``). Applies when, apart from those, the instances are id ranges
    that do not interleave and only read their own nodes; returns ``None`` otherwise.
    """
    n = graph.num_nodes
    if n == 0 or graph.num_instances < 2:
        return None
    inst = graph.instance.astype(np.int64)
    inert = graph.operand_free_types[graph.op_ids]
    consumer = np.repeat(np.arange(n, dtype=np.int64), graph.arity)
    producer = graph.operand_ids.astype(np.int64)
    crossing = (inst[producer] != inst[consumer]) & ~inert[producer]
    cross = np.unique(consumer[crossing])
    used = np.zeros(n, dtype=bool)
    used[producer] = True
    if len(cross) and (np.any(graph.type_counts[graph.op_ids[cross]] != 1)
                       or np.any(used[cross])):
        return None
    skip = inert.copy()
    skip[cross] = True
    ids = np.flatnonzero(~skip)
    own = inst[ids]
    if len(ids) == 0 or np.any(np.diff(own) < 0):
        return None
    bounds = np.flatnonzero(np.diff(own)) + 1
    first = ids[np.concatenate([[0], bounds])].tolist()
    last = ids[np.concatenate([bounds - 1, [len(ids) - 1]])].tolist()
    op = graph.op_ids.tolist()
    ptr = graph.operand_ptr.tolist()
    args = graph.operand_ids.tolist()
    active = (~skip).tolist()
    src: list[int] = []
    dst: list[int] = []
    contrib = [0] * n  # inert and skipped nodes pass nothing on
    for lo, hi in zip(first, last, strict=True):
        _typewise_block(op, ptr, args, active, contrib, lo, hi + 1, src, dst)
    return _csr(n, np.asarray(src, np.int64), np.asarray(dst, np.int64))


def _typewise_small(graph: Graph) -> _TypewiseArrays:
    """Sequential version with Python ints as bitsets (one bit per node)."""
    n = graph.num_nodes
    src: list[int] = []
    dst: list[int] = []
    _typewise_block(graph.op_ids.tolist(), graph.operand_ptr.tolist(),
                    graph.operand_ids.tolist(), None, [0] * n, 0, n, src, dst)
    return _csr(n, np.asarray(src, np.int64), np.asarray(dst, np.int64))


def _typewise_block(op: list[int], ptr: list[int], args: list[int], active: list[bool] | None,
                    contrib: list[int], lo: int, hi: int, src: list[int],
                    dst: list[int]) -> None:
    """Type-wise edges among nodes ``lo..hi-1`` (bit ``v - lo`` stands for node ``v``).

    ``contrib[u]`` is what ``u`` passes to its users: its own bit plus its ancestors of other
    types; a node's type-wise predecessors are the bits of its own type among its operands'
    contributions. Nodes with ``active[v]`` false are skipped (they pass nothing on); the
    edges are appended to ``src`` / ``dst``.
    """
    typemask: dict[int, int] = {}
    for v in range(lo, hi):
        if active is None or active[v]:
            typemask[op[v]] = typemask.get(op[v], 0) | (1 << (v - lo))
    for v in range(lo, hi):
        if active is not None and not active[v]:
            continue
        acc = 0
        for u in args[ptr[v]:ptr[v + 1]]:
            acc |= contrib[u]
        mask = typemask[op[v]]
        contrib[v] = (acc & ~mask) | (1 << (v - lo))
        preds = acc & mask
        while preds:
            low = preds & -preds
            src.append(lo + low.bit_length() - 1)
            dst.append(v)
            preds ^= low


def _csr(n: int, src: NDArray[np.int64], dst: NDArray[np.int64]) -> _TypewiseArrays:
    pred_count = np.bincount(dst, minlength=n).astype(np.int32)
    perm = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    return pred_count, succ_ptr, dst[perm].astype(np.int32)


def _typewise_bitset(graph: Graph) -> _TypewiseArrays:
    n, k = graph.num_nodes, len(graph.vocab)
    op = graph.op_ids.astype(np.int64)
    order, lptr = graph.levels
    optr = graph.operand_ptr
    level_edges = []
    for d in range(1, len(lptr) - 1):
        nodes = order[lptr[d]:lptr[d + 1]]
        idx, lens = _segments(optr, nodes)
        level_edges.append((nodes, graph.operand_ids[idx].astype(np.int64),
                            np.cumsum(lens) - lens))
    src_parts, dst_parts = [], []
    for c0 in range(0, n, _CHUNK_BITS):
        c1 = min(n, c0 + _CHUNK_BITS)
        words = (c1 - c0 + 63) // 64
        ids = np.arange(c0, c1)
        word_of = (ids - c0) >> 6
        bit_of = np.left_shift(np.uint64(1), ((ids - c0) & 63).astype(np.uint64))
        typemask = np.zeros((k, words), dtype=np.uint64)
        np.bitwise_or.at(typemask, (op[ids], word_of), bit_of)
        notmask = ~typemask
        near = np.zeros((n, words), dtype=np.uint64)
        for nodes, src, starts in level_edges:
            if nodes.max() < c0:
                continue
            contrib = near[src] & notmask[op[src]]
            inside = np.flatnonzero((src >= c0) & (src < c1))
            if len(inside):
                s = src[inside] - c0
                contrib[inside, s >> 6] |= np.left_shift(np.uint64(1), (s & 63).astype(np.uint64))
            near[nodes] = np.bitwise_or.reduceat(contrib, starts, axis=0)
        pred = near & typemask[op]
        rows, cols = np.nonzero(pred)
        if not len(rows):
            continue
        bits = np.unpackbits(pred[rows, cols].view(np.uint8).reshape(-1, 8), axis=1,
                             bitorder="little")
        i, b = np.nonzero(bits)
        src_parts.append(c0 + cols[i] * 64 + b)
        dst_parts.append(rows[i])
    src = np.concatenate(src_parts) if src_parts else np.zeros(0, np.int64)
    dst = np.concatenate(dst_parts) if dst_parts else np.zeros(0, np.int64)
    return _csr(n, src, dst)
