"""Successor chains with block constraints: the search behind ``plan_memory("planned")``.

A layout is a sequence of nodes per arena; a constraint "these nodes are consecutive, in this
order" is a set of successor edges. :class:`ChainPlanner` adds the edges of one constraint at
a time and keeps them only if the edge set is still realisable as a layout in which every
batch is one block (see :mod:`edbatch.memory.planner` for the rules and the passes). Every
change goes through an undo log, so a constraint or a trial order is rolled back in time
proportional to its own size.

Chains are kept in a union-find (by size, no path compression, so that it can be undone)
whose ``rel`` field stores each node's offset from its union-find parent: the position of a
node in its chain is the sum along its path, ``O(log N)``. That gives the block test ("a batch
entered and left inside one chain lies completely between the two") in ``O(log N)``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.schedule.schedule import Schedule

__all__ = ["ChainPlanner"]

# Indices of the undo-able arrays of ChainPlanner (see ChainPlanner.arrays).
_NXT, _PRV, _PARENT, _WEIGHT, _HEAD, _TAIL, _ENTER, _EXIT, _BPARENT, _BWEIGHT, _REL = range(11)


class ChainPlanner:
    """Successor chains over nodes with block constraints and an undo log (see module doc)."""

    def __init__(self, graph: Graph, schedule: Schedule, defer: bool, *,
                 prune: bool = True) -> None:
        self.graph, self.schedule, self.prune = graph, schedule, prune
        n, nb = graph.num_nodes, len(schedule.batches)
        self.batch: list[int] = schedule.step_of(n).tolist()
        self.size = [len(b) for b in schedule.batches]
        self.size_first = [int(b.node_ids[0]) for b in schedule.batches]
        self.nxt, self.prv = [-1] * n, [-1] * n
        self.parent, self.weight = list(range(n)), [1] * n
        self.head, self.tail = list(range(n)), list(range(n))
        self.rel = [0] * n  # position relative to the union-find parent (root: in chain)
        self.enter, self.exit = [-1] * nb, [-1] * nb
        self.bparent, self.bweight = list(range(nb)), [1] * nb
        # Undo log, flat ints (array index, position, old value): tuples holding lists
        # would be tracked by the garbage collector and make every step slow.
        self.log: list[int] = []
        self.arrays = (self.nxt, self.prv, self.parent, self.weight, self.head, self.tail,
                       self.enter, self.exit, self.bparent, self.bweight, self.rel)  # _NXT...
        self.order: list[list[int] | None] = [None] * nb
        ptr, ids = graph.operand_ptr.tolist(), graph.operand_ids.tolist()
        self.operands = [ids[ptr[v]:ptr[v + 1]] for v in range(n)]
        self.deferrable = self._deferrable() if defer else [False] * nb

    # ---------------------------------------------------------------- undo-able primitives
    def _set(self, arr: int, i: int, value: int) -> None:
        a, log = self.arrays[arr], self.log
        log.append(arr)
        log.append(i)
        log.append(a[i])
        a[i] = value

    def _rollback(self, mark: int) -> None:
        log, arrays = self.log, self.arrays
        for j in range(len(log) - 3, mark - 1, -3):
            arrays[log[j]][log[j + 1]] = log[j + 2]
        del log[mark:]

    @staticmethod
    def _find(parent: list[int], x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    def _union(self, which: int, a: int, b: int) -> int:
        weight = self.arrays[which + 1]
        if weight[a] < weight[b]:
            a, b = b, a
        self._set(which, b, a)
        self._set(which + 1, a, weight[a] + weight[b])
        return a

    def _pos(self, v: int) -> tuple[int, int]:
        """(root, position of ``v`` in its chain): ``rel`` sums along the union-find path."""
        parent, rel = self.parent, self.rel
        p = rel[v]
        while parent[v] != v:
            v = parent[v]
            p += rel[v]
        return v, p

    def _join(self, ru: int, rv: int) -> int:
        """Union the chains rooted at ``ru`` (first) and ``rv`` (second); keep positions."""
        weight, rel, parent, length = self.weight, self.rel, self.parent, self.weight[ru]
        if weight[ru] >= weight[rv]:
            r, child, new_rel = ru, rv, rel[rv] + length - rel[ru]
            self.log.extend((_REL, rv, rel[rv], _PARENT, rv, rv, _WEIGHT, r, weight[r]))
        else:
            r, child, new_rel = rv, ru, rel[ru] - rel[rv] - length
            self.log.extend((_REL, rv, rel[rv], _REL, ru, rel[ru], _PARENT, ru, ru,
                             _WEIGHT, r, weight[r]))
            rel[rv] += length
        rel[child] = new_rel
        parent[child] = r
        weight[r] = weight[ru] + weight[rv]
        return r

    def _complete(self, b: int) -> bool:
        """A batch entered and left inside one chain must lie completely between the two."""
        e, x = self.enter[b], self.exit[b]
        if e < 0 or x < 0:
            return True
        (re, pe), (rx, px) = self._pos(e), self._pos(x)
        return re != rx or px - pe + 1 == self.size[b]

    def link(self, u: int, v: int) -> bool:
        """Add the successor edge ``u -> v``; False if infeasible (caller rolls back)."""
        nxt, prv, parent = self.nxt, self.prv, self.parent
        if nxt[u] == v:
            return True
        if nxt[u] >= 0 or prv[v] >= 0:
            return False
        ru, rv = u, v
        while parent[ru] != ru:
            ru = parent[ru]
        while parent[rv] != rv:
            rv = parent[rv]
        if ru == rv:
            return False
        a, b = self.batch[u], self.batch[v]
        if a != b:
            if self.exit[a] >= 0 or self.enter[b] >= 0:
                return False
            ba, bb = self._find(self.bparent, a), self._find(self.bparent, b)
            if ba == bb:
                return False
            self._union(_BPARENT, ba, bb)
            self._set(_EXIT, a, u)
            self._set(_ENTER, b, v)
        head, tail = self.head[ru], self.tail[rv]
        self.log.extend((_NXT, u, -1, _PRV, v, -1))
        nxt[u], prv[v] = v, u
        r = self._join(ru, rv)
        self.log.extend((_HEAD, r, self.head[r], _TAIL, r, self.tail[r]))
        self.head[r], self.tail[r] = head, tail
        return self._complete(a) and (a == b or self._complete(b))

    def link_all(self, seq: Sequence[int]) -> bool:
        """Make ``seq`` consecutive, atomically."""
        mark = len(self.log)
        for i in range(len(seq) - 1):
            if not self.link(seq[i], seq[i + 1]):
                self._rollback(mark)
                return False
        return True

    # ---------------------------------------------------------------- closing one batch
    def _pieces(self, b: int) -> tuple[list[int], list[list[int]], list[int], bool]:
        """The batch's chain pieces: (entering piece, free pieces, leaving piece, complete)."""
        seen: set[int] = set()
        first: list[int] = []
        last: list[int] = []
        free: list[list[int]] = []
        batch, nxt, prv = self.batch, self.nxt, self.prv
        for v in self.schedule.batches[b].node_ids.tolist():
            if v in seen:
                continue
            s = v
            while prv[s] >= 0 and batch[prv[s]] == b:
                s = prv[s]
            piece = [s]
            while nxt[piece[-1]] >= 0 and batch[nxt[piece[-1]]] == b:
                piece.append(nxt[piece[-1]])
            seen.update(piece)
            entered, leaves = prv[s] >= 0, nxt[piece[-1]] >= 0
            if entered and leaves:
                return [], [], piece, True
            if entered:
                first = piece
            elif leaves:
                last = piece
            else:
                free.append(piece)
        return first, free, last, False

    def _slot_sequences(self, order: Sequence[int], alive: Sequence[bool] | None = None
                        ) -> list[list[int]]:
        """Per operand slot, the producers in ``order`` (empty if they repeat or, with
        ``prune``, if no order can align them: see :meth:`_alignable`; ``alive``: that
        test's answers, already known for this batch)."""
        ops = self.operands
        arity = min(len(ops[v]) for v in order)  # a variadic op's nodes may differ
        out = []
        for k in range(arity):
            if alive is not None and not alive[k]:
                out.append([])
                continue
            seq = [ops[v][k] for v in order]
            ok = len(set(seq)) == len(seq) and (
                not self.prune or alive is not None or self._alignable(seq))
            out.append(seq if ok else [])
        return out

    def _alignable(self, seq: Sequence[int]) -> bool:
        """A necessary condition for ``link_all`` of ``seq`` in *any* order, now or later:
        the producers lying in one chain occupy consecutive positions of it (chains only
        grow by concatenation, so the chain nodes between two producers stay between them
        in every layout and would have to be producers too). A slot failing it can never
        be aligned: skipping its ``link_all`` (which would fail and roll back) leaves the
        plan unchanged, and a batch with no alignable slot needs no trial orders."""
        span: dict[int, list[int]] = {}
        for p in seq:
            root, pos = self._pos(p)
            s = span.get(root)
            if s is None:
                span[root] = [pos, pos, 1]
            else:
                s[0], s[1], s[2] = min(s[0], pos), max(s[1], pos), s[2] + 1
        return all(hi - lo + 1 == n for lo, hi, n in span.values())

    def _position(self, p: int) -> tuple[int, ...]:
        """Sort key of a producer: its chain (by the head's batch), then its offset in it.

        A node no constraint has placed yet is keyed by its first placed operand instead
        (one step of look-ahead), so that siblings reading one producer line up.
        """
        if self.nxt[p] < 0 and self.prv[p] < 0 and self.order[self.batch[p]] is None:
            for q in self.operands[p]:
                if self.nxt[q] >= 0 or self.prv[q] >= 0 or self.order[self.batch[q]]:
                    root, pos = self._pos(q)
                    head = self.head[root]
                    return (self.batch[p], -1, self.batch[head], head, pos)
        root, pos = self._pos(p)
        head = self.head[root]
        return (self.batch[head], head, pos)

    def _candidates(self, free: list[list[int]]) -> list[list[list[int]]]:
        """Orders of the free pieces to try: node-id order, then per operand slot the order of
        the producers' current positions (their chains in key order, and reversed)."""
        cands = [sorted(free, key=lambda piece: piece[0])]
        if len(free) < 2:  # nothing to order (a single node: e.g. a variadic loss sum)
            return cands
        for k in range(min(len(self.operands[piece[0]]) for piece in free)):
            key = {piece[0]: self._position(self.operands[piece[0]][k]) for piece in free}
            # the chains the producers lie in, in key order and reversed
            rank = {c: i for i, c in enumerate(sorted({key[p[0]][:-1] for p in free}))}
            for sign in (1, -1) if len(rank) > 1 else (1,):
                cand = sorted(free, key=lambda piece: (sign * rank[key[piece[0]][:-1]],
                                                       key[piece[0]][-1]))
                if cand not in cands:
                    cands.append(cand)
        return cands

    def _apply(self, first: list[int], free: list[list[int]], last: list[int],
               alive: Sequence[bool] | None = None) -> tuple[list[int], int]:
        """Close the batch with this piece order and align every slot; return (order, views)."""
        pieces = ([first] if first else []) + free + ([last] if last else [])
        order = [v for piece in pieces for v in piece]
        for p, q in itertools.pairwise(pieces):
            ok = self.link(p[-1], q[0])
            assert ok, "closing a batch from its own pieces cannot fail"
        if len(order) == 1:
            return order, len(self.operands[order[0]])
        seqs = self._slot_sequences(order, alive)
        views = 0
        for seq in sorted(seqs, key=lambda s: len({self.batch[p] for p in s}) if s else 1 << 30):
            views += bool(seq) and self.link_all(seq)
        return order, views

    def close(self, b: int) -> None:
        """Fix batch ``b``'s order (best candidate) and add its slots' alignment edges."""
        first, free, last, complete = self._pieces(b)
        alive = None
        if self.prune:  # order-independent: which slots any order could still align
            alive = [bool(seq) for seq in self._slot_sequences(
                self.schedule.batches[b].node_ids.tolist())]
        if complete:
            order = last
            for seq in self._slot_sequences(order, alive):
                if seq and len(order) > 1:
                    self.link_all(seq)
        else:
            best, best_views, most = 0, -1, len(self.operands[self.size_first[b]])
            if alive is not None:  # the alive slots are the most any candidate aligns
                most = sum(alive)
            if most == 0:  # every candidate aligns nothing: node-id order wins
                cands = [sorted(free, key=lambda piece: piece[0])]
            else:
                cands = self._candidates(free)
            for i, cand in enumerate(cands if len(cands) > 1 else []):
                mark = len(self.log)
                order, views = self._apply(first, cand, last, alive)
                if views == most:  # every slot aligned: keep this one
                    best = -1
                    break
                self._rollback(mark)
                if views > best_views:
                    best, best_views = i, views
            if best >= 0:
                order = self._apply(first, cands[best], last, alive)[0]
        self.order[b] = order

    def _deferrable(self) -> list[bool]:
        """Batches to order after their producers: they only feed forced batches (or
        nothing), and some operand slot reads whole producer batches (a view then only needs
        those batches to be adjacent, whatever their order)."""
        forced = [b.forced for b in self.schedule.batches]
        feeds_batched = [False] * len(forced)
        batch = self.batch
        for v, ops in enumerate(self.operands):
            if not forced[batch[v]]:
                for u in ops:
                    feeds_batched[batch[u]] = True
        return [not f and not forced[b] and self._reads_whole_batches(b)
                for b, f in enumerate(feeds_batched)]

    def _reads_whole_batches(self, b: int) -> bool:
        nodes = self.schedule.batches[b].node_ids.tolist()
        for k in range(len(self.operands[nodes[0]])):
            producers = {self.operands[v][k] for v in nodes}
            counts: dict[int, int] = {}
            for p in producers:
                counts[self.batch[p]] = counts.get(self.batch[p], 0) + 1
            if len(producers) == len(nodes) and all(
                    c == self.size[q] for q, c in counts.items()):
                return True
        return False

    # ---------------------------------------------------------------- driver and layout
    def run(self) -> tuple[list[NDArray[np.int32]], list[int]]:
        """Plan; return per-batch row orders and the batch placement order.

        A batch is closed once all its (non-deferred) consumer batches are; among those
        ready, batches whose order is already fixed by constraints go first (they impose
        without choosing), then later batches first.
        """
        nb, deferrable = len(self.size), self.deferrable
        producers: list[set[int]] = [set() for _ in range(nb)]
        waiting = [0] * nb
        for b, batch in enumerate(self.schedule.batches):
            if not deferrable[b]:
                producers[b] = {self.batch[u] for v in batch.node_ids.tolist()
                                for u in self.operands[v]}
                for p in producers[b]:
                    waiting[p] += 1
        heap = [(0, -b, b) for b in range(nb) if waiting[b] == 0 and not deferrable[b]]
        heapq.heapify(heap)
        while heap:
            b = heapq.heappop(heap)[2]
            self.close(b)
            for p in producers[b]:
                waiting[p] -= 1
                if waiting[p] == 0 and not deferrable[p]:
                    heapq.heappush(heap, (int(len(self._pieces(p)[1]) > 1), -p, p))
        for b in range(nb):
            if deferrable[b]:
                self.close(b)
        orders = [np.asarray(o, dtype=np.int32) for o in self.order]  # type: ignore[arg-type]
        return orders, self._placement()

    def _placement(self) -> list[int]:
        """Batches in layout order: batch-level chains, by schedule order of their heads."""
        placement: list[int] = []
        for b in range(len(self.schedule.batches)):
            if self.enter[b] >= 0:
                continue
            while True:
                placement.append(b)
                x = self.exit[b]
                if x < 0:
                    break
                b = self.batch[self.nxt[x]]
        return placement
