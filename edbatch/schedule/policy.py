"""The Policy protocol and the one loop that turns a policy into a Schedule."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from edbatch.errors import InvalidActionError
from edbatch.graph.ir import Graph
from edbatch.schedule.frontier import Frontier, FrontierView
from edbatch.schedule.schedule import Batch, Schedule

__all__ = ["Policy", "PolicyScheduler", "Scheduler", "drive", "run_policy"]


@runtime_checkable
class Policy(Protocol):
    """Chooses the next op type to batch from a frontier view.

    A policy may set the class attribute ``needs_typewise = True`` to receive ``T(a)``
    (``view.typewise_count``); it then costs a type-wise analysis of each graph.
    """

    def choose(self, view: FrontierView) -> int:
        """Return an op id whose ``view.mask`` entry is 1."""
        ...


#: Anything that turns a graph into a schedule.
Scheduler = Callable[[Graph], Schedule]


def drive(frontier: Frontier, choose: Callable[[Frontier], int]) -> list[Batch]:
    """Run ``frontier`` to the end and return its batches: ready unbatchable nodes first
    (forced steps), then ``choose(frontier)``'s op type at every decision."""
    batches: list[Batch] = []
    while True:
        while (forced := frontier.pop_forced()) is not None:
            batches.append(forced)
        if frontier.done:
            return batches
        batches.append(frontier.pop(choose(frontier)))


def run_policy(graph: Graph, policy: Policy, *, name: str | None = None) -> Schedule:
    """Schedule ``graph`` by asking ``policy`` at every decision; forced steps run first.

    Raises:
        InvalidActionError: the policy chose an op type without ready nodes.
    """
    t0 = time.perf_counter()

    def choose(frontier: Frontier) -> int:
        op_id = policy.choose(frontier.view())
        if not (isinstance(op_id, int) or hasattr(op_id, "__index__")):
            raise InvalidActionError(f"policy {type(policy).__name__} returned {op_id!r}; "
                                     f"expected an int op id")
        return int(op_id)

    batches = drive(Frontier(graph, typewise=getattr(policy, "needs_typewise", False)), choose)
    return Schedule(tuple(batches), name or type(policy).__name__,
                    seconds=time.perf_counter() - t0)


class PolicyScheduler:
    """Wrap a :class:`Policy` as a :data:`Scheduler`.

    Args:
        policy: the policy asked at each decision.
        name: the scheduler name recorded in the schedule and in metrics.
    """

    def __init__(self, policy: Policy, name: str | None = None) -> None:
        self.policy = policy
        self.name = name or type(policy).__name__

    def __call__(self, graph: Graph) -> Schedule:
        return run_policy(graph, self.policy, name=self.name)

    def __repr__(self) -> str:
        return f"PolicyScheduler({self.name})"
