"""Frontier: the one piece of ready-set bookkeeping that every scheduler and the env drive.

Kahn's algorithm by op type: each node keeps the number of operand slots still unexecuted;
popping a batch decrements its users and releases the ones that reach zero into per-type
ready lists. Work per node is amortized O(1) and vectorized per batch with numpy. With
``typewise=True`` it also maintains ED-Batch's type-wise frontier count ``T(a)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import InvalidActionError
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import _segments, typewise_graph
from edbatch.schedule.schedule import Batch

__all__ = ["Frontier", "FrontierView"]


@dataclass(frozen=True, slots=True)
class FrontierView:
    """What a policy may look at; arrays are read-only and indexed by op id.

    Attributes:
        graph: the graph being scheduled (static facts such as mean depth per type).
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

    graph: Graph
    mask: NDArray[np.int8]
    ready_count: NDArray[np.int64]
    typewise_count: NDArray[np.int64] | None
    remaining_count: NDArray[np.int64]
    remaining_depth_sum: NDArray[np.float64]
    last_op: int
    num_batches: int
    num_executed: int
    _frontier: Frontier

    def ready_nodes(self, op_id: int) -> NDArray[np.int32]:
        """Ready node ids of one op type (ascending)."""
        return self._frontier.ready_nodes(op_id)

    @property
    def ready_ops(self) -> NDArray[np.int64]:
        """Op ids with ready nodes, ascending."""
        return np.flatnonzero(self.mask)


