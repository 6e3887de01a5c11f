"""The exact optimum of the batching MDP, by depth-first branch and bound.

The MDP is the one of docs/architecture.md 3.4: a decision runs *all* ready nodes of one
batchable op type as one batch; ready unbatchable nodes run alone as forced steps before
every decision. The cost of a trajectory is its number of batches, forced ones included, so
the optimum is the fewest kernel launches any MDP policy can reach. (Every valid schedule,
MDP-shaped or not, can be replayed as an MDP trajectory with no more batches, see
:func:`_replay`, so this is also the optimum over all schedules.)

Search:

* state: the set of executed nodes, held as a :class:`Frontier` with type-wise counts;
* heuristic ``h``: :func:`remaining_lower_bound` over the ready nodes, with the per-node
  chain lengths ``down`` computed once. It is admissible (a lower bound) and consistent:
  a decision on type ``a`` shortens only type ``a``'s longest chain, by at most one;
* incumbent: the best of the non-learned heuristics, so search stops at once when one of
  them already meets the root bound (the usual case on trees and chains);
* transposition table: executed-set bitmask -> smallest ``g`` seen; a state reached again
  with no smaller ``g`` is pruned;
* dominance: a ready type whose ready nodes are all its unexecuted nodes is taken at once as
  the only child (proof at :func:`_dominant`);
* child order: smallest ``f = g + h`` first, then the largest type-wise ratio ``|F|/T``.

The budget counts the states generated (frontier copies: the work), and only the states on
the current path keep a frontier (their open siblings are ``(f, ratio, action)`` tuples), so
work and memory stay bounded on graphs of many op types; an optional time limit bounds the
wall time too (a state costs about ``n + ready x k`` steps). When either runs out the result
is ``"gave_up"`` with the incumbent and the best proven bound: the smallest ``f`` over the
open states (never below the root bound).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import ScheduleError
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import lower_bound, remaining_lower_bound, type_chain_lengths
from edbatch.schedule.frontier import Frontier
from edbatch.schedule.named import make_heuristic
from edbatch.schedule.schedule import Batch, Schedule

__all__ = ["ExactResult", "ExactScheduler", "exact_schedule"]


@dataclass(frozen=True)
class ExactResult:
    """Outcome of :func:`exact_schedule`.

    Attributes:
        status: ``"optimal"`` when ``num_batches`` is proven minimal, ``"gave_up"`` when the
            state budget or the time limit ran out first.
        num_batches: batches of the best schedule found (an upper bound on the optimum).
        lower_bound: best proven lower bound; equals ``num_batches`` when optimal.
        schedule: the best schedule found (scheduler name ``"exact"``).
        expanded: search states expanded (their children generated).
        seconds: wall time, heuristics and static analysis included.
        generated: search states generated (each a frontier copy): what the budget counts.
    """

    status: Literal["optimal", "gave_up"]
    num_batches: int
    lower_bound: int
    schedule: Schedule
    expanded: int
    seconds: float
    generated: int = 0

    @property
    def optimal(self) -> bool:
        """Whether the result is proven optimal."""
        return self.status == "optimal"


class _Node:
    """A state on the search path: its frontier, executed set, cost so far and the step
    that reached it (the open siblings of each level are kept as small tuples, not as
    states: :meth:`_Search.children`)."""

    __slots__ = ("done", "frontier", "g", "parent", "step")

    def __init__(self, frontier: Frontier, done: NDArray[np.bool_], g: int,
                 parent: _Node | None, step: tuple[Batch, ...]) -> None:
        self.frontier, self.done, self.g = frontier, done, g
        self.parent, self.step = parent, step

    def batches(self) -> list[Batch]:
        """Every batch from the root to this node, in order."""
        parts: list[tuple[Batch, ...]] = []
        node: _Node | None = self
        while node is not None:
            parts.append(node.step)
            node = node.parent
        return [b for part in reversed(parts) for b in part]


#: An open child: ``(f, ratio, action)``; a level's list is sorted best last.
_Open = tuple[int, float, int]


def _clone(frontier: Frontier) -> Frontier:
    """An independent copy of ``frontier`` (static parts shared)."""
    return frontier.copy()


def _drain(frontier: Frontier) -> list[Batch]:
    """Run every forced (unbatchable) step that is ready, as the MDP does."""
    out = []
    while (b := frontier.pop_forced()) is not None:
        out.append(b)
    return out


def _dominant(frontier: Frontier, ready: NDArray[np.int64]) -> int:
    """A ready type all of whose unexecuted nodes are ready, or ``-1``.

    Taking such a type ``a`` at once is safe. *Monotonicity:* if executed sets satisfy
    ``S <= S'`` (subset), replaying any action sequence from ``S'`` (skipping actions with no
    ready node) keeps the executed set a superset of the one reached from ``S`` -- a node
    ready at ``S`` is, at ``S'``, ready or executed -- so ``OPT(S') <= OPT(S)``. Now let
    ``seq`` be an optimal sequence from ``S``; it holds at least one ``a``-decision, because
    the ``a``-nodes must run. After taking ``a`` first, no ``a``-node is left, so replaying
    ``seq`` skips all its ``a``-decisions and costs at most ``len(seq) - 1`` more decisions:
    ``1 + (len(seq) - 1) <= len(seq)``. Unbatchable nodes cost one batch each on every path.
    Hence some optimal sequence starts with ``a``: taking more nodes earlier never hurts.
    """
    full = ready[frontier.ready_count[ready] == frontier.remaining_count[ready]]
    return int(full[0]) if len(full) else -1


class _Search:
    """Depth-first branch and bound over frontier states of one graph.

    Work and memory are bounded by the budget: it counts the states *generated* (each a
    frontier copy, the search's unit of work: one expansion of a state with ``k`` ready
    types makes ``k``), and only the states on the current path keep a frontier; their open
    siblings are ``(f, ratio, action)`` tuples, rebuilt from their parent when taken. (Each
    open child kept its own frontier copy and executed set before: on a 3,000-node graph of
    300 op types that held 6.5 GB within 150 s.)"""

    def __init__(self, graph: Graph, node_budget: int, deadline: float = math.inf) -> None:
        self.graph = graph
        self.budget, self.deadline = node_budget, deadline
        self.down = type_chain_lengths(graph)
        self.batchable = graph.vocab.batchable
        self.solo_types = ~self.batchable
        self.table: dict[bytes, int] = {}
        self.expanded = self.generated = 0
        self.best_cost = np.iinfo(np.int64).max
        self.best_batches: list[Batch] = []

    def h(self, frontier: Frontier) -> int:
        """Admissible estimate of the batches still needed from ``frontier``."""
        unbatchable_left = int(frontier.remaining_count[self.solo_types].sum())
        return remaining_lower_bound(self.down, self.batchable, frontier.all_ready(),
                                     unbatchable_left)

    def root(self) -> tuple[_Node, int]:
        """The root state and its ``f``."""
        frontier = Frontier(self.graph, typewise=True)
        step = tuple(_drain(frontier))
        done = np.zeros(self.graph.num_nodes, dtype=bool)
        for b in step:
            done[b.node_ids] = True
        g = len(step)
        return _Node(frontier, done, g, None, step), g + self.h(frontier)

    def offer(self, cost: int, batches: list[Batch]) -> None:
        """Record a complete schedule if it beats the incumbent."""
        if cost < self.best_cost:
            self.best_cost, self.best_batches = cost, batches

    def child(self, node: _Node, a: int) -> _Node:
        """The state that deciding ``a`` at ``node`` leads to (forced steps included)."""
        frontier = _clone(node.frontier)
        step = (frontier.pop(a), *_drain(frontier))
        done = node.done.copy()
        for b in step:
            done[b.node_ids] = True
        return _Node(frontier, done, node.g + len(step), node, step)

    def children(self, node: _Node) -> list[_Open]:
        """Open children of ``node`` as ``(f, ratio, action)``, best last; completed ones
        update the incumbent. Each child is generated (counted) once here; the one taken
        is rebuilt by :meth:`child`."""
        fr = node.frontier
        ready = np.flatnonzero(fr.mask())
        dom = _dominant(fr, ready)
        actions = [dom] if dom >= 0 else ready.tolist()
        tw = fr.typewise_count
        assert tw is not None
        kids: list[_Open] = []
        for a in actions:
            ratio = float(fr.ready_count[a]) / max(int(tw[a]), 1)
            kid = self.child(node, a)
            self.generated += 1
            if kid.frontier.done:
                self.offer(kid.g, kid.batches())
                continue
            f = kid.g + self.h(kid.frontier)
            if f >= self.best_cost:
                continue
            key = np.packbits(kid.done).tobytes()
            seen = self.table.get(key)
            if seen is not None and seen <= kid.g:
                continue
            self.table[key] = kid.g
            kids.append((f, ratio, a))
        kids.sort(key=lambda c: (-c[0], c[1]))  # popped from the end: best last
        return kids

    def run(self, root: _Node, root_lb: int) -> int:
        """Search from ``root`` (its ``f`` is ``root_lb``) until proven optimal or out of
        budget; return the proven lower bound (called only when the incumbent does not
        meet ``root_lb``)."""
        if self.budget <= 0:  # no search: the root's bound
            return root_lb
        stack: list[tuple[_Node, list[_Open]]] = []
        node: _Node | None = root
        while True:
            if node is not None:  # expand it
                self.expanded += 1
                stack.append((node, self.children(node)))
                if self.best_cost <= root_lb:
                    break
                node = None
            if not stack:
                break
            parent, open_ = stack[-1]
            if not open_:
                stack.pop()
                continue
            if open_[-1][0] >= self.best_cost:
                open_.pop()
                continue
            if self.generated >= self.budget or time.perf_counter() > self.deadline:
                open_f = min((c[0] for _, level in stack for c in level
                              if c[0] < self.best_cost), default=int(self.best_cost))
                return max(root_lb, min(int(self.best_cost), open_f))
            node = self.child(parent, open_.pop()[2])
        return int(self.best_cost)


def _replay(graph: Graph, schedule: Schedule) -> list[Batch]:
    """Turn any valid schedule into an MDP trajectory with no more batches.

    For each batch of the schedule in order, take its op type if it has ready nodes (every
    ready node of that type runs); forced steps run whenever ready. The executed set stays a
    superset of the schedule's, so every decision is matched or skipped.
    """
    frontier = Frontier(graph)
    out = _drain(frontier)
    for b in schedule.batches:
        if frontier.done:
            break
        if graph.vocab.batchable[b.op_id] and frontier.ready_count[b.op_id]:
            out.append(frontier.pop(b.op_id))
            out.extend(_drain(frontier))
    return out


def _heuristic_incumbents(graph: Graph) -> list[Schedule]:
    """The heuristics' schedules the search starts from, on the compiled core (the same
    schedules as their Python forms, which cost a type-wise frontier in Python: 2 minutes
    on a 200,000-node chain)."""
    return [make_heuristic(name)(graph) for name in
            ("typewise_greedy", "typewise_greedy_backward", "ed_batch_agenda", "depth")]


def exact_schedule(graph: Graph, *, node_budget: int = 200_000,
                   initial: Schedule | None = None, time_limit: float | None = None
                   ) -> ExactResult:
    """The minimum number of batches of ``graph`` under the batching MDP.

    Args:
        graph: the graph to schedule.
        node_budget: most search states to generate (the search's work: expanding a state
            with ``k`` ready op types generates ``k``) before giving up.
        initial: a valid schedule to start from (e.g. a learned policy's); the best
            heuristic schedule is used as well.
        time_limit: seconds of search before giving up as on a spent budget (``None``: none;
            a state costs about ``n + ready x k`` steps, so on graphs of thousands of nodes and
            op types the budget alone can take many minutes).

    Returns:
        An :class:`ExactResult`; with ``status == "gave_up"`` its ``lower_bound`` is the best
        bound proven before the budget ran out.

    Raises:
        ScheduleError: ``initial`` is not a valid schedule of ``graph``.

    Example:
        >>> import numpy as np
        >>> from edbatch.workloads.synthetic import chains
        >>> r = exact_schedule(chains(np.random.default_rng(1), 3, 6, 3))
        >>> r.status, r.num_batches == r.lower_bound
        ('optimal', True)
    """
    t0 = time.perf_counter()
    if initial is not None:
        initial.validate(graph)
    if graph.num_nodes == 0:  # Frontier cannot be built on an empty graph
        empty = Schedule((), "exact", seconds=time.perf_counter() - t0)
        return ExactResult("optimal", 0, 0, empty, 0, empty.seconds)
    candidates = _heuristic_incumbents(graph) + ([initial] if initial is not None else [])
    first = min(candidates, key=lambda s: s.num_batches)
    lb = lower_bound(graph)
    if first.num_batches <= lb:  # proven optimal: no search, no type-wise frontier
        seconds = time.perf_counter() - t0
        done = Schedule(first.batches, "exact", seconds=seconds)
        return ExactResult("optimal", lb, lb, done, 0, seconds)
    search = _Search(graph, node_budget,
                     math.inf if time_limit is None else time.perf_counter() + time_limit)
    root, root_lb = search.root()
    for sched in sorted(candidates, key=lambda s: s.num_batches):
        batches = _replay(graph, sched)
        search.offer(len(batches), batches)
    # (a root with every node run, all unbatchable, has its heuristics at LB: returned above)
    proven = root_lb if search.best_cost <= root_lb else search.run(root, root_lb)
    best = int(search.best_cost)
    status: Literal["optimal", "gave_up"] = "optimal" if proven >= best else "gave_up"
    seconds = time.perf_counter() - t0
    schedule = Schedule(tuple(search.best_batches), "exact", seconds=seconds)
    return ExactResult(status, best, min(proven, best), schedule, search.expanded, seconds,
                       search.generated)


class ExactScheduler:
    """:func:`exact_schedule` as a :data:`~edbatch.schedule.policy.Scheduler`.

    Args:
        node_budget: search states generated per graph before settling for the best
            schedule found (see :func:`exact_schedule`).
        time_limit: seconds of search per graph before settling likewise (``None``: none).

    Attributes:
        last_result: the :class:`ExactResult` of the most recent call (``None`` before).
    """

    name = "exact"

    def __init__(self, node_budget: int = 200_000, time_limit: float | None = 60.0) -> None:
        if isinstance(node_budget, bool) or not isinstance(node_budget, int) or node_budget < 0:
            raise ScheduleError(f"ExactScheduler: node_budget must be an int >= 0 (search "
                                f"states per graph), got {node_budget!r}")  # (was a raw
        # TypeError at the first graph, or ran on at -1)
        if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(
                time_limit, (int, float)) or not time_limit > 0):
            raise ScheduleError(f"ExactScheduler: time_limit must be a number of seconds > 0 "
                                f"or None, got {time_limit!r}")
        self.node_budget, self.time_limit = node_budget, time_limit
        self.last_result: ExactResult | None = None

    def __call__(self, graph: Graph) -> Schedule:
        self.last_result = exact_schedule(graph, node_budget=self.node_budget,
                                          time_limit=self.time_limit)
        return self.last_result.schedule

    def __repr__(self) -> str:
        return f"ExactScheduler(node_budget={self.node_budget}, time_limit={self.time_limit})"

