"""Rollout lookahead: one step of policy improvement over base policies, at schedule time.

Bertsekas' *fortified rollout* applied to the batching MDP. At every decision each ready op
type is tried on a copy of the frontier and the rest of the graph is completed with each base
policy; the decision whose completion needs the fewest batches wins. The best complete
schedule found so far is kept and followed when no candidate beats it, so the result never
needs more batches than any base policy run alone (and is usually well below: on lattices the
critical-path rule's 1.24-1.37 x LB drops to 1.09-1.15 x LB).

The cost is one base rollout per (decision, candidate, base): quadratic in the number of
decisions. ``budget`` caps the batches popped inside rollouts; once it is spent (or the best
schedule already meets the lower bound, which no schedule can beat) the kept schedule is
followed as is. The budget is counted in batches, not seconds, so a given graph always gets
the same schedule.

The search runs on the compiled core (:mod:`edbatch.schedule.compiled_rollout`, the same
schedule, ~30x faster) when the objective is the batch count and every base is a compiled
rule or FSM; ``backend="python"`` / ``EDBATCH_BACKEND=python`` keeps this module's search, the
oracle. ``level=2`` nests it: each candidate is completed by a budgeted level-1 rollout.

The objective is a cost summed over the schedule's batches: by default the batch count (a cost
of 1 per batch), or any ``(op type, batch size) -> cost`` such as a calibrated cost model's
milliseconds (:mod:`edbatch.executor.cost_schedule` passes its model in; this module imports
nothing from the executor).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from edbatch.graph.ir import Graph, OpType
from edbatch.schedule.bounds import lower_bound
from edbatch.schedule.compiled import resolve_backend
from edbatch.schedule.compiled_rollout import compiled_bases, compiled_rollout
from edbatch.schedule.frontier import Frontier
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.schedule import Batch, Schedule

__all__ = ["Cost", "RolloutScheduler", "rollout_schedule"]

#: Default cap on the batches popped inside rollouts per graph, about 10 s of search on this
#: project's 2-core VM (a 64-lattice cell graph of about 8,000 nodes uses 0.05-0.15M; a
#: primitive one would need tens of millions and gets a partial improvement).
DEFAULT_BUDGET = 300_000

#: Level 2's search per candidate completion (a level-1 rollout searching this many batches).
DEFAULT_INNER_BUDGET = 30_000


#: ``(op type, batch size) -> cost`` of one batch (e.g. modelled milliseconds).
Cost = Callable[[OpType, int], float]


def rollout_schedule(graph: Graph, bases: Sequence[Callable[[], Policy]], *,
                     budget: int = DEFAULT_BUDGET, name: str = "rollout",
                     cost: Cost | None = None, retry_planned: bool = False,
                     backend: str | None = None, level: int = 1,
                     inner_budget: int = DEFAULT_INNER_BUDGET,
                     plan_budget: int = DEFAULT_BUDGET) -> Schedule:
    """Schedule ``graph`` by fortified rollout over the ``bases`` (policy factories).

    Args:
        graph: the graph to schedule.
        bases: factories of the base policies; each rollout gets a fresh policy, so stateful
            policies (statistics, per-graph caches) are safe.
        budget: most batches popped inside rollouts; afterwards the best schedule found is
            followed without further search.
        name: the schedule's name.
        cost: what a schedule costs, summed over its batches. ``None`` counts batches (a
            cost of 1 per batch), and then the search also stops once the best schedule
            meets the lower bound. A cost model (e.g.
            :class:`edbatch.executor.cost_model.CostModel`) minimises modelled time.
        retry_planned: at a decision the planned op type is not tried (the plan already
            completes it); with ``True``, once another candidate has beaten the plan, the
            formerly planned type is tried as well (more rollouts, sometimes another
            schedule; :func:`edbatch.executor.cost_schedule.cost_rollout_schedule` does).
        backend: ``compiled`` (default, or ``$EDBATCH_BACKEND``) runs the search on the
            compiled core (:mod:`edbatch.schedule.compiled_rollout`, the same schedule) when
            ``cost`` is ``None`` and every base is one the core runs (the registry's rules,
            an FSM with a compiled encoding and fallback); ``python`` forces this module's
            search, the oracle.
        level: 1 (Bertsekas' rollout) or 2 (rollout of a rollout, batch count only): the
            first plan is a level-1 rollout searching ``plan_budget`` batches, then every
            candidate is completed by a level-1 rollout searching ``inner_budget``; ``budget``
            counts every batch popped inside, the nested ones included.

    Returns:
        A schedule that costs no more than the best base policy on ``graph``.

    Raises:
        ValueError: no base policy, a negative budget, or a level other than 1 and 2
            (level 2 with a ``cost``).
    """
    if not bases:
        raise ValueError(f"{name} needs at least one base policy, e.g. [CriticalPathPolicy]")
    if min(budget, inner_budget, plan_budget) < 0:
        raise ValueError(f"budget={budget}, inner_budget={inner_budget}, plan_budget="
                         f"{plan_budget}: a budget is negative; pass 0 (no search) or more")
    if level not in (1, 2) or (level == 2 and cost is not None):
        raise ValueError(f"level={level}: choose 1 or 2 (level 2 counts batches: no cost)")
    probes = [b() for b in bases]  # one instance each, for what the bases are
    if cost is None and resolve_backend(backend) == "compiled":
        core_bases = compiled_bases(probes)
        if core_bases is not None:
            return compiled_rollout(graph, core_bases, budget=budget, name=name,
                                    retry_planned=retry_planned, level=level,
                                    inner_budget=inner_budget, plan_budget=plan_budget)[0]
    t0 = time.perf_counter()
    typewise = any(getattr(p, "needs_typewise", False) for p in probes)
    frontier = Frontier(graph, typewise=typewise)
    search = (_Search(graph, tuple(bases), budget, cost, retry_planned) if level == 1 else
              _Search2(graph, tuple(bases), budget, inner_budget, plan_budget))
    search.complete(frontier.copy(), 0.0, None)
    batches: list[Batch] = []
    while True:  # drive(), keeping the popped prefix's cost as it grows
        while (forced := frontier.pop_forced()) is not None:
            batches.append(forced)
            search.prefix += search.cost_of((forced,))
        if frontier.done:
            break
        b = frontier.pop(search.decide(frontier))
        batches.append(b)
        search.prefix += search.cost_of((b,))
    return Schedule(tuple(batches), name, seconds=time.perf_counter() - t0)


class _Search:
    """The state of one fortified rollout: the best complete schedule found so far (its cost
    and its decisions from the current one on), the budget spent, the prefix's cost."""

    def __init__(self, graph: Graph, bases: tuple[Callable[[], Policy], ...], budget: int,
                 cost: Cost | None, retry_planned: bool = False) -> None:
        self.bases, self.budget, self.cost, self.graph = bases, budget, cost, graph
        self.vocab = graph.vocab
        self.retry_planned = retry_planned
        # no schedule costs less than the floor: batches have the lower bound, others none
        self.floor: float = lower_bound(graph) if cost is None else -math.inf
        self.best_cost = math.inf
        self.best_tail: list[int] = []
        self.spent = 0
        self.prefix = 0.0  # the cost of the batches popped so far on the real frontier

    def cost_of(self, batches: Sequence[Batch]) -> float:
        if self.cost is None:
            return len(batches)
        return sum(self.cost(self.vocab[b.op_id], len(b)) for b in batches)

    def complete(self, start: Frontier, prefix_cost: float, first: int | None) -> None:
        """Complete ``start`` (whose popped batches cost ``prefix_cost``) with every base
        (the last one consumes it); keep the cheapest complete schedule."""
        for i, base in enumerate(self.bases):
            f = start if i == len(self.bases) - 1 else start.copy()
            policy = base()
            tail = drive(f, lambda fr, p=policy: int(p.choose(fr.view())))
            self.spent += len(tail)
            total = prefix_cost + self.cost_of(tail)
            if total < self.best_cost - 1e-12:
                self.best_cost = total
                decisions = [b.op_id for b in tail if not b.forced]
                self.best_tail = decisions if first is None else [first, *decisions]

    def decide(self, f: Frontier) -> int:
        """Try every other ready type (budget and floor permitting); follow the best."""
        ready = f.view().ready_ops
        if len(ready) > 1 and self.spent < self.budget and self.best_cost > self.floor:
            planned = self.best_tail[0]
            for a in ready:
                if a != (self.best_tail[0] if self.retry_planned else planned):
                    trial = f.copy()
                    popped = trial.pop(a)
                    self.complete(trial, self.prefix + self.cost_of((popped,)), a)
        action, self.best_tail = self.best_tail[0], self.best_tail[1:]
        return action


def _level1(search: _Search, f: Frontier) -> tuple[int, list[int]]:
    """Run ``search`` (a level-1 rollout) from ``f`` (consumed) to the end: its batch count
    and decisions (``rollout_schedule``'s loop without the batches)."""
    search.complete(f.copy(), 0.0, None)
    decisions: list[int] = []
    while True:
        while f.pop_forced() is not None:
            search.prefix += 1
        if f.done:
            return int(search.prefix), decisions
        decisions.append(search.decide(f))
        f.pop(decisions[-1])
        search.prefix += 1


class _Search2(_Search):
    """Level 2: every completion is a level-1 rollout (the first one searching
    ``plan_budget``, the others ``inner_budget``); the compiled twin is
    :mod:`edbatch.schedule._compiled_rollout`."""

    def __init__(self, graph: Graph, bases: tuple[Callable[[], Policy], ...], budget: int,
                 inner_budget: int, plan_budget: int) -> None:
        super().__init__(graph, bases, budget, None)
        self.inner_budget, self.plan_budget = inner_budget, plan_budget

    def complete(self, start: Frontier, prefix_cost: float, first: int | None) -> None:
        inner = _Search(self.graph, self.bases,
                        self.plan_budget if first is None else self.inner_budget, None)
        inner.floor = self.floor - prefix_cost
        nb, decisions = _level1(inner, start)
        self.spent += inner.spent + nb
        if prefix_cost + nb < self.best_cost - 1e-12:
            self.best_cost = prefix_cost + nb
            self.best_tail = decisions if first is None else [first, *decisions]


class RolloutScheduler:
    """:func:`rollout_schedule` as a :data:`~edbatch.schedule.policy.Scheduler`.

    Args:
        bases: base policy factories (e.g. ``[CriticalPathPolicy, TypewiseGreedyPolicy]``).
        budget, level, inner_budget, plan_budget: see :func:`rollout_schedule`.
        name: the scheduler name recorded in schedules and metrics.
        backend: ``compiled`` / ``python`` / ``None`` (``$EDBATCH_BACKEND``).
    """

    def __init__(self, bases: Sequence[Callable[[], Policy]], *, budget: int = DEFAULT_BUDGET,
                 name: str = "rollout", level: int = 1,
                 inner_budget: int = DEFAULT_INNER_BUDGET,
                 plan_budget: int = DEFAULT_BUDGET, backend: str | None = None) -> None:
        if not bases:
            raise ValueError("RolloutScheduler needs at least one base policy")
        self.bases, self.budget, self.name = tuple(bases), budget, name
        self.level, self.inner_budget, self.plan_budget = level, inner_budget, plan_budget
        self.backend = backend

    def __call__(self, graph: Graph) -> Schedule:
        return rollout_schedule(graph, self.bases, budget=self.budget, name=self.name,
                                level=self.level, inner_budget=self.inner_budget,
                                plan_budget=self.plan_budget, backend=self.backend)

    def __repr__(self) -> str:
        return f"RolloutScheduler({self.name}, budget={self.budget}, level={self.level})"
