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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import lower_bound
from edbatch.schedule.frontier import Frontier
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.schedule import Schedule

__all__ = ["RolloutScheduler", "rollout_schedule"]

#: Default cap on the batches popped inside rollouts per graph, about 10 s of search on this
#: project's 2-core VM (a 64-lattice cell graph of about 8,000 nodes uses 0.05-0.15M; a
#: primitive one would need tens of millions and gets a partial improvement).
DEFAULT_BUDGET = 300_000


def _complete(frontier: Frontier, policy: Policy) -> list[int]:
    """Run ``policy`` on ``frontier`` (consumed) to the end; return its decisions."""
    batches = drive(frontier, lambda f: int(policy.choose(f.view())))
    return [b.op_id for b in batches if not b.forced]


def rollout_schedule(graph: Graph, bases: Sequence[Callable[[], Policy]], *,
                     budget: int = DEFAULT_BUDGET, name: str = "rollout") -> Schedule:
    """Schedule ``graph`` by fortified rollout over the ``bases`` (policy factories).

    Args:
        graph: the graph to schedule.
        bases: factories of the base policies; each rollout gets a fresh policy, so stateful
            policies (statistics, per-graph caches) are safe.
        budget: most batches popped inside rollouts; afterwards the best schedule found is
            followed without further search.
        name: the schedule's name.

    Returns:
        A schedule with no more batches than the best base policy on ``graph``.

    Raises:
        ValueError: no base policy, or a negative budget.
    """
    if not bases:
        raise ValueError("rollout_schedule needs at least one base policy, e.g. "
                         "[CriticalPathPolicy]")
    if budget < 0:
        raise ValueError(f"budget={budget} is negative; pass 0 (no search) or more")
    t0 = time.perf_counter()
    typewise = any(getattr(b(), "needs_typewise", False) for b in bases)
    frontier = Frontier(graph, typewise=typewise)
    floor = lower_bound(graph)
    best_cost, best_tail = -1, []
    spent = 0

    def search(start: Frontier, first: int | None) -> None:
        """Complete ``start`` with every base (the last one consumes it)."""
        nonlocal best_cost, best_tail, spent
        for i, base in enumerate(bases):
            f = start if i == len(bases) - 1 else start.copy()
            before = f.num_batches
            tail = _complete(f, base())
            spent += f.num_batches - before
            if best_cost < 0 or f.num_batches < best_cost:
                best_cost = f.num_batches
                best_tail = tail if first is None else [first, *tail]

    def decide(f: Frontier) -> int:
        """Try every other ready type (budget and LB permitting); follow the best schedule."""
        nonlocal best_tail
        ready = f.view().ready_ops
        if len(ready) > 1 and spent < budget and best_cost > floor:
            planned = best_tail[0]
            for a in ready:
                if a != planned:
                    trial = f.copy()
                    trial.pop(a)
                    search(trial, a)
        action, best_tail = best_tail[0], best_tail[1:]
        return action

    search(frontier.copy(), None)
    batches = drive(frontier, decide)
    return Schedule(tuple(batches), name, seconds=time.perf_counter() - t0)


class RolloutScheduler:
    """:func:`rollout_schedule` as a :data:`~edbatch.schedule.policy.Scheduler`.

    Args:
        bases: base policy factories (e.g. ``[CriticalPathPolicy, TypewiseGreedyPolicy]``).
        budget: see :func:`rollout_schedule`.
        name: the scheduler name recorded in schedules and metrics.
    """

    def __init__(self, bases: Sequence[Callable[[], Policy]], *, budget: int = DEFAULT_BUDGET,
                 name: str = "rollout") -> None:
        if not bases:
            raise ValueError("RolloutScheduler needs at least one base policy")
        self.bases, self.budget, self.name = tuple(bases), budget, name

    def __call__(self, graph: Graph) -> Schedule:
        return rollout_schedule(graph, self.bases, budget=self.budget, name=self.name)

    def __repr__(self) -> str:
        return f"RolloutScheduler({self.name}, budget={self.budget})"
