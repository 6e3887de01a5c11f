"""``plan_memory``: lay out every node's output row so that batches read operands as views.

Model (docs/architecture.md 3.9). One arena per flattened output width; each node owns one
row. A batch writes its outputs to one contiguous region (*adjacency*), in its row order.
Operand slot ``k`` of a batch is a zero-copy view iff the producers of the ``k``-th operands
of its nodes, taken in the batch's row order, occupy consecutive ascending rows
(*alignment*); otherwise it is a gather. Forced (unbatchable, single-node) batches may
gather and are not counted in the zero-copy fraction.

Strategies:

* ``"naive"`` (DyNet-like): batches are allocated in schedule order, rows in node-id order;
  a slot is a view only when that happens to line up.
* ``"aligned"``: one backward pass orders each batch's rows by the read that consumes them
  first (:mod:`edbatch.memory._aligned`), batches in schedule order; vectorised, a few
  milliseconds per 64-instance mini-batch, for schedules planned once and run once.
* ``"planned"``: the layout is built as a set of *successor chains*: a satisfied constraint
  "sequence ``s`` is consecutive" is the set of successor edges ``s[i] -> s[i+1]``. Edges are
  added atomically per constraint with an undo log, and a constraint is kept only if the edge
  set stays realisable as a layout in which every batch is one block: each node has at most
  one successor and predecessor, no cycle, each batch is entered and left at most once (the
  block boundaries), the batch-level boundary graph stays acyclic, and a batch that is
  entered and left inside one chain lies completely in it. This is the consecutive-ones
  reasoning of a PQ-tree restricted to totally ordered constraints, which is all the
  alignment constraints need once the consumer's order is fixed.

  1. *Backward pass* (consumers before producers): a batch is *closed* once all its
     consumer batches are; among the ready ones, batches whose order is already fixed by
     their consumers go first (they impose without choosing, which gives the look-ahead
     below something to look at), then later batches first. Closing concatenates the chain
     pieces the consumers imposed (the piece entering the block first, the piece leaving it
     last, the free pieces in between). Candidate orders of the free pieces: node-id order
     and, per operand slot, "sorted by the producer's current chain position" (chains in
     key order and reversed; a producer nothing placed yet is keyed by its own placed
     operand, one step of look-ahead, so sibling batches reading one producer line up).
     Each candidate is tried with every slot's alignment edges and rolled back; the one
     with most aligned slots wins and its edges are added for real. E.g. a Tree-LSTM
     internal batch imposes "left children in parent order" and "right children in parent
     order" on the children's batch, which then becomes [left run][right run].
  2. *Deferral*: a batch that only feeds forced batches (the losses feeding ``loss_sum``)
     and reads whole producer batches in some slot is closed last, in a *forward pass*,
     sorted by its producers' positions: it follows the layout instead of imposing one (a
     loss read over whole state batches is a view if those batches end up adjacent, without
     constraining how the internal nodes are ordered).
  3. Layout: batch-level chains are concatenated (by schedule order of their first batch)
     and rows are assigned per arena.

  ``plan_memory`` runs the chain planner with and without deferral, the aligned and the
  naive layout, and keeps the plan with most views, so **planned >= aligned >= naive** in
  views by construction. The naive layout's views are counted on the aligned layout's
  arenas and regions (:class:`_Frame`: the same for any row order); it is built in full only
  when it has as many views as the aligned one (it wins ties).

Guarantees: every node gets exactly one row; every batch's outputs are one contiguous region;
every operand marked as a view really reads its producers' rows in order (reads are classified
from the final rows, independently of the planner's reasoning). Optimality is not guaranteed
(the general problem contains consecutive-ones ordering with isomorphism constraints). A read
can be a view only if its producers touch at most two partially read batches; the fraction
of reads passing that test is :func:`zero_copy_upper_bound`, and on SST trees it is low
(30-45% at cell level: an internal batch's children come from many batches), so no layout of
those schedules can reach 90%. Complexity: one constraint of ``m`` rows costs
``O(m log N)`` (union-find by size without path compression, so that it can be undone); a
batch of arity ``a`` tries at most ``2a + 1`` orders, each aligning ``a`` slots, so planning
is ``O(a^2 E log N)`` for ``E`` operand references: about 0.1-0.4 s for a 64-instance
cell-level mini-batch and 2-4 s for a 100k-node primitive one, in pure Python.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from edbatch._lru import Lru
from edbatch.errors import ScheduleError, UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph, Vocab
from edbatch.memory import _operands
from edbatch.memory._aligned import aligned_orders
from edbatch.memory._chains import ChainPlanner
from edbatch.memory._classify_numpy import classify_numpy
from edbatch.memory.plan import MemoryPlan
from edbatch.schedule.schedule import Schedule

__all__ = ["STRATEGIES", "Strategy", "plan_key", "plan_memory", "zero_copy_upper_bound"]

Strategy = Literal["naive", "aligned", "planned"]
STRATEGIES: tuple[Strategy, ...] = ("naive", "aligned", "planned")


#: The plan memo (an LRU of 256 plans; lookups go cold when nothing hits: :mod:`edbatch._lru`).
_MEMO: Lru[MemoryPlan] = Lru(256)


def plan_key(graph: Graph, schedule: Schedule, strategy: str) -> bytes:
    """What a plan depends on: the graph's structure, the schedule's batches and the
    strategy (not ``attrs``); the key of the plan memo and of captured CUDA graphs."""
    h = hashlib.blake2b(graph.structure_key(), digest_size=16)
    h.update(strategy.encode())
    _, ptr, nodes, _ = schedule.flat()  # (a compiled scheduler's batches are never made)
    h.update(np.diff(ptr).astype(np.int64, copy=False))  # batch sizes, hashed as their bytes
    if len(ptr) > 1:
        h.update(nodes.astype(np.int32, copy=False))
    return h.digest()


def plan_memory(graph: Graph, schedule: Schedule, strategy: Strategy = "planned", *,
                cache: bool = True) -> MemoryPlan:
    """Plan arenas, row orders and operand reads for ``schedule`` on ``graph``.

    A plan depends only on the graph's structure and the schedule, so plans are memoised by
    a hash of both (an LRU of 256 plans): mini-batches whose structure repeats (the same
    instances in another epoch, identical sentences) are planned once. After 32 misses in a
    row (reshuffled mini-batches never repeat) only every 16th plan is looked up, so the hash
    (0.1-0.5 ms on 64 trees or sentences) is not paid for nothing; a hit turns lookups back on.

    Args:
        graph: the graph.
        schedule: a valid schedule of ``graph``.
        strategy: ``"naive"`` (schedule order, node-id order), ``"aligned"`` (one pass,
            consumer order) or ``"planned"`` (the chain planner; most views, slowest).
        cache: look the plan up in, and store it into, the memo.

    Returns:
        The frozen :class:`~edbatch.memory.plan.MemoryPlan`.

    Raises:
        UnknownNameError: unknown strategy.
        ScheduleError: the schedule runs another number of nodes than the graph has.

    Example:
        >>> from edbatch.graph import OpType, Vocab, GraphBuilder
        >>> b = GraphBuilder(Vocab([OpType("x", "lookup", (), (2,)),
        ...                         OpType("f", "tanh", ((2,),), (2,))]))
        >>> xs = [b.add("x", attr=i) for i in range(3)]
        >>> g = b.build([b.add("f", x) for x in xs])
        >>> s = Schedule.from_node_lists(g, [[0, 1, 2], [3, 4, 5]], "manual")
        >>> plan_memory(g, s).stats()["memory/zero_copy_fraction"]
        1.0
    """
    if strategy not in STRATEGIES:
        raise UnknownNameError(f"unknown memory strategy {strategy!r}; expected one of "
                               f"{list(STRATEGIES)}." + did_you_mean(strategy, STRATEGIES))
    scheduled = len(schedule.flat()[2])
    if scheduled != graph.num_nodes:  # (the rest of schedule.validate is left to its callers)
        raise ScheduleError(f"the schedule runs {scheduled} nodes but the graph has "
                            f"{graph.num_nodes}: it is another graph's; schedule this graph")
    if not cache or _MEMO.cold():
        return _plan(graph, schedule, strategy)
    key = plan_key(graph, schedule, strategy)
    plan = _MEMO.get(key)
    if plan is None:
        plan = _plan(graph, schedule, strategy)
        _MEMO.put(key, plan)
    return plan


def _plan(graph: Graph, schedule: Schedule, strategy: Strategy) -> MemoryPlan:
    start = time.perf_counter()
    n = schedule.num_batches
    frame = _Frame(graph, schedule, range(n))
    naive = frame.nodes  # every batch's node ids, batch after batch: the naive row orders
    if strategy == "naive":
        best = _Layout(graph, schedule, None, range(n), frame, naive)
    else:
        best = _Layout(graph, schedule, None, range(n), frame, _aligned_cons(frame))
        # the naive layout is only classified, not frozen; it is kept when it has as many
        # views (it was the first candidate, kept on ties), its classification reused
        counted = frame.classify(naive)
        if counted[-1] >= best.num_views:
            best = _Layout(graph, schedule, None, range(n), frame, naive, counted)
    if strategy == "planned":
        for defer in (True, False):
            planner = ChainPlanner(graph, schedule, defer)
            if defer and not any(planner.deferrable):
                continue  # the same as without deferral
            cand = _Layout(graph, schedule, *planner.run())
            if cand.num_views > best.num_views:
                best = cand
    return best.plan(strategy, time.perf_counter() - start)


def zero_copy_upper_bound(graph: Graph, schedule: Schedule) -> float:
    """An upper bound on the zero-copy fraction any plan can reach for ``schedule``.

    A read of ``m > 1`` rows can be a view only if its producers are distinct and form one
    interval of the arena; batch blocks are intervals, so at most two of the producer batches
    it touches may be read partially. The bound counts the reads (of non-forced batches) that
    pass this test; it ignores the interactions between reads, so it is not always reachable.
    """
    step = schedule.step_of(graph.num_nodes)
    size = np.array([len(b) for b in schedule.batches], dtype=np.int64)
    reads = ok = 0
    for b in schedule.batches:
        if b.forced:
            continue
        ids = np.asarray(b.node_ids, dtype=np.int64)
        for k in range(int(graph.arity[ids].min())):  # slots every node has (variadic ops)
            reads += 1
            prods = graph.operand_ids[graph.operand_ptr[ids] + k]
            if len(np.unique(prods)) != len(prods):
                continue
            batches, counts = np.unique(step[prods], return_counts=True)
            ok += int(np.count_nonzero(counts < size[batches]) <= 2)
    return ok / reads if reads else 1.0


# ---------------------------------------------------------------------------- plan assembly
_TABLES: dict[int, tuple[Vocab, NDArray[np.int64], NDArray[np.bool_]]] = {}


def _op_tables(vocab: Vocab) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """``(flattened output width, variadic)`` per op type of ``vocab``, computed once."""
    hit = _TABLES.get(id(vocab))
    if hit is None or hit[0] is not vocab:
        if len(_TABLES) >= 16:
            _TABLES.clear()
        hit = _TABLES[id(vocab)] = (
            vocab, np.array([math.prod(op.out_shape) for op in vocab], dtype=np.int64),
            np.array([op.arity is None for op in vocab], dtype=np.bool_))
    return hit[1], hit[2]


def _frame_numpy(op_ids: NDArray[np.int64], bptr: NDArray[np.int64], place: NDArray[np.int64],
                 width: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
    """:func:`~edbatch.memory._classify_compiled.frame_compiled` in numpy (the oracle)."""
    batch_width = width[op_ids]
    widths = np.unique(batch_width)
    arena = np.searchsorted(widths, batch_width)
    sizes = np.diff(bptr)
    placed_sizes = sizes[place]
    ends = np.zeros(len(op_ids), dtype=np.int64)
    for a in range(len(widths)):
        mine = arena[place] == a
        ends[place[mine]] = np.cumsum(placed_sizes[mine])
    rows = np.array([ends[arena == a].max(initial=0) for a in range(len(widths))], np.int64)
    pos_row = np.repeat(ends - sizes - bptr[:-1], sizes) + np.arange(bptr[-1], dtype=np.int64)
    return (widths, arena, ends - sizes, ends, rows, pos_row,
            np.repeat(arena, sizes).astype(np.int32))


class _Frame:
    """What every layout of one schedule and one batch placement shares, whatever the row
    order inside each batch: the arenas, each batch's region, and the row and arena of each
    position of the batches' concatenated row orders."""

    def __init__(self, graph: Graph, schedule: Schedule, placement: Iterable[int]) -> None:
        self.graph, self.schedule = graph, schedule
        self.width, self.variadic = _op_tables(graph.vocab)  # per op type
        op_ids, self.bptr, self.nodes, self.forced = schedule.flat()  # (shared: not modified)
        self.sizes = np.diff(self.bptr)
        # Rows: batches in placement order, each arena filled from row 0.
        from edbatch.memory._classify_compiled import frame_compiled
        from edbatch.schedule.compiled import resolve_backend

        place = np.arange(len(op_ids), dtype=np.int64) if isinstance(placement, range) and \
            placement == range(len(op_ids)) \
            else np.fromiter(placement, dtype=np.int64, count=len(op_ids))
        frame: Any = _frame_numpy if resolve_backend() != "compiled" else frame_compiled
        widths, self.arena, self.start, self.stop, rows, self.pos_row, self.pos_arena = frame(
            op_ids, self.bptr, place, self.width)
        self.widths, self.rows = widths.tolist(), rows.tolist()

    def node_rows(self, cons: NDArray[np.int64]
                  ) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """``(node_row, node_arena)`` of the row orders ``cons`` (concatenated)."""
        node_row = np.empty(self.graph.num_nodes, dtype=np.int64)
        node_row[cons] = self.pos_row
        node_arena = np.empty(self.graph.num_nodes, dtype=np.int32)
        node_arena[cons] = self.pos_arena
        return node_row, node_arena

    def classify(self, cons: NDArray[np.int64]) -> tuple[Any, ...]:
        """Group the operand reads of the row orders ``cons`` by (batch, slot) and test each
        group for consecutive rows: ``(node_row, node_arena, read_start, read_batch,
        read_view, read_rows, read_arena, num_views)``; compiled
        (:mod:`edbatch.memory._classify_compiled`) unless ``$EDBATCH_BACKEND`` is
        ``python``, which runs the numpy oracle
        (:func:`~edbatch.memory._classify_numpy.classify_numpy`)."""
        from edbatch.schedule.compiled import resolve_backend

        node_row, node_arena = self.node_rows(cons)
        if resolve_backend() != "compiled":
            return (node_row, node_arena, *classify_numpy(
                self.graph, self.variadic, self.forced, cons,
                np.repeat(np.arange(len(self.sizes)), self.sizes), node_row, node_arena))
        from edbatch.memory._classify_compiled import classify_compiled

        g = self.graph
        (start, batch, view, rows, arena, views) = classify_compiled(
            cons, self.bptr, g.operand_ptr, g.operand_ids, g.op_ids, self.variadic, node_row,
            node_arena, self.forced)
        return node_row, node_arena, start, batch, view, rows, arena, int(views)


