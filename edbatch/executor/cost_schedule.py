"""Schedules that minimise modelled time instead of the number of batches.

With a cost model (:class:`~edbatch.executor.cost_model.CostModel`, or any callable
``(op type, batch size) -> cost``) the best schedule is the one whose batches cost least in
sum, not the one with fewest batches: a launch of a cheap op (a slice is a view) costs less
than a launch of an affine layer. Two schedulers optimise that sum:

* :class:`CostGreedyPolicy`: at each decision the ready op type whose batch costs the
  fewest modelled units per node;
* :func:`cost_rollout_schedule`: Bertsekas' fortified rollout (as
  :func:`edbatch.schedule.rollout_schedule`, the same code, given the cost function) whose
  objective is the modelled cost of the completed schedule: never worse than its best base
  policy under the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from edbatch.graph import Graph, Vocab
from edbatch.schedule.frontier import FrontierView
from edbatch.schedule.policy import Policy
from edbatch.schedule.rollout import DEFAULT_BUDGET, Cost, rollout_schedule
from edbatch.schedule.schedule import Schedule

__all__ = ["CostGreedyPolicy", "CostRolloutScheduler", "cost_rollout_schedule"]


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


def cost_rollout_schedule(graph: Graph, cost: Cost, bases: Sequence[Callable[[], Policy]],
                          *, budget: int = DEFAULT_BUDGET, name: str = "cost_rollout"
                          ) -> Schedule:
    """Fortified rollout minimising the modelled cost of the schedule.

    :func:`edbatch.schedule.rollout_schedule` with ``cost``: at each decision every ready op
    type is tried on a copy of the frontier and completed with each base policy; the
    candidate whose completion costs least (modelled, prefix included) wins, and the best
    complete schedule found is followed otherwise, so the result costs no more than any base
    policy alone. ``budget`` caps the batches popped in rollouts (counted, not timed: the
    same graph always gets the same schedule).
    """
    return rollout_schedule(graph, bases, budget=budget, name=name, cost=cost,
                            retry_planned=True)


class CostRolloutScheduler:
    """:func:`cost_rollout_schedule` as a scheduler (``graph -> Schedule``)."""

    def __init__(self, cost: Cost, bases: Sequence[Callable[[], Policy]], *,
                 budget: int = DEFAULT_BUDGET, name: str = "cost_rollout") -> None:
        self.cost, self.bases, self.budget, self.name = cost, tuple(bases), budget, name

    def __call__(self, graph: Graph) -> Schedule:
        return cost_rollout_schedule(graph, self.cost, self.bases, budget=self.budget,
                                     name=self.name)
