"""``auto`` batching: time the candidate configurations on a run's first mini-batches and
keep the fastest end to end.

A candidate is a scheduler (a registered heuristic, or a learned FSM's run-time path) with a
memory strategy. The first ``trials x len(candidates)`` mini-batches go to the candidates
round-robin (so a drift in machine load hits all of them alike); each is timed from the
start of scheduling to the end of its step (scheduling, memory planning, forward, and
backward when training: the graph's construction is the same for all and left out by the
caller). Then the candidate with the lowest median time is kept for the rest of the run and
its choice and every timing are logged.

The same trade-off drives DyNet's on-the-fly batching (Neubig, Goldberg and Dyer, 2017,
arXiv:1705.07860: the user picks a strategy with the ``--dynet-autobatch`` flag) and
MXNet Gluon's just-in-time dynamic batching (Zha et al., 2019, arXiv:1904.07421): a better
schedule costs analysis time on every new graph, and which side wins depends on the model,
the mini-batch and the machine; here it is measured on the run itself instead of guessed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from edbatch.errors import ConfigError, UnknownNameError, did_you_mean
from edbatch.memory import STRATEGIES, Strategy
from edbatch.schedule import SCHEDULERS, Scheduler, make_scheduler

__all__ = ["AUTO_SCHEDULERS", "AUTO_STRATEGIES", "AutoBatching", "Candidate",
           "make_candidates"]

log = logging.getLogger(__name__)

#: The heuristics ``auto`` tries by default (registry names), besides a given FSM policy.
AUTO_SCHEDULERS = ("critical_path", "typewise_greedy", "depth", "dynet_agenda")
#: The memory strategies ``auto`` crosses them with (``planned`` re-plans every new graph).
AUTO_STRATEGIES = ("aligned", "naive")


@dataclass(frozen=True)
class Candidate:
    """One configuration ``auto`` may choose: ``label`` is ``"<scheduler>/<strategy>"``."""

    label: str
    scheduler: Scheduler
    strategy: Strategy


def make_candidates(schedulers: Sequence[str] = AUTO_SCHEDULERS,
                    strategies: Sequence[str] = AUTO_STRATEGIES,
                    fsm: Scheduler | None = None) -> list[Candidate]:
    """Every scheduler (registry names; ``fsm``, a learned policy's run-time scheduler,
    first when given) crossed with every memory strategy.

    Raises:
        UnknownNameError: an unregistered scheduler or strategy name.
        ConfigError: no scheduler or no strategy, or a name twice.
    """
    for name in schedulers:
        if name not in SCHEDULERS or name == "auto":
            raise UnknownNameError(f"unknown scheduler {name!r} among auto's candidates; "
                                   f"registered: {sorted(SCHEDULERS)}."
                                   + did_you_mean(name, SCHEDULERS))
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise UnknownNameError(f"unknown memory strategy {strategy!r} among auto's "
                                   f"candidates; choose from {list(STRATEGIES)}."
                                   + did_you_mean(strategy, STRATEGIES))
    named: list[tuple[str, Scheduler]] = [("fsm", fsm)] if fsm is not None else []
    named += [(name, make_scheduler(name)) for name in schedulers]
    if not named or not strategies:
        raise ConfigError("auto candidates", {"schedulers": list(schedulers),
                                              "strategies": list(strategies)},
                          "at least one scheduler (or a policy) and one memory strategy",
                          "pass e.g. schedulers=[typewise_greedy] strategies=[aligned]")
    labels = [name for name, _ in named]
    if len(set(labels)) < len(labels) or len(set(strategies)) < len(strategies):
        raise ConfigError("auto candidates", labels + list(strategies), "distinct names",
                          "list each scheduler and each strategy once")
    return [Candidate(f"{name}/{strategy}", sched, cast(Strategy, strategy))
            for name, sched in named for strategy in strategies]


class AutoBatching:
    """Chooses among ``candidates`` by their median time over ``trials`` mini-batches each.

    Use :meth:`current` for the candidate of the next mini-batch and :meth:`record` its
    time (or :meth:`timed` for both); records after the choice are ignored. One candidate
    is chosen at once, without trials.

    Args:
        candidates: the configurations to try, in round-robin order (ties go to the first).
        trials: timed mini-batches per candidate before choosing.
        clock: seconds (``time.perf_counter``; tests inject a fake one).
        agree: maps this process's medians to the ones every process decides on (e.g. a
            sum over data-parallel ranks, so all ranks choose alike); ``None``: as measured.
    """

    def __init__(self, candidates: Sequence[Candidate], trials: int = 3,
                 clock: Callable[[], float] = time.perf_counter,
                 agree: Callable[[list[float]], Sequence[float]] | None = None) -> None:
        if not candidates:
            raise ConfigError("auto candidates", [], "at least one candidate",
                              "give a scheduler and a memory strategy")
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ConfigError("auto trials", trials, "an int >= 1", "pass e.g. trials=3")
        self.candidates, self.trials = list(candidates), trials
        self.clock, self.agree = clock, agree
        self.timings: dict[str, list[float]] = {c.label: [] for c in self.candidates}
        self._recorded = 0
        self.chosen: Candidate | None = self.candidates[0] if len(candidates) == 1 else None

    @property
    def deciding(self) -> bool:
        """Whether mini-batches are still being timed."""
        return self.chosen is None

    def current(self) -> Candidate:
        """The candidate for the next mini-batch: round-robin while deciding, then the
        chosen one."""
        if self.chosen is not None:
            return self.chosen
        return self.candidates[self._recorded % len(self.candidates)]

    def leader(self) -> Candidate:
        """The chosen candidate, else the fastest so far (the first before any timing):
        for work outside the trials, e.g. evaluation."""
        if self.chosen is not None:
            return self.chosen
        timed = [c for c in self.candidates if self.timings[c.label]]
        if not timed:
            return self.candidates[0]
        return min(timed, key=lambda c: statistics.median(self.timings[c.label]))

    def record(self, candidate: Candidate, seconds: float) -> None:
        """Count one mini-batch of ``candidate`` taking ``seconds``; choose after the last
        trial. Ignored once chosen (or for a candidate other than :meth:`current`'s)."""
        if self.chosen is not None or candidate is not self.current():
            return
        self.timings[candidate.label].append(float(seconds))
        self._recorded += 1
        if self._recorded == self.trials * len(self.candidates):
            self._choose()

    @contextmanager
    def timed(self) -> Iterator[Candidate]:
        """``with auto.timed() as cand:`` run one mini-batch with ``cand``; its time is
        recorded when the block ends without an exception."""
        candidate, start = self.current(), self.clock()
        yield candidate
        self.record(candidate, self.clock() - start)

    def medians(self) -> dict[str, float]:
        """Median seconds per candidate label (those timed so far)."""
        return {k: statistics.median(v) for k, v in self.timings.items() if v}

    def _choose(self) -> None:
        mine = [statistics.median(self.timings[c.label]) for c in self.candidates]
        agreed = list(self.agree(mine)) if self.agree is not None else mine
        best = min(range(len(self.candidates)), key=lambda i: (agreed[i], i))
        self.chosen = self.candidates[best]
        log.info("auto: chose %s (median %.1f ms over %d mini-batches; the slowest %.1f ms); "
                 "medians: %s", self.chosen.label, 1e3 * mine[best], self.trials,
                 1e3 * max(mine), ", ".join(f"{c.label} {1e3 * m:.1f}"
                                            for c, m in zip(self.candidates, mine)))

    def summary(self) -> dict[str, Any]:
        """The choice (``None`` while deciding), trials, and every timing in seconds."""
        return {"chosen": None if self.chosen is None else self.chosen.label,
                "trials": self.trials, "median_s": self.medians(),
                "timings_s": {k: list(v) for k, v in self.timings.items()}}
