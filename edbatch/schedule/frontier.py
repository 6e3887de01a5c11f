"""Frontier: the one piece of ready-set bookkeeping that every scheduler and the env drive.

Kahn's algorithm by op type: each node keeps the number of operand slots still unexecuted;
popping a batch decrements its users and releases the ones that reach zero into per-type
ready lists. Work is O(1) per edge. The bookkeeping runs on flat Python lists because
batches are often small (a lattice batch holds ~10 nodes), where numpy's per-call overhead
would dominate; policies still see numpy arrays through :class:`FrontierView`. With
``typewise=True`` it also maintains ED-Batch's type-wise frontier count ``T(a)``.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import InvalidActionError
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import typewise_graph
from edbatch.schedule.schedule import Batch

__all__ = ["Frontier", "FrontierView"]


@dataclass(frozen=True, slots=True)
class _Static:
    """Per-graph lists the frontier reads (built once per graph and cached)."""

    op: list[int]
    depth: list[int]
    arity: list[int]
    user_ptr: list[int]
    user_ids: list[int]
    batchable: list[bool]
    batchable_np: NDArray[np.bool_]


_STATIC: weakref.WeakKeyDictionary[Graph, _Static] = weakref.WeakKeyDictionary()


def _static(graph: Graph) -> _Static:
    s = _STATIC.get(graph)
    if s is None:
        uptr, uids = graph.users
        s = _STATIC[graph] = _Static(
            graph.op_ids.tolist(), graph.depth.tolist(), graph.arity.tolist(), uptr.tolist(),
            uids.tolist(), graph.vocab.batchable.tolist(), graph.vocab.batchable)
    return s


def _array(values: list[int] | list[float], dtype: type) -> NDArray:  # type: ignore[type-arg]
    out: NDArray = np.array(values, dtype=dtype)  # type: ignore[type-arg]
    out.setflags(write=False)
    return out


class FrontierView:
    """What a policy may look at: a snapshot of a frontier, with read-only numpy arrays.

    Arrays are indexed by op id and built on first access. A view describes the frontier
    at the time :meth:`Frontier.view` was called; :meth:`ready_nodes` reads the live
    frontier, so use it before the next pop.

    Attributes:
        graph: the graph being scheduled (static facts such as depth).
        mask: ``int8[K]``, 1 where a batchable op type has ready nodes (Gymnasium convention).
        ready_count: ``int64[K]`` ready nodes per type, ``|F(a)|``.
        typewise_count: ``int64[K]`` ED-Batch's ``T(a)`` (0 for unbatchable types), or
            ``None`` if not tracked.
        remaining_count: ``int64[K]`` unexecuted nodes per type.
        remaining_depth_sum: ``float64[K]`` sum of depths of unexecuted nodes per type.
        last_op: op id of the previous decision, ``-1`` before the first.
        num_batches: batches issued so far (forced ones included).
        num_executed: nodes executed so far.
    """

    __slots__ = ("_cache", "_count", "_frontier", "_remaining", "_remaining_depth", "_tw",
                 "graph", "last_op", "num_batches", "num_executed")

    def __init__(self, frontier: Frontier) -> None:
        self.graph = frontier.graph
        self._frontier = frontier
        self._count = list(frontier._count)
        self._remaining = list(frontier._remaining)
        self._remaining_depth = list(frontier._remaining_depth)
        self._tw = None if frontier._tw is None else list(frontier._tw)
        self.last_op = frontier.last_op
        self.num_batches = frontier.num_batches
        self.num_executed = frontier.num_executed
        self._cache: dict[str, NDArray] = {}  # type: ignore[type-arg]

    @property
    def ready_count(self) -> NDArray[np.int64]:
        """``|F(a)|`` per op type."""
        if "ready" not in self._cache:
            self._cache["ready"] = _array(self._count, np.int64)
        return self._cache["ready"]

    @property
    def mask(self) -> NDArray[np.int8]:
        """1 where a batchable op type has ready nodes."""
        if "mask" not in self._cache:
            m = ((self.ready_count > 0) & self._frontier._s.batchable_np).astype(np.int8)
            m.setflags(write=False)
            self._cache["mask"] = m
        return self._cache["mask"]

    @property
    def typewise_count(self) -> NDArray[np.int64] | None:
        """``T(a)`` per op type, or ``None`` if not tracked."""
        if self._tw is None:
            return None
        if "tw" not in self._cache:
            self._cache["tw"] = _array(self._tw, np.int64)
        return self._cache["tw"]

    @property
    def remaining_count(self) -> NDArray[np.int64]:
        """Unexecuted nodes per op type."""
        if "rem" not in self._cache:
            self._cache["rem"] = _array(self._remaining, np.int64)
        return self._cache["rem"]

    @property
    def remaining_depth_sum(self) -> NDArray[np.float64]:
        """Sum of the depths of unexecuted nodes per op type."""
        if "remd" not in self._cache:
            self._cache["remd"] = _array(self._remaining_depth, np.float64)
        return self._cache["remd"]

    @property
    def ready_ops(self) -> list[int]:
        """Batchable op ids with ready nodes, ascending (no numpy)."""
        b = self._frontier._s.batchable
        return [a for a, c in enumerate(self._count) if c and b[a]]

    def count(self, op_id: int) -> int:
        """``|F(a)|`` of one op type (a plain int; no array is built)."""
        return self._count[op_id]

    def remaining(self, op_id: int) -> tuple[int, float]:
        """(unexecuted nodes, sum of their depths) of one op type."""
        return self._remaining[op_id], self._remaining_depth[op_id]

    def typewise(self, op_id: int) -> int:
        """``T(a)`` of one op type (requires a frontier with ``typewise=True``)."""
        assert self._tw is not None, "create the Frontier with typewise=True"
        return self._tw[op_id]

    def ready_nodes(self, op_id: int) -> NDArray[np.int32]:
        """Ready node ids of one op type (ascending), read from the live frontier."""
        return self._frontier.ready_nodes(op_id)

    def max_over_ready(self, op_id: int, values: list[int]) -> int:
        """``max(values[v])`` over the ready nodes of one op type (no array is built).

        Ready lists only grow until their type runs (then they are replaced), so the maximum
        is kept per type and extended over the nodes released since the last call.
        """
        return self._frontier._max_over_ready(op_id, values)


_TW_LISTS: weakref.WeakKeyDictionary[Graph, tuple[list[int], list[int], list[int]]] = (
    weakref.WeakKeyDictionary())


def _typewise_lists(graph: Graph, ptr: NDArray[np.int64], ids: NDArray[np.int32],
                    pred_count: NDArray[np.int32]) -> tuple[list[int], list[int], list[int]]:
    """The type-wise CSR arrays as Python lists, converted once per graph (read-only)."""
    cached = _TW_LISTS.get(graph)
    if cached is None:
        cached = _TW_LISTS[graph] = (ptr.tolist(), ids.tolist(), pred_count.tolist())
    return cached


def _retire(nodes: list[int], ptr: list[int], ids: list[int], pending: list[int]) -> list[int]:
    """Kahn's step over a CSR successor list: decrement each successor of ``nodes`` in
    ``pending`` and return those that reach zero (plain lists: batches are often small)."""
    fresh = []
    for v in nodes:
        for i in range(ptr[v], ptr[v + 1]):
            u = ids[i]
            left = pending[u] - 1
            pending[u] = left
            if not left:
                fresh.append(u)
    return fresh


class Frontier:
    """Ready-set bookkeeping for one graph (the only mutable object of scheduling).

    Example:
        >>> from edbatch.graph import OpType, Vocab, GraphBuilder
        >>> b = GraphBuilder(Vocab([OpType("x", "lookup", (), (1,)),
        ...                         OpType("f", "tanh", ((1,),), (1,))]))
        >>> x = b.add("x"); y = b.add("f", x); z = b.add("f", y)
        >>> f = Frontier(b.build())
        >>> f.ready_count.tolist(), f.pop(0).node_ids.tolist(), f.ready_count.tolist()
        ([1, 0], [0], [0, 1])
    """

    def __init__(self, graph: Graph, *, typewise: bool = False) -> None:
        self.graph = graph
        self._s = s = _static(graph)
        k = len(graph.vocab)
        self._pending = list(s.arity)  # unexecuted operand slots per node
        self._ready: list[list[int]] = [[] for _ in range(k)]
        #: op id -> (ready list, values, length seen, max): see FrontierView.max_over_ready
        self._max_memo: dict[int, tuple[list[int], list[int], int, int]] = {}
        self._count = [0] * k
        self._forced: list[int] = []
        self._remaining: list[int] = graph.type_counts.tolist()
        self._remaining_depth: list[float] = np.bincount(
            graph.op_ids, weights=graph.depth, minlength=k).tolist()
        self.num_executed = 0
        self.num_batches = 0
        self.last_op = -1
        self._tw: list[int] | None = None
        if typewise:
            pred_count, ptr, ids = typewise_graph(graph)
            self._tw_ptr, self._tw_ids, pending = _typewise_lists(graph, ptr, ids, pred_count)
            self._tw_pending = list(pending)
            counts = np.bincount(graph.op_ids[pred_count == 0], minlength=k)
            counts[~s.batchable_np] = 0  # T is only defined for batchable types
            self._tw = counts.tolist()
        self._release(np.flatnonzero(graph.arity == 0).tolist())

    # ------------------------------------------------------------------ queries
    @property
    def done(self) -> bool:
        """Whether every node has been executed."""
        return self.num_executed == self.graph.num_nodes

    @property
    def has_forced(self) -> bool:
        """Whether an unbatchable node is ready (it must run before the next decision)."""
        return bool(self._forced)

    @property
    def ready_count(self) -> NDArray[np.int64]:
        """``int64[K]`` ready nodes per op type (a fresh array)."""
        return np.array(self._count, dtype=np.int64)

    @property
    def remaining_count(self) -> NDArray[np.int64]:
        """``int64[K]`` unexecuted nodes per op type (a fresh array)."""
        return np.array(self._remaining, dtype=np.int64)

    @property
    def remaining_depth_sum(self) -> NDArray[np.float64]:
        """``float64[K]`` sum of depths of unexecuted nodes per op type (a fresh array)."""
        return np.array(self._remaining_depth, dtype=np.float64)

    @property
    def typewise_count(self) -> NDArray[np.int64] | None:
        """``int64[K]`` type-wise frontier counts ``T(a)``, or ``None`` if not tracked."""
        return None if self._tw is None else np.array(self._tw, dtype=np.int64)

    def count(self, op_id: int) -> int:
        """``|F(a)|`` of one op type (no array built)."""
        return self._count[op_id]

    def typewise(self, op_id: int) -> int:
        """``T(a)`` of one op type; requires ``typewise=True``."""
        assert self._tw is not None, "create the Frontier with typewise=True"
        return self._tw[op_id]

    def mask(self) -> NDArray[np.int8]:
        """``int8[K]``: 1 for batchable op types with ready nodes."""
        return ((np.array(self._count) > 0) & self._s.batchable_np).astype(np.int8)

    def _max_over_ready(self, op_id: int, values: list[int]) -> int:
        ready = self._ready[op_id]
        n = len(ready)
        memo = self._max_memo.get(op_id)
        if memo is not None and memo[0] is ready and memo[1] is values and memo[2] <= n:
            best = memo[3]
            if n > memo[2]:
                best = max(best, max([values[v] for v in ready[memo[2]:]]))
        else:
            best = max([values[v] for v in ready])
        self._max_memo[op_id] = (ready, values, n, best)
        return best

    def ready_nodes(self, op_id: int) -> NDArray[np.int32]:
        """Ready node ids of ``op_id``, ascending."""
        nodes = self._ready[op_id]
        self._max_memo.pop(op_id, None)  # sorting reorders what the memo has seen
        nodes.sort()
        return np.array(nodes, dtype=np.int32)

    def all_ready(self) -> NDArray[np.int64]:
        """Every ready node id, unbatchable ones included."""
        out = [v for nodes in self._ready for v in nodes]
        out.extend(self._forced)
        return np.array(out, dtype=np.int64)

    def view(self) -> FrontierView:
        """A read-only snapshot for policies."""
        return FrontierView(self)

    def copy(self) -> Frontier:
        """An independent copy (the graph and static lists are shared)."""
        out = copy.copy(self)
        out._pending = list(self._pending)
        out._ready = [list(nodes) for nodes in self._ready]
        out._max_memo = {}
        out._count = list(self._count)
        out._forced = list(self._forced)
        out._remaining = list(self._remaining)
        out._remaining_depth = list(self._remaining_depth)
        if self._tw is not None:
            out._tw = list(self._tw)
            out._tw_pending = list(self._tw_pending)
        return out

    # ------------------------------------------------------------------ transitions
    def pop(self, op_id: int) -> Batch:
        """Execute every ready node of ``op_id`` as one batch and return it.

        Raises:
            InvalidActionError: ``op_id`` has no ready node or is unbatchable.
        """
        if not (0 <= op_id < len(self._count)) or not self._count[op_id] \
                or not self._s.batchable[op_id]:
            raise InvalidActionError(self._invalid_message(op_id))
        nodes = self._ready[op_id]
        nodes.sort()
        self._ready[op_id] = []
        self._max_memo.pop(op_id, None)
        self._count[op_id] = 0
        self.last_op = op_id
        batch = Batch(op_id, np.array(nodes, dtype=np.int32))
        if self._tw is not None:
            self._advance_typewise(op_id, nodes)
        self._execute(op_id, nodes)
        return batch

    def pop_forced(self) -> Batch | None:
        """Run the most recently released unbatchable node alone, or return ``None``."""
        if not self._forced:
            return None
        v = self._forced.pop()
        op_id = self._s.op[v]
        self._execute(op_id, [v])
        return Batch(op_id, np.array([v], dtype=np.int32), forced=True)

    def _invalid_message(self, op_id: object) -> str:
        vocab = self.graph.vocab
        ready = [vocab[a].name for a in range(len(vocab))
                 if self._count[a] and self._s.batchable[a]]
        name = vocab[op_id].name if isinstance(op_id, (int, np.integer)) and \
            0 <= op_id < len(vocab) else "<no such op>"
        return (f"op type {op_id!r} ({name}) has no ready batchable node; ready op types are "
                f"{ready}. Choose an action allowed by the action mask")

    def _execute(self, op_id: int, nodes: list[int]) -> None:
        s = self._s
        depth, uptr, uids, pending = s.depth, s.user_ptr, s.user_ids, self._pending
        self.num_executed += len(nodes)
        self.num_batches += 1
        self._remaining[op_id] -= len(nodes)
        self._remaining_depth[op_id] -= sum([depth[v] for v in nodes])
        fresh = _retire(nodes, uptr, uids, pending)
        if fresh:
            self._release(fresh)

    def _release(self, nodes: list[int]) -> None:
        op, batchable, ready, count = self._s.op, self._s.batchable, self._ready, self._count
        for u in nodes:
            a = op[u]
            if batchable[a]:
                ready[a].append(u)
                count[a] += 1
            else:
                self._forced.append(u)

    def _advance_typewise(self, op_id: int, nodes: list[int]) -> None:
        """Retire ``nodes`` from the type-wise graph; a successor whose last type-wise
        predecessor ran joins the type-wise frontier (plain lists: batches are small)."""
        assert self._tw is not None
        freed = _retire(nodes, self._tw_ptr, self._tw_ids, self._tw_pending)
        self._tw[op_id] += len(freed) - len(nodes)