def _readonly(a: NDArray) -> NDArray:  # type: ignore[type-arg]
    v = a.view()
    v.setflags(write=False)
    return v


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
        k = len(graph.vocab)
        self._op = graph.op_ids
        self._batchable = graph.vocab.batchable
        self._uptr, self._uids = graph.users
        self._pending = graph.arity.astype(np.int32)  # unexecuted operand slots per node
        self._ready: list[list[NDArray[np.int32]]] = [[] for _ in range(k)]
        self._forced: list[int] = []
        self.ready_count = np.zeros(k, dtype=np.int64)
        self.remaining_count = graph.type_counts.astype(np.int64)
        self.remaining_depth_sum = np.bincount(graph.op_ids, weights=graph.depth,
                                               minlength=k).astype(np.float64)
        self.num_executed = 0
        self.num_batches = 0
        self.last_op = -1
        self.typewise_count: NDArray[np.int64] | None = None
        if typewise:
            pred_count, self._tw_ptr, self._tw_ids = typewise_graph(graph)
            self._tw_pending = pred_count.copy()
            free = self._tw_pending == 0
            self.typewise_count = np.bincount(graph.op_ids[free], minlength=k).astype(np.int64)
            self.typewise_count[~self._batchable] = 0  # T is only defined for batchable types
        self._release(np.flatnonzero(self._pending == 0).astype(np.int32))

    # ------------------------------------------------------------------ queries
    @property
    def done(self) -> bool:
        """Whether every node has been executed."""
        return self.num_executed == self.graph.num_nodes

    @property
    def has_forced(self) -> bool:
        """Whether an unbatchable node is ready (it must run before the next decision)."""
        return bool(self._forced)

    def mask(self) -> NDArray[np.int8]:
        """``int8[K]``: 1 for batchable op types with ready nodes."""
        return ((self.ready_count > 0) & self._batchable).astype(np.int8)

    def ready_nodes(self, op_id: int) -> NDArray[np.int32]:
        """Ready node ids of ``op_id``, ascending (chunks are merged in place)."""
        chunks = self._ready[op_id]
        if len(chunks) > 1:
            merged = np.sort(np.concatenate(chunks))
            chunks[:] = [merged]
        return chunks[0] if chunks else np.zeros(0, dtype=np.int32)

    def all_ready(self) -> NDArray[np.int64]:
        """Every ready node id, unbatchable ones included."""
        parts = [c for chunks in self._ready for c in chunks]
        parts.append(np.asarray(self._forced, dtype=np.int32))
        return np.concatenate(parts).astype(np.int64)

    def view(self) -> FrontierView:
        """A read-only snapshot handle for policies."""
        tw = self.typewise_count
        return FrontierView(self.graph, self.mask(), _readonly(self.ready_count),
                            None if tw is None else _readonly(tw),
                            _readonly(self.remaining_count), _readonly(self.remaining_depth_sum),
                            self.last_op, self.num_batches, self.num_executed, self)

    # ------------------------------------------------------------------ transitions
    def pop(self, op_id: int) -> Batch:
        """Execute every ready node of ``op_id`` as one batch and return it.

        Raises:
            InvalidActionError: ``op_id`` has no ready node or is unbatchable.
        """
        if not (0 <= op_id < len(self._ready)) or not self.ready_count[op_id] \
                or not self._batchable[op_id]:
            raise InvalidActionError(self._invalid_message(op_id))
        nodes = self.ready_nodes(op_id)
        self._ready[op_id] = []
        self.ready_count[op_id] = 0
        self.last_op = op_id
        if self.typewise_count is not None:
            self._advance_typewise(op_id, nodes)
        self._execute(op_id, nodes)
        return Batch(op_id, nodes)

    def pop_forced(self) -> Batch | None:
        """Run the most recently released unbatchable node alone, or return ``None``."""
        if not self._forced:
            return None
        v = self._forced.pop()
        op_id = int(self._op[v])
        nodes = np.array([v], dtype=np.int32)
        self._execute(op_id, nodes)
        return Batch(op_id, nodes, forced=True)

    def _invalid_message(self, op_id: object) -> str:
        vocab = self.graph.vocab
        ready = [vocab[int(a)].name for a in np.flatnonzero(self.mask())]
        name = vocab[op_id].name if isinstance(op_id, (int, np.integer)) and \
            0 <= op_id < len(vocab) else "<no such op>"
        return (f"op type {op_id!r} ({name}) has no ready batchable node; ready op types are "
                f"{ready}. Choose an action allowed by the action mask")

    def _execute(self, op_id: int, nodes: NDArray[np.int32]) -> None:
        self.num_executed += len(nodes)
        self.num_batches += 1
        self.remaining_count[op_id] -= len(nodes)
        self.remaining_depth_sum[op_id] -= float(self.graph.depth[nodes].sum())
        if len(nodes) == 1:
            v = int(nodes[0])
            users = self._uids[self._uptr[v]:self._uptr[v + 1]]
        else:
            idx, _ = _segments(self._uptr, nodes.astype(np.int64))
            users = self._uids[idx]
        if not len(users):
            return
        np.subtract.at(self._pending, users, 1)
        fresh = users[self._pending[users] == 0]
        if len(fresh) > 1:
            fresh = np.unique(fresh)
        if len(fresh):
            self._release(fresh)

    def _release(self, nodes: NDArray[np.int32]) -> None:
        if not len(nodes):
            return
        types = self._op[nodes]
        if len(nodes) == 1:
            a = int(types[0])
            if self._batchable[a]:
                self._ready[a].append(nodes)
                self.ready_count[a] += 1
            else:
                self._forced.append(int(nodes[0]))
            return
        order = np.argsort(types, kind="stable")
        types, nodes = types[order], nodes[order]
        cuts = np.flatnonzero(np.diff(types)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(nodes)]])
        for s, e in zip(starts.tolist(), ends.tolist()):
            a = int(types[s])
            if self._batchable[a]:
                self._ready[a].append(nodes[s:e])
                self.ready_count[a] += e - s
            else:
                self._forced.extend(nodes[s:e].tolist())

    def _advance_typewise(self, op_id: int, nodes: NDArray[np.int32]) -> None:
        assert self.typewise_count is not None
        idx, _ = _segments(self._tw_ptr, nodes.astype(np.int64))
        succ = self._tw_ids[idx]
        freed = 0
        if len(succ):
            np.subtract.at(self._tw_pending, succ, 1)
            fresh = succ[self._tw_pending[succ] == 0]
            freed = len(np.unique(fresh)) if len(fresh) > 1 else len(fresh)
        self.typewise_count[op_id] += freed - len(nodes)