class _Layout:
    """Rows of a given row order and placement, with every read classified (vectorised)."""

    def __init__(self, graph: Graph, schedule: Schedule,
                 orders: Sequence[NDArray[np.int32]] | None, placement: Iterable[int],
                 frame: _Frame | None = None, cons: NDArray[np.int64] | None = None,
                 classified: tuple[Any, ...] | None = None) -> None:
        """Row ``orders`` per batch, or ``cons``: them concatenated (``int64``); ``frame``:
        the :class:`_Frame` of ``placement`` (built here if not given); ``classified``:
        ``frame.classify(cons)`` if already made."""
        self.graph, self.schedule, self.orders = graph, schedule, orders
        frame = _Frame(graph, schedule, placement) if frame is None else frame
        self.widths, self.rows = frame.widths, frame.rows
        self.start, self.stop, self.arena = frame.start, frame.stop, frame.arena
        if cons is None:
            assert orders is not None
            cons = np.concatenate(orders).astype(np.int64) if orders else np.zeros(0, np.int64)
        self.cons = cons
        (self.node_row, self.node_arena, self.read_start, self.read_batch, self.read_view,
         self.read_rows, self.read_arena, self.num_views) = (
            frame.classify(cons) if classified is None else classified)
        self._frame = frame

    def _classify_numpy(self, cons: NDArray[np.int64], batch: NDArray[np.int64]) -> None:
        """The reads of the numpy oracle (:mod:`edbatch.memory._classify_numpy`) as this
        layout's."""
        (self.read_start, self.read_batch, self.read_view, self.read_rows, self.read_arena,
         self.num_views) = classify_numpy(self.graph, self._frame.variadic, self._frame.forced,
                                          cons, batch, self.node_row, self.node_arena)

    def plan(self, strategy: str, seconds: float) -> MemoryPlan:
        """Freeze into a :class:`MemoryPlan`."""
        # Plain Python ints and one read-only copy sliced per read (the builder makes ~2
        # objects a read: no numpy scalars, no per-item copies)
        starts = self.read_start
        stops = np.append(starts[1:], len(self.read_rows)) if len(starts) else starts
        rows = np.ascontiguousarray(self.read_rows, dtype=np.int64)
        rows.setflags(write=False)
        # a view's rows ascend by one (first <= last); a gather's rows are a read-only slice:
        # what Region's and Operand's checks would test, so the builder skips them
        operands = _operands.build(
            len(self._frame.sizes), self.read_batch.tolist(), self.read_view.tolist(),
            self.read_arena[starts].tolist(), starts.tolist(), stops.tolist(),
            rows[starts].tolist(), rows[stops - 1].tolist(), rows)
        flat = self.cons.astype(np.int32)
        flat.setflags(write=False)
        for a in (self.node_row, self.node_arena):
            a.setflags(write=False)
        return MemoryPlan.of_flat(  # (row orders and output regions made if read)
            strategy, tuple(zip(self.rows, self.widths, strict=True)), self.node_row,
            self.node_arena, flat, self._frame.bptr.tolist(),
            (self.arena.tolist(), self.start.tolist(), self.stop.tolist()),
            operands, tuple(self._frame.forced.tolist()), seconds)


def _aligned_cons(frame: _Frame) -> NDArray[np.int64]:
    """The ``aligned`` row orders of ``frame``'s schedule, concatenated (``int64``): the
    compiled pass on the frame's arrays, or the numpy oracle under ``$EDBATCH_BACKEND=python``
    (:func:`~edbatch.memory._aligned.aligned_orders`)."""
    from edbatch.memory._aligned_compiled import aligned_cons_compiled
    from edbatch.schedule.compiled import resolve_backend

    if resolve_backend() == "compiled":
        return aligned_cons_compiled(frame.graph, frame.nodes, frame.bptr, frame.forced,
                                     frame.width)
    orders = aligned_orders(frame.graph, frame.schedule)
    return np.concatenate(orders).astype(np.int64) if orders else np.zeros(0, np.int64)
