"""What :meth:`DynamicBatch.run <edbatch.api.DynamicBatch.run>` accepts as a scheduler.

A registered scheduler name, a trained FSM policy (anything with ``op_names`` and
``scheduler()``, e.g. :class:`policies.FSMPolicy`: it runs with its own lookahead and refuses
graphs of other op types), a :class:`~edbatch.schedule.Policy`, or a callable
``graph -> Schedule``. Policies are recognised by their interface, so this layer imports
nothing of ``policies`` (which builds on it).
"""

from __future__ import annotations

from typing import Any

from edbatch.errors import GraphError
from edbatch.graph import Graph
from edbatch.schedule import Policy, PolicyScheduler, Schedule, Scheduler, make_scheduler

__all__ = ["SchedulerLike", "as_scheduler", "fsm_scheduler"]

#: A scheduler for ``DynamicBatch.run``: a registered name, a Policy or a Scheduler.
SchedulerLike = str | Policy | Scheduler


def fsm_scheduler(policy: Any) -> Scheduler:
    """A trained FSM as a scheduler with its own lookahead, refusing graphs whose op types
    differ from the ones it was trained on."""

    def schedule(graph: Graph) -> Schedule:
        if graph.vocab.names != policy.op_names:
            raise GraphError(
                f"the policy was trained on op types {list(policy.op_names)}, but this "
                f"mini-batch has {list(graph.vocab.names)}; register the same cells in the "
                f"same order as when the policy's graphs were recorded, or re-train it")
        return policy.scheduler()(graph)

    return schedule


def as_scheduler(scheduler: SchedulerLike) -> Scheduler:
    """A scheduler from a registered name, an FSM policy (see :func:`fsm_scheduler`), a
    :class:`~edbatch.schedule.Policy` or a scheduler callable ``graph -> Schedule``."""
    if isinstance(scheduler, str):
        return make_scheduler(scheduler)
    if hasattr(scheduler, "op_names") and hasattr(scheduler, "scheduler"):
        return fsm_scheduler(scheduler)
    if isinstance(scheduler, Policy):
        return PolicyScheduler(scheduler)
    if not callable(scheduler):
        raise GraphError(f"scheduler must be a name, a Policy or a callable graph -> Schedule, "
                         f"got {type(scheduler).__name__}")
    return scheduler
