"""Improve a schedule by local search over its op-type sequence (``lookahead=search``).

A schedule of the batching MDP is fixed by the op types of its decisions; edbatch's
rollouts improve one decision at a time along a single trajectory, while this search edits
the whole sequence: delete an entry, move one up to ``window`` places, insert a random
batchable type; each mutant is replayed (every ready node of the next type that has ready
nodes, the critical path once the sequence is spent) and kept when it needs no more batches,
or, simulated annealing, a worse one with probability ``exp(-(worse by) / T)``. About 45 us
per replay of an 8,000-node lattice graph on the compiled core
(:mod:`edbatch.schedule._compiled_search`); :func:`search_sequence_python` and
:func:`replay_count_python` are its Python twins, the oracle in tests. The result never has
more batches than the schedule it starts from; a schedule at the lower bound is returned
unsearched, and the search stops once a mutant meets it.

    >>> from edbatch.schedule import make_scheduler
    >>> from edbatch.schedule.search import improve_schedule
    >>> better = improve_schedule(graph, make_scheduler("rollout")(graph))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import ScheduleError
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import height_list, heights, lower_bound
from edbatch.schedule.frontier import Frontier
from edbatch.schedule.policy import drive
from edbatch.schedule.schedule import Schedule

__all__ = ["DEFAULT_ITERATIONS", "SearchScheduler", "improve_schedule", "replay_count_python",
           "replay_sequence", "search_sequence_python"]

#: mutants tried per graph by default (about 10 s on a 64-lattice graph of ~8,000 nodes)
DEFAULT_ITERATIONS = 200_000
_MOD = 2147483647


def _arrays(graph: Graph) -> tuple:  # type: ignore[type-arg]
    uptr, uids = graph.users
    return (graph.op_ids.astype(np.int64), uptr.astype(np.int64), uids.astype(np.int64),
            graph.arity.astype(np.int64), np.asarray(graph.vocab.batchable, dtype=np.bool_),
            heights(graph).astype(np.int64), len(graph.vocab))


def decisions(schedule: Schedule) -> NDArray[np.int64]:
    """The op types of a schedule's decisions (forced steps left out)."""
    return np.asarray([b.op_id for b in schedule.batches if not b.forced], dtype=np.int64)


def replay_count_python(graph: Graph, seq: Sequence[int]) -> tuple[int, list[int]]:
    """Python twin of the compiled replay: ``(batches, decision op types)``."""
    op, batchable = graph.op_ids.tolist(), graph.vocab.batchable.tolist()
    h = height_list(graph)
    uptr, uids = graph.users
    indeg = graph.arity.tolist()
    ready: dict[int, list[int]] = {}
    forced = [v for v in range(graph.num_nodes) if indeg[v] == 0 and not batchable[op[v]]]
    for v in range(graph.num_nodes):
        if indeg[v] == 0 and batchable[op[v]]:
            ready.setdefault(op[v], []).append(v)
    out: list[int] = []
    done, batches, i = 0, 0, 0

    def release(v: int) -> None:
        for u in uids[uptr[v]:uptr[v + 1]].tolist():
            indeg[u] -= 1
            if indeg[u] == 0:
                (ready.setdefault(op[u], []) if batchable[op[u]] else forced).append(u)

    while True:
        while forced:
            batches, done = batches + 1, done + 1
            release(forced.pop())
        if done == graph.num_nodes:
            return batches, out
        a = -1
        while i < len(seq) and a < 0:
            a = seq[i] if ready.get(seq[i]) else -1
            i += 1
        if a < 0:
            a = max((t for t in ready if ready[t]), key=lambda t: (max(h[v] for v in ready[t]), -t))
        nodes = ready.pop(a)
        batches, done = batches + 1, done + len(nodes)
        out.append(a)
        for v in nodes:
            release(v)


