"""What :meth:`DynamicBatch.run <edbatch.api.DynamicBatch.run>` accepts as a scheduler.

A registered scheduler name, a trained FSM policy (anything with ``op_names`` and
``scheduler()``, e.g. :class:`policies.FSMPolicy`: it runs on its run-time path, one table
lookup per decision, on the graph re-expressed in its op types by name, and refuses a
mini-batch that uses an op type it never saw), a :class:`~edbatch.schedule.Policy`, a callable
``graph -> Schedule``, or ``"auto"`` / an :class:`AutoScheduler` (time the candidates on the
first mini-batches, keep the fastest). Policies are recognised by their interface, so this
layer imports nothing of ``policies`` (which builds on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from edbatch.api._vocab import VocabMap, used_names
from edbatch.errors import GraphError, UnknownNameError
from edbatch.executor.auto import (
    AUTO_SCHEDULERS,
    AUTO_STRATEGIES,
    AutoBatching,
    Candidate,
    make_candidates,
)
from edbatch.graph import Graph, Vocab
from edbatch.memory import Strategy
from edbatch.schedule import Policy, PolicyScheduler, Schedule, Scheduler, make_scheduler
from edbatch.schedule.op_types import check_op_types

__all__ = ["AutoScheduler", "SchedulerLike", "as_scheduler", "fsm_scheduler",
           "memory_strategy"]

#: A scheduler for ``DynamicBatch.run``: a registered name, a Policy or a Scheduler.
SchedulerLike = str | Policy | Scheduler


def fsm_scheduler(policy: Any, runtime: bool = False,
                  path: str | Path | None = None) -> Scheduler:
    """A trained FSM as a scheduler with its own lookahead (``runtime``: its run-time path,
    one table lookup per decision, whatever the lookahead; made once, so its table is
    hashed for the compiled core once, not per mini-batch).

    A graph is scheduled in the policy's vocabulary, matched by op-type name
    (:class:`~edbatch.api._vocab.VocabMap`): op types registered after the policy's graphs
    were recorded, or in another order, are fine as long as the mini-batch does not use
    one the policy never saw. Such a mini-batch is refused: a :class:`GraphError` naming
    the unknown op types, or with ``path`` (the policy's file) the
    :class:`~edbatch.errors.PolicyFileError` of
    :func:`~edbatch.schedule.op_types.check_op_types`."""
    run = policy.runtime_scheduler() if runtime and hasattr(policy, "runtime_scheduler") \
        else None
    names = tuple(policy.op_names)
    maps: dict[Vocab, VocabMap] = {}

    def schedule(graph: Graph) -> Schedule:
        make = run if run is not None else policy.scheduler()
        if graph.vocab.names == names:
            return make(graph)
        mapping = maps.get(graph.vocab)
        if mapping is None:
            mapping = maps[graph.vocab] = VocabMap(graph.vocab, names)
        if path is not None and mapping.missing and \
                set(used_names(graph)) & set(mapping.missing):
            check_op_types(names, graph.vocab.names, path)
        return mapping.schedule(make(mapping.graph(graph)))

    return schedule


class AutoScheduler:
    """``scheduler="auto"``: times every candidate (scheduler x memory strategy) on the
    first ``trials`` mini-batches each, round-robin, then keeps the fastest by median.

    A mini-batch's time runs from the start of its scheduling to the start of the next
    one's: planning, forward, your backward and optimizer step, and the recording of the
    next mini-batch (the same for every candidate). :meth:`DynamicBatch.run
    <edbatch.api.DynamicBatch.run>` plans memory with the current candidate's strategy
    (:func:`memory_strategy`), whatever its ``strategy`` argument says.

    Args:
        policy: a trained FSM policy: its run-time path is the first candidate.
        schedulers: registered heuristic names to try.
        strategies: memory strategies to cross them with.
        trials: timed mini-batches per candidate.
        clock: seconds (``time.perf_counter``; tests inject a fake one).
    """

    def __init__(self, policy: Any = None, schedulers: Sequence[str] = AUTO_SCHEDULERS,
                 strategies: Sequence[str] = AUTO_STRATEGIES, trials: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        fsm = None if policy is None else fsm_scheduler(policy, runtime=True)
        self.auto = AutoBatching(make_candidates(schedulers, strategies, fsm), trials, clock)
        self._open: tuple[Candidate, float] | None = None
        self.candidate = self.auto.current()  #: the candidate of the latest mini-batch

    @property
    def strategy(self) -> Strategy:
        """The memory strategy of the latest mini-batch's candidate."""
        return self.candidate.strategy

    @property
    def chosen(self) -> str | None:
        """The chosen candidate's label (``"<scheduler>/<strategy>"``), ``None`` while
        timing."""
        return None if self.auto.chosen is None else self.auto.chosen.label

    def __call__(self, graph: Graph) -> Schedule:
        now = self.auto.clock()
        if self._open is not None:
            self.auto.record(self._open[0], now - self._open[1])
        self.candidate = self.auto.current()
        self._open = (self.candidate, now) if self.auto.deciding else None
        return self.candidate.scheduler(graph)

    def stop(self) -> None:
        """End the latest mini-batch's trial now (e.g. after its optimizer step, when other
        work runs before the next one); without it the next call ends it."""
        if self._open is not None:
            self.auto.record(self._open[0], self.auto.clock() - self._open[1])
            self._open = None

    def __repr__(self) -> str:
        return f"AutoScheduler(chosen={self.chosen!r})"


def memory_strategy(scheduler: Scheduler, strategy: Strategy) -> Strategy:
    """The memory strategy to plan with after ``scheduler`` ran: an
    :class:`AutoScheduler`'s current candidate's, else ``strategy``."""
    return scheduler.strategy if isinstance(scheduler, AutoScheduler) else strategy


def as_scheduler(scheduler: SchedulerLike,
                 kept: MutableMapping[Any, Any] | None = None) -> Scheduler:
    """A scheduler from a registered name, ``"auto"`` (an :class:`AutoScheduler`, kept in
    ``kept`` so its timings last across mini-batches), an FSM policy, a
    :class:`~edbatch.schedule.Policy` or a scheduler callable ``graph -> Schedule``.

    An FSM policy runs on its run-time path, one table lookup per decision (the path
    ``"auto"`` times it on), whatever its ``lookahead``: made once per policy and kept in
    ``kept``. For the lookahead's schedules pass ``policy.scheduler()`` itself."""
    if scheduler == "auto":
        if kept is None:
            return AutoScheduler()
        if "auto" not in kept:
            kept["auto"] = AutoScheduler()
        return kept["auto"]
    if isinstance(scheduler, str):
        if scheduler.endswith(".json") or "/" in scheduler:  # a policy file's path
            raise UnknownNameError(f"scheduler {scheduler!r} is no scheduler name but looks "
                                   f"like a file; to run a saved policy pass "
                                   f"policies.load_policy({scheduler!r})")
        return make_scheduler(scheduler)
    if hasattr(scheduler, "op_names") and hasattr(scheduler, "scheduler"):
        if kept is None:
            return fsm_scheduler(scheduler, runtime=True)
        key = ("policy", id(scheduler))
        hit = kept.get(key)
        if hit is None or hit[0] is not scheduler:
            hit = kept[key] = (scheduler, fsm_scheduler(scheduler, runtime=True))
        return hit[1]  # type: ignore[no-any-return]
    if isinstance(scheduler, Policy):
        return PolicyScheduler(scheduler)
    if not callable(scheduler):
        raise GraphError(f"scheduler must be a name, a Policy or a callable graph -> Schedule, "
                         f"got {type(scheduler).__name__}")
    module = getattr(scheduler, "__module__", None) or type(scheduler).__module__
    if isinstance(scheduler, AutoScheduler) or module.startswith(("edbatch.", "policies.")):
        return scheduler  # (edbatch's own schedulers: valid by construction, tested)
    return _checked(scheduler)


def _checked(scheduler: Callable[[Graph], Any]) -> Scheduler:
    """A user's ``graph -> Schedule`` callable whose result is checked: a Schedule
    (``None`` or a list was a raw ``AttributeError`` in planning) that runs every node once,
    by op type, after its operands (:meth:`~edbatch.schedule.Schedule.validate`; a
    ``ScheduleError`` naming the batch and node). edbatch's own schedulers (made by
    ``make_scheduler``, a policy's) and an :class:`AutoScheduler` are passed as they are."""
    def run(graph: Graph) -> Schedule:
        schedule = scheduler(graph)
        if not isinstance(schedule, Schedule):
            raise GraphError(f"scheduler {getattr(scheduler, '__name__', scheduler)!r} "
                             f"returned {type(schedule).__name__}; a scheduler returns a "
                             f"Schedule (e.g. edbatch.schedule.run_policy(graph, policy))")
        schedule.validate(graph)
        return schedule
    return run
