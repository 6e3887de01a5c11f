"""The deterministic whole-graph heuristics under their registry names.

This is the part of the scheduler registry that both :mod:`edbatch.schedule.zoo` (which adds
rollout, search, random, exact and the ``replay:`` rules) and :mod:`edbatch.schedule.replay`
(which replays one of these heuristics) stand on, so neither restates it.
"""

from __future__ import annotations

from collections.abc import Callable

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph
from edbatch.schedule.compiled import CompiledScheduler, resolve_backend
from edbatch.schedule.heuristics import (
    AgendaPolicy,
    CompleteLevelAgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    MaxFrontierPolicy,
    TypewiseGreedyPolicy,
    depth_schedule,
    typewise_greedy_backward,
)
from edbatch.schedule.policy import PolicyScheduler, Scheduler
from edbatch.schedule.schedule import Schedule

__all__ = ["COMPILED", "HEURISTIC_ENTRIES", "HEURISTICS", "NamedScheduler", "make_heuristic"]


class NamedScheduler:
    """A plain scheduling function with the registry name stamped on its schedules."""

    def __init__(self, fn: Callable[[Graph], Schedule], name: str) -> None:
        self.fn, self.name = fn, name

    def __call__(self, graph: Graph) -> Schedule:
        s = self.fn(graph)
        return Schedule(s.batches, self.name, s.seconds)

    def __repr__(self) -> str:
        return f"NamedScheduler({self.name})"


#: name -> (factory, one-line source note) of each deterministic whole-graph heuristic, in
#: the order every comparison table shows them.
HEURISTIC_ENTRIES: dict[str, tuple[Callable[[], Scheduler], str]] = {
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
}

#: The heuristics every comparison table shows by default (and a replay rule may follow).
HEURISTICS = tuple(HEURISTIC_ENTRIES)

#: Registry names that run on the compiled core unless the Python backend is chosen.
COMPILED = ("dynet_agenda", "ed_batch_agenda", "dynet_level_agenda", "max_frontier",
            "typewise_greedy", "typewise_greedy_backward", "critical_path")


def make_heuristic(name: str, backend: str | None = None) -> Scheduler:
    """The heuristic ``name`` of :data:`HEURISTICS`: on the compiled core where it has it
    (and ``backend`` does not choose ``"python"``), else its Python form (the oracle).

    Raises:
        UnknownNameError: ``name`` is not in :data:`HEURISTICS`.
    """
    entry = HEURISTIC_ENTRIES.get(name)
    if entry is None:
        raise UnknownNameError(f"unknown heuristic {name!r}; choose one of {list(HEURISTICS)}."
                               + did_you_mean(name, HEURISTICS))
    if resolve_backend(backend) == "compiled" and name in COMPILED:
        return CompiledScheduler(name)
    return entry[0]()
