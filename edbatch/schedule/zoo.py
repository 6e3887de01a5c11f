"""Scheduler registry: every scheduler under the name used in configs, tables and metrics.

The deterministic heuristics live in :mod:`edbatch.schedule.named` (shared with the replay
rules); this module adds rollout, search, random, exact and ``replay:<heuristic>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.schedule.heuristics import CriticalPathPolicy, RandomPolicy
from edbatch.schedule.named import (
    COMPILED,
    HEURISTIC_ENTRIES,
    HEURISTICS,
    NamedScheduler,
    make_heuristic,
)
from edbatch.schedule.policy import PolicyScheduler, Scheduler
from edbatch.schedule.replay import ReplayScheduler, replay_heuristic
from edbatch.schedule.rollout import DEFAULT_BUDGET, RolloutScheduler
from edbatch.schedule.search import DEFAULT_ITERATIONS, SearchScheduler

__all__ = ["COMPILED", "SCHEDULERS", "HEURISTICS", "NamedScheduler", "make_scheduler"]


def _exact(node_budget: int = 200_000, time_limit: float | None = 60.0) -> Scheduler:
    from edbatch.schedule.exact import ExactScheduler

    return ExactScheduler(node_budget=node_budget,  # type: ignore[no-any-return]
                          time_limit=time_limit)


#: name -> (factory, one-line source note). Factories take keyword options only.
SCHEDULERS: dict[str, tuple[Callable[..., Scheduler], str]] = {
    **HEURISTIC_ENTRIES,
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
    if name in HEURISTIC_ENTRIES and not kwargs:  # the compiled or the Python form
        return make_heuristic(name, backend)
    return entry[0](**kwargs)