def search_sequence_python(graph: Graph, seq: Sequence[int], iterations: int, window: int,
                           temperature: float, seed: int, floor: int = -1
                           ) -> tuple[int, list[int], int]:
    """Python twin of :func:`edbatch.schedule._compiled_search.search_sequence`."""
    types = [t for t in range(len(graph.vocab)) if graph.vocab.batchable[t]]
    b, cur = replay_count_python(graph, seq)
    best, cur_b, best_seq, accepted = b, b, list(cur), 0
    state = seed % (_MOD - 1) + 1
    for it in range(iterations):
        if not cur or best <= floor:
            break
        draws = []
        for _ in range(4):
            state = state * 48271 % _MOD
            draws.append(state)
        kind, i = draws[0] % 3, draws[1] % len(cur)
        j = min(max(i + draws[2] % (2 * window + 1) - window, 0), len(cur) - 1)
        t = types[draws[3] % len(types)]
        if kind == 1 and j == i:
            continue
        cand = list(cur)
        if kind == 0:
            del cand[i]
        elif kind == 1:
            cand.insert(j, cand.pop(i))
        else:
            cand.insert(i, t)
        nb, out = replay_count_python(graph, cand)
        temp = temperature * (1.0 - it / iterations)
        state = state * 48271 % _MOD
        if nb <= cur_b or (temp > 0.0 and state / _MOD < math.exp((cur_b - nb) / temp)):
            cur_b, cur = nb, out
            accepted += 1
            if nb < best:
                best, best_seq = nb, list(out)
    return best, best_seq, accepted


def replay_sequence(graph: Graph, seq: Sequence[int], name: str = "search") -> Schedule:
    """The schedule a decision sequence stands for (see the module docstring)."""
    t0 = time.perf_counter()
    h = height_list(graph)
    pos = 0

    def choose(frontier: Frontier) -> int:
        nonlocal pos
        view = frontier.view()
        while pos < len(seq):
            pos += 1
            if view.count(int(seq[pos - 1])):
                return int(seq[pos - 1])
        return max(view.ready_ops, key=lambda a: (view.max_over_ready(a, h), -a))

    batches = drive(Frontier(graph), choose)
    return Schedule(tuple(batches), name, seconds=time.perf_counter() - t0)


def _check(iterations: int, window: int, temperature: float) -> None:
    if iterations < 0 or window < 1 or temperature < 0:
        raise ScheduleError(f"improve_schedule needs iterations >= 0, window >= 1 and "
                            f"temperature >= 0; got {iterations}, {window}, {temperature}")


def improve_schedule(graph: Graph, schedule: Schedule, *, iterations: int = DEFAULT_ITERATIONS,
                     window: int = 30, temperature: float = 0.5, seed: int = 0,
                     name: str | None = None) -> Schedule:
    """``schedule`` improved by the sequence search (never more batches than it has).

    Raises:
        ScheduleError: a bad argument (``iterations < 0``, ``window < 1``,
            ``temperature < 0``).
    """
    _check(iterations, window, temperature)
    from edbatch.schedule._compiled_search import search_sequence

    t0 = time.perf_counter()
    name = name or schedule.scheduler
    if graph.num_nodes == 0 or not graph.vocab.batchable.any():
        return schedule
    floor = lower_bound(graph)
    if schedule.num_batches <= floor:  # (nothing can beat it: no mutant replayed)
        return schedule
    types = np.flatnonzero(graph.vocab.batchable).astype(np.int64)
    best, seq, _ = search_sequence(  # type: ignore[call-arg]
        decisions(schedule), *_arrays(graph), types, iterations, window, float(temperature),
        seed, floor)
    if best >= schedule.num_batches:
        return schedule
    result = replay_sequence(graph, seq.tolist(), name)
    if result.num_batches != best:  # the compiled replay and the Frontier disagree
        raise ScheduleError(f"sequence search: the compiled replay counted {best} batches, "
                            f"the frontier {result.num_batches}; please report this graph")
    return Schedule(result.batches, name, seconds=schedule.seconds + time.perf_counter() - t0)


class SearchScheduler:
    """A scheduler followed by :func:`improve_schedule` (``lookahead=search`` of an FSM)."""

    def __init__(self, base: Callable[[Graph], Schedule], name: str = "search",
                 iterations: int = DEFAULT_ITERATIONS, window: int = 30,
                 temperature: float = 0.5, seed: int = 0) -> None:
        _check(iterations, window, temperature)  # a bad config value fails before any work
        self.base, self.name = base, name
        self.kwargs = {"iterations": iterations, "window": window,
                       "temperature": temperature, "seed": seed}

    def __call__(self, graph: Graph) -> Schedule:
        return improve_schedule(graph, self.base(graph), name=self.name,
                                **self.kwargs)  # type: ignore[arg-type]
