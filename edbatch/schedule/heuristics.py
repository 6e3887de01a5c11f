"""The batching heuristics edbatch compares against, each named after its source.

See docs/architecture.md 3.8.

Ties are broken deterministically: by ascending op id unless the source says otherwise.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import numpy as np

from edbatch.errors import ScheduleError, is_integer
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import height_list
from edbatch.schedule.frontier import FrontierView
from edbatch.schedule.policy import run_policy
from edbatch.schedule.reverse import reverse_graph
from edbatch.schedule.schedule import Batch, Schedule

__all__ = [
    "AgendaPolicy",
    "CriticalPathPolicy",
    "CompleteLevelAgendaPolicy",
    "DynetAgendaPolicy",
    "MaxFrontierPolicy",
    "RandomPolicy",
    "TypewiseGreedyPolicy",
    "depth_schedule",
    "typewise_greedy_backward",
]

_EPS = 1e-3  # DyNet's sum / (count + 1e-3)


def depth_schedule(graph: Graph) -> Schedule:
    """Depth-based batching (TensorFlow Fold; DyNet ``--dynet-autobatch 2``).

    One batch per distinct (depth, op type), in increasing depth then op id; unbatchable
    nodes run alone. Static, so it needs no frontier: nodes of one depth never depend on
    each other.
    """
    t0 = time.perf_counter()
    n = graph.num_nodes
    depth = graph.depth.astype(np.int64)
    op = graph.op_ids.astype(np.int64)
    # Unbatchable nodes get a key of their own so they stay singletons.
    solo = ~graph.batchable_node
    group = np.where(solo, len(graph.vocab) + np.arange(n), op)
    order = np.lexsort((np.arange(n), group, depth))
    d, gk = depth[order], group[order]
    cuts = np.flatnonzero((np.diff(d) != 0) | (np.diff(gk) != 0)) + 1
    batches = tuple(
        Batch(int(op[part[0]]), part.astype(np.int32), forced=bool(solo[part[0]]))
        for part in np.split(order, cuts) if len(part))
    return Schedule(batches, "depth", seconds=time.perf_counter() - t0)


class DynetAgendaPolicy:
    """DyNet's agenda (``--dynet-autobatch 1``): lowest *static* mean depth of the type.

    The mean is over all nodes of the type in the graph, ``sum / (count + 1e-3)``. Candidates
    are scanned in op-id order; on a tie the later one wins unless its op kind is complex
    (matrix products are deferred, as in DyNet).
    """

    def __init__(self) -> None:
        self._graph: Graph | None = None

    def _prepare(self, graph: Graph) -> None:
        k = len(graph.vocab)
        total = np.bincount(graph.op_ids, weights=graph.depth, minlength=k)
        self._mean = (total / (graph.type_counts + _EPS)).tolist()
        self._complex = [op.is_complex for op in graph.vocab]
        self._graph = graph

    def choose(self, view: FrontierView) -> int:
        """Pick the ready type with the lowest static mean depth."""
        if view.graph is not self._graph:
            self._prepare(view.graph)
        best, best_avg = -1, np.inf
        for a in view.ready_ops:
            avg = self._mean[a]
            if avg < best_avg or (avg == best_avg and not self._complex[a]):
                best, best_avg = a, avg
        return best


class AgendaPolicy:
    """ED-Batch's agenda (``--ooc-autobatch 1``): lowest mean depth of *remaining* nodes.

    The mean is the exact one over the type's unexecuted nodes, ``sum / count`` (a ready type
    has at least one), updated after every batch; ties go to the smallest op id, as ED-Batch's
    ``AgendaScheduler`` does (DyNet's ``sum / (count + 1e-3)`` would break ties of equal means
    towards the type with fewer nodes).
    """

    def choose(self, view: FrontierView) -> int:
        """Pick the ready type with the lowest remaining mean depth."""
        best, best_avg = -1, np.inf
        for a in view.ready_ops:
            count, depth_sum = view.remaining(a)
            avg = depth_sum / count
            if avg < best_avg:
                best, best_avg = a, avg
        return best


class CompleteLevelAgendaPolicy:
    """DyNet strategy 3: agenda restricted to types whose ready nodes complete their levels.

    A ready type qualifies when, for every depth among its ready nodes, all its unexecuted
    nodes of that depth are ready. Among qualifying types (or all ready types if none
    qualifies) it picks the lowest static mean depth, like :class:`DynetAgendaPolicy`.
    """

    def __init__(self) -> None:
        self._agenda = DynetAgendaPolicy()
        self._graph: Graph | None = None
        self._frontier: Callable[[], object | None] = lambda: None

    def choose(self, view: FrontierView) -> int:
        """Pick among types whose ready nodes make up whole (depth, type) groups."""
        graph = view.graph
        if graph is not self._graph:
            self._agenda._prepare(graph)
            self._width = int(graph.depth.max()) + 1
            self._key = graph.op_ids.astype(np.int64) * self._width + graph.depth
            self._graph = graph
        frontier = view._frontier
        if self._frontier() is not frontier:  # another run (or a copy): count it afresh
            # Unexecuted node count per (op, depth), flattened, of the frontier it is given;
            # the policy's own choices are executed by the caller, so it keeps this count
            # itself. (Made once per policy, a second run on the same graph read the
            # counts the first had used up: 436 then 698 batches on a lattice mini-batch.)
            todo = np.asarray(frontier._pending) > 0
            todo[frontier.all_ready()] = True
            self._pairs = np.bincount(self._key[todo],
                                      minlength=len(graph.vocab) * self._width)
            self._frontier = weakref.ref(frontier)
            # per type: whether it qualifies, for the ready count it had when checked (a
            # type's ready nodes only grow until it runs, and its groups change only then)
            self._qual = [False] * len(graph.vocab)
            self._seen = [-1] * len(graph.vocab)
        ready = view.ready_ops
        qualifying = []
        qual, seen = self._qual, self._seen
        for a in ready:
            c_a = view.count(a)
            if seen[a] != c_a:  # (checked again only when new nodes of a became ready)
                nodes = view.ready_nodes(a)
                d, c = np.unique(graph.depth[nodes], return_counts=True)
                qual[a], seen[a] = bool(np.array_equal(self._pairs[a * self._width + d], c)), c_a
            if qual[a]:
                qualifying.append(a)
        best, best_avg = -1, np.inf
        for a in qualifying or ready:
            avg = self._agenda._mean[a]
            if avg < best_avg or (avg == best_avg and not self._agenda._complex[a]):
                best, best_avg = a, avg
        nodes = view.ready_nodes(best)
        np.subtract.at(self._pairs, best * self._width + graph.depth[nodes].astype(np.int64), 1)
        seen[best] = -1  # (it runs now: its groups change)
        return best


class MaxFrontierPolicy:
    """Greedy: the ready type with the most ready nodes (ties: smallest op id)."""

    def choose(self, view: FrontierView) -> int:
        """Pick the largest ready batch."""
        return max(view.ready_ops, key=lambda a: (view.count(a), -a))


class TypewiseGreedyPolicy:
    """Type-wise ratio greedy, forward: the ready type maximising ``|F(a)| / T(a)``.

    ``T(a)`` is the type-wise frontier count (docs/architecture.md 3.2); the ratio is
    ED-Batch's reward term. Ties go to the smallest op id.
    """

    needs_typewise = True

    def choose(self, view: FrontierView) -> int:
        """Pick the most complete ready batch."""
        best, best_ratio = -1, -1.0
        for a in view.ready_ops:
            ratio = view.count(a) / max(view.typewise(a), 1)
            if ratio > best_ratio:
                best, best_ratio = a, ratio
        return best


class CriticalPathPolicy:
    """Critical path first: the type whose ready nodes include the one with the longest
    remaining path to a sink (list scheduling's classic priority), ties broken by the
    type-wise ratio ``|F(a)|/T(a)`` and then the smallest op id.

    edbatch's addition to the heuristics: delaying the node on the critical path delays the
    end of the schedule, while the ratio prefers batches that no later node could join.
    """

    needs_typewise = True

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._height: list[int] = []

    def choose(self, view: FrontierView) -> int:
        """Pick the type holding the highest ready node."""
        if view.graph is not self._graph:
            self._graph, self._height = view.graph, height_list(view.graph)
        h = self._height
        best, best_key = -1, (-1, -1.0)
        for a in view.ready_ops:
            top = view.max_over_ready(a, h)
            key = (top, view.count(a) / max(view.typewise(a), 1))
            if key > best_key:
                best, best_key = a, key
        return best


def typewise_greedy_backward(graph: Graph) -> Schedule:
    """ED-Batch strategy 8 (``typewiseLB``): the type-wise greedy run from the sinks.

    Schedules the reversed graph with :class:`TypewiseGreedyPolicy` and reverses the batch
    list, which is a valid forward schedule.
    """
    t0 = time.perf_counter()
    rev = reverse_graph(graph)
    n = graph.num_nodes
    back = run_policy(rev, TypewiseGreedyPolicy())
    batches = tuple(Batch(b.op_id, np.sort((n - 1 - b.node_ids).astype(np.int32)), b.forced)
                    for b in reversed(back.batches))
    return Schedule(batches, "typewise_greedy_backward", seconds=time.perf_counter() - t0)


class RandomPolicy:
    """Uniformly random ready type, from a seeded ``numpy`` generator."""

    def __init__(self, seed: int | np.random.Generator = 0) -> None:
        if not isinstance(seed, np.random.Generator) and (not is_integer(seed) or seed < 0):
            raise ScheduleError(f"RandomPolicy: seed must be an int >= 0 or a numpy Generator, "
                                f"got {seed!r}")  # (numpy's bare 'expected non-negative integer')
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def choose(self, view: FrontierView) -> int:
        """Pick any ready type."""
        ready = view.ready_ops
        return ready[int(self.rng.integers(len(ready)))]
