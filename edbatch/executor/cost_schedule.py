"""Schedules that minimise modelled time instead of the number of batches.

With a cost model (:class:`~edbatch.executor.cost_model.CostModel`, or any callable
``(op type, batch size) -> cost``) the best schedule is the one whose batches cost least in
sum, not the one with fewest batches: a launch of a cheap op (a slice is a view) costs less
than a launch of an affine layer. Two schedulers optimise that sum:

* :class:`CostGreedyPolicy`: at each decision the ready op type whose batch costs the
  fewest modelled units per node;
* :func:`cost_rollout_schedule`: Bertsekas' fortified rollout (as
  :func:`edbatch.schedule.rollout_schedule`) whose objective is the modelled cost of the
  completed schedule: never worse than its best base policy under the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from edbatch.graph import Graph, OpType, Vocab
from edbatch.schedule.frontier import Frontier, FrontierView
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.schedule import Batch, Schedule

__all__ = ["CostGreedyPolicy", "CostRolloutScheduler", "cost_rollout_schedule"]

#: ``(op type, batch size) -> cost``.
Cost = Callable[[OpType, int], float]


class CostGreedyPolicy:
    """The ready op type whose batch costs least per node, ``cost(op, n) / n`` (ties: the
    lowest op id)."""

    def __init__(self, cost: Cost, vocab: Vocab) -> None:
        self.cost, self.vocab = cost, vocab

    def choose(self, view: FrontierView) -> int:
        best, best_cost = -1, math.inf
        for a in view.ready_ops:
            n = view.count(a)
            c = self.cost(self.vocab[a], n) / n
            if c < best_cost:
                best, best_cost = a, c
        return best


def _batches_cost(batches: Sequence[Batch], cost: Cost, vocab: Vocab) -> float:
    return sum(cost(vocab[b.op_id], len(b)) for b in batches)


def cost_rollout_schedule(graph: Graph, cost: Cost, bases: Sequence[Callable[[], Policy]],
                          *, budget: int = 300_000, name: str = "cost_rollout") -> Schedule:
    """Fortified rollout minimising the modelled cost of the schedule.

    At each decision every ready op type is tried on a copy of the frontier and completed
    with each base policy; the candidate whose completion costs least (modelled, prefix
    included) wins, and the best complete schedule found is followed otherwise, so the
    result costs no more than any base policy alone. ``budget`` caps the batches popped in
    rollouts (counted, not timed: the same graph always gets the same schedule).
    """
    if not bases:
        raise ValueError("cost_rollout_schedule needs at least one base policy")
    t0 = time.perf_counter()
    vocab = graph.vocab
    typewise = any(getattr(b(), "needs_typewise", False) for b in bases)
    frontier = Frontier(graph, typewise=typewise)
    best: list[float] = [math.inf]
    plan: list[int] = []
    spent = 0

    def complete(start: Frontier, prefix_cost: float, first: int | None) -> None:
        nonlocal plan, spent
        for i, base in enumerate(bases):
            f = start if i == len(bases) - 1 else start.copy()
            policy = base()
            tail = drive(f, lambda fr, p=policy: int(p.choose(fr.view())))
            spent += len(tail)
            total = prefix_cost + _batches_cost(tail, cost, vocab)
            if total < best[0] - 1e-12:
                best[0] = total
                decisions = [b.op_id for b in tail if not b.forced]
                plan = decisions if first is None else [first, *decisions]

    prefix = 0.0  # the modelled cost of the batches popped so far

    def decide(f: Frontier) -> int:
        nonlocal plan
        ready = f.view().ready_ops
        if len(ready) > 1 and spent < budget:
            for a in ready:
                if a != plan[0]:
                    trial = f.copy()
                    first = trial.pop(a)
                    complete(trial, prefix + cost(vocab[a], len(first)), a)
        action, plan = plan[0], plan[1:]
        return action

    complete(frontier.copy(), 0.0, None)
    # drive() returns the batches at the end; keep the prefix as it grows
    batches: list[Batch] = []
    while True:
        while (forced := frontier.pop_forced()) is not None:
            batches.append(forced)
            prefix += cost(vocab[forced.op_id], len(forced))
        if frontier.done:
            break
        b = frontier.pop(decide(frontier))
        batches.append(b)
        prefix += cost(vocab[b.op_id], len(b))
    return Schedule(tuple(batches), name, seconds=time.perf_counter() - t0)


class CostRolloutScheduler:
    """:func:`cost_rollout_schedule` as a scheduler (``graph -> Schedule``)."""

    def __init__(self, cost: Cost, bases: Sequence[Callable[[], Policy]], *,
                 budget: int = 300_000, name: str = "cost_rollout") -> None:
        self.cost, self.bases, self.budget, self.name = cost, tuple(bases), budget, name

    def __call__(self, graph: Graph) -> Schedule:
        return cost_rollout_schedule(graph, self.cost, self.bases, budget=self.budget,
                                     name=self.name)
