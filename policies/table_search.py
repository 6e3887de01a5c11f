"""Direct search over an FSM table: change one state's action at a time, keep what helps.

Imitating a search teacher loses most of what the teacher knows once its decisions are folded
into a coarse, graph-size-free key (on lattices the rollout deviates from the critical path
in a handful of decisions per graph, at states whose key also covers the decisions where it
agrees). This stage instead optimises the table on the quantity the deployed FSM is judged
by, the number of batches of its own (table lookup) schedules:

* a sweep lists the states the current FSM visits on the training graphs, most visited first;
* for each state and each other ready op type of its key it schedules the training graphs
  with that one entry changed (the compiled core: milliseconds per graph);
* the change is kept when the training graphs need fewer batches and the check graphs
  (held-out graphs, e.g. resampled mini-batches) need no more: coordinate descent with a
  guard against fitting the training graphs' accidents.

Sweeps repeat until one keeps no change (or ``sweeps`` ran, or the training graphs meet
their lower bound). Deterministic: states are
visited in (count, key) order and actions in ascending id.

:func:`complete_table` then writes down what the FSM already does: every state it visits
on the training and check graphs at least ``min_visits`` times, always with the same
action, enters the table with that action. Those graphs' schedules are unchanged by
construction; on unseen graphs the table answers more decisions itself (its hit rate)
instead of calling the fallback.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from edbatch.graph import Graph
from edbatch.schedule import Frontier, lower_bound
from edbatch.schedule.policy import Policy, drive
from envs.encoding import StateKey, encode_state, key_actions
from policies.fsm import FSMPolicy

__all__ = ["SearchStats", "complete_table", "search_table", "table_batches", "visited_states"]


@dataclass(frozen=True)
class SearchStats:
    """What :func:`search_table` did."""

    sweeps: int
    evaluations: int
    changes: int
    train_batches: int
    check_batches: int


def _policy(table: dict[StateKey, int], encoding: str, names: tuple[str, ...],
            fallback: str) -> FSMPolicy:
    return FSMPolicy(table, encoding, names, fallback)


def table_batches(table: dict[StateKey, int], graphs: Sequence[Graph], encoding: str,
                  fallback: str) -> int:
    """Total batches of the FSM's own schedules (no lookahead) on ``graphs``."""
    if not graphs:
        return 0
    sched = _policy(table, encoding, graphs[0].vocab.names, fallback).runtime_scheduler()
    return sum(sched(g).num_batches for g in graphs)


def policy_votes(policy: Policy, graphs: Sequence[Graph],
                 encoding: str) -> dict[StateKey, Counter[int]]:
    """Per state key, the actions ``policy`` took there in its own schedules of ``graphs``."""
    seen: dict[StateKey, Counter[int]] = {}

    def choose(f: Frontier) -> int:
        view = f.view()
        a = int(policy.choose(view))
        seen.setdefault(encode_state(view, encoding), Counter())[a] += 1
        return a

    for g in graphs:
        drive(Frontier(g, typewise=True), choose)
    return seen


def decisions(table: dict[StateKey, int], graphs: Sequence[Graph], encoding: str,
              fallback: str) -> dict[StateKey, Counter[int]]:
    """Per state key, the actions the FSM's own schedules on ``graphs`` took there."""
    if not graphs:
        return {}
    return policy_votes(_policy(table, encoding, graphs[0].vocab.names, fallback), graphs,
                        encoding)


def visited_states(table: dict[StateKey, int], graphs: Sequence[Graph], encoding: str,
                   fallback: str) -> Counter[StateKey]:
    """How often the FSM's own schedules on ``graphs`` meet each state key."""
    return Counter({k: sum(c.values()) for k, c in decisions(table, graphs, encoding,
                                                             fallback).items()})


def complete_table(table: dict[StateKey, int], graphs: Sequence[Graph], encoding: str,
                   fallback: str, *, min_visits: int = 2) -> dict[StateKey, int]:
    """``table`` plus every state the FSM visits on ``graphs`` at least ``min_visits``
    times, always taking the same action (schedules on ``graphs`` stay identical)."""
    out = dict(table)
    for key, acts in sorted(decisions(table, graphs, encoding, fallback).items()):
        if key not in out and len(acts) == 1 and sum(acts.values()) >= min_visits:
            out[key] = next(iter(acts))
    return out


class _Pool:
    """A graph set with each graph's batches and visited keys under the current table, so
    a one-key change is scored by rescheduling only the graphs that visit that key (the
    others' schedules cannot change)."""

    def __init__(self, graphs: Sequence[Graph], table: dict[StateKey, int], encoding: str,
                 fallback: str) -> None:
        self.graphs, self.encoding, self.fallback = list(graphs), encoding, fallback
        self.batches = [table_batches(table, [g], encoding, fallback) for g in self.graphs]
        self.keys = [set(decisions(table, [g], encoding, fallback)) for g in self.graphs]

    @property
    def total(self) -> int:
        return sum(self.batches)

    def trial(self, table: dict[StateKey, int], key: StateKey) -> tuple[int, dict[int, int]]:
        """Total batches with ``table`` (which differs from the current one at ``key``)
        and the new batches of the graphs that visit ``key``."""
        new = {i: table_batches(table, [g], self.encoding, self.fallback)
               for i, g in enumerate(self.graphs) if key in self.keys[i]}
        return self.total + sum(b - self.batches[i] for i, b in new.items()), new

    def accept(self, table: dict[StateKey, int], new: dict[int, int]) -> None:
        for i, b in new.items():
            self.batches[i] = b
            self.keys[i] = set(decisions(table, [self.graphs[i]], self.encoding,
                                         self.fallback))


def search_table(table: dict[StateKey, int], train: Sequence[Graph], check: Sequence[Graph],
                 encoding: str, fallback: str, *, sweeps: int = 3, min_visits: int = 1,
                 max_evals: int = 2000) -> tuple[dict[StateKey, int], SearchStats]:
    """Coordinate descent over ``table`` (see the module docstring).

    Args:
        table: the starting table (e.g. the teacher's majority votes, or empty).
        train: graphs whose batches the search lowers.
        check: graphs that must not get worse with any kept change (may be empty).
        encoding, fallback: the FSM's key and fallback rule.
        sweeps: most passes over the visited states.
        min_visits: states visited fewer times on ``train`` are left alone.
        max_evals: most candidate tables scored (a time cap that keeps determinism).

    Returns:
        The improved table and :class:`SearchStats`.
    """
    table = dict(table)
    tr, ch = _Pool(train, table, encoding, fallback), _Pool(check, table, encoding, fallback)
    floor = sum(lower_bound(g) for g in train)  # no table needs fewer batches
    evals = changes = done = 0
    for _ in range(sweeps if tr.total > floor else 0):
        done += 1
        seen = visited_states(table, train, encoding, fallback)
        changed = False
        for key, n in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0])):
            if n < min_visits:
                break
            current = table.get(key)
            for a in sorted(set(key_actions(key, encoding))):
                if a == current or evals >= max_evals or tr.total <= floor:
                    continue
                trial = {**table, key: a}
                evals += 1
                t, new_t = tr.trial(trial, key)
                if t >= tr.total:
                    continue
                c, new_c = ch.trial(trial, key)
                if c <= ch.total:
                    table, current = trial, a
                    tr.accept(table, new_t)
                    ch.accept(table, new_c)
                    changes += 1
                    changed = True
        if not changed or evals >= max_evals:
            break
    return table, SearchStats(done, evals, changes, tr.total, ch.total)
