"""Scheduler registry: every scheduler under the name used in configs, tables and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph
from edbatch.schedule.compiled import CompiledScheduler, resolve_backend
from edbatch.schedule.heuristics import (
    AgendaPolicy,
    CompleteLevelAgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    MaxFrontierPolicy,
    RandomPolicy,
    TypewiseGreedyPolicy,
    depth_schedule,
    typewise_greedy_backward,
)
from edbatch.schedule.policy import PolicyScheduler, Scheduler
from edbatch.schedule.replay import ReplayScheduler, replay_heuristic
from edbatch.schedule.rollout import DEFAULT_BUDGET, RolloutScheduler
from edbatch.schedule.schedule import Schedule
from edbatch.schedule.search import DEFAULT_ITERATIONS, SearchScheduler

__all__ = ["COMPILED", "SCHEDULERS", "HEURISTICS", "NamedScheduler", "make_scheduler"]


class NamedScheduler:
    """A plain scheduling function with the registry name stamped on its schedules."""

    def __init__(self, fn: Callable[[Graph], Schedule], name: str) -> None:
        self.fn, self.name = fn, name

    def __call__(self, graph: Graph) -> Schedule:
        s = self.fn(graph)
        return Schedule(s.batches, self.name, s.seconds)

    def __repr__(self) -> str:
        return f"NamedScheduler({self.name})"


def _exact(node_budget: int = 200_000) -> Scheduler:
    from edbatch.schedule.exact import ExactScheduler

    return ExactScheduler(node_budget=node_budget)  # type: ignore[no-any-return]


#: name -> (factory, one-line source note). Factories take keyword options only.
SCHEDULERS: dict[str, tuple[Callable[..., Scheduler], str]] = {
    "depth": (lambda: NamedScheduler(depth_schedule, "depth"),
              "TensorFlow Fold / DyNet autobatch 2: one batch per (depth, op type)"),
    "dynet_agenda": (lambda: PolicyScheduler(DynetAgendaPolicy(), "dynet_agenda"),
                     "DyNet autobatch 1: lowest static mean depth, complex ops deferred"),
    "ed_batch_agenda": (lambda: PolicyScheduler(AgendaPolicy(), "ed_batch_agenda"),
                        "ED-Batch agenda: lowest mean depth of the remaining nodes"),
    "dynet_level_agenda": (
        lambda: PolicyScheduler(CompleteLevelAgendaPolicy(), "dynet_level_agenda"),
        "DyNet autobatch 3: agenda restricted to complete (depth, type) levels"),
    "max_frontier": (lambda: PolicyScheduler(MaxFrontierPolicy(), "max_frontier"),
                     "greedy: the op type with the most ready nodes"),
    "typewise_greedy": (lambda: PolicyScheduler(TypewiseGreedyPolicy(), "typewise_greedy"),
                        "greedy on ED-Batch's ratio |F(a)|/T(a), forward"),
    "typewise_greedy_backward": (
        lambda: NamedScheduler(typewise_greedy_backward, "typewise_greedy_backward"),
        "ED-Batch autobatch 8: the ratio greedy run backwards from the sinks"),
    "critical_path": (lambda: PolicyScheduler(CriticalPathPolicy(), "critical_path"),
                      "critical path first (longest remaining path), ties by |F(a)|/T(a)"),
    "rollout": (lambda budget=DEFAULT_BUDGET: RolloutScheduler(
        [CriticalPathPolicy], budget=budget, name="rollout"),
        "fortified rollout over the critical-path rule (one-step lookahead, budgeted)"),
    "search": (lambda iterations=DEFAULT_ITERATIONS: SearchScheduler(
        RolloutScheduler([CriticalPathPolicy], name="search"), name="search",
        iterations=iterations),
        "the rollout, then local search over its op-type sequence (lookahead=search)"),
    "random": (lambda seed=0: PolicyScheduler(RandomPolicy(seed), "random"),
               "uniformly random ready op type (seeded)"),
    "exact": (_exact, "exact optimum by branch-and-bound with the LB heuristic (budgeted)"),
}

#: The heuristics every comparison table shows by default.
HEURISTICS = ("depth", "dynet_agenda", "ed_batch_agenda", "dynet_level_agenda",
              "max_frontier", "typewise_greedy", "typewise_greedy_backward", "critical_path")


#: Registry names that run on the compiled core unless the Python backend is chosen.
COMPILED = ("dynet_agenda", "ed_batch_agenda", "max_frontier", "typewise_greedy",
            "typewise_greedy_backward", "critical_path")


def make_scheduler(name: str, *, backend: str | None = None, **kwargs: Any) -> Scheduler:
    """Instantiate a registered scheduler (``kwargs`` go to its factory).

    ``backend``: ``"compiled"`` (default, or ``$EDBATCH_BACKEND``) runs the names in
    :data:`COMPILED` on the numba core (:mod:`edbatch.schedule.compiled`), which gives
    the same schedules as ``"python"`` (the reference implementation, kept as the oracle).
    ``replay:<heuristic>`` names (:mod:`edbatch.schedule.replay`) give the replay rule alone.
    """
    if replay_heuristic(name) is not None and not kwargs:  # replay:<heuristic>
        return ReplayScheduler(name, backend)
    entry = SCHEDULERS.get(name)
    if entry is None:
        raise UnknownNameError(f"unknown scheduler {name!r}; registered: {sorted(SCHEDULERS)}."
                               + did_you_mean(name, SCHEDULERS))
    if resolve_backend(backend) == "compiled" and name in COMPILED and not kwargs:
        return CompiledScheduler(name)
    return entry[0](**kwargs)
