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

import numpy as np

from edbatch.graph import Graph
from edbatch.schedule import Frontier, lower_bound
from edbatch.schedule import compiled as cc
from edbatch.schedule._compiled_trace import trace_schedule
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.replay import replay_heuristic, replay_trace
from envs.encoding import StateKey, encode_state, key_actions
from policies.fsm import FSMPolicy

__all__ = ["GraphPool", "SearchStats", "complete_table", "improves", "search_table",
           "table_batches", "visited_states"]


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


def trace(table: dict[StateKey, int], graph: Graph, encoding: str, fallback: str
          ) -> tuple[dict[StateKey, Counter[int]], int]:
    """The FSM's own schedule of ``graph``: (per state key, the actions taken there; the
    number of batches). Compiled (:mod:`edbatch.schedule._compiled_trace`) where the core
    has the key and the fallback, else the Python frontier (same result)."""
    if replay_heuristic(fallback) is not None and encoding in cc.COMPILED_ENCODINGS:
        keys, lens, acts, nb = replay_trace(graph, fallback, encoding, cc.FsmTable(table))
        return _seen(keys, lens, acts), int(nb)
    if not cc.fsm_supported(encoding, fallback):
        policy = _policy(table, encoding, graph.vocab.names, fallback)
        seen = policy_votes(policy, [graph], encoding)
        return seen, table_batches(table, [graph], encoding, fallback)
    rule_id, need_tw, need_h = cc.COMPILED_RULES[fallback]
    enc_id, enc_tw, enc_h = cc.COMPILED_ENCODINGS[encoding]
    arr, height, tw_pred, tw_ptr, tw_ids = cc.core_graph(graph, need_tw or enc_tw,
                                                         need_h or enc_h)
    tab = cc.FsmTable(table)
    keys, lens, acts, nb = trace_schedule(
        arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height, tw_pred,
        tw_ptr, tw_ids, arr.mean, arr.cplx, rule_id, enc_id, tab.hashes, tab.actions)
    return _seen(keys, lens, acts), int(nb)


def _seen(keys: np.ndarray, lens: np.ndarray, acts: np.ndarray  # type: ignore[type-arg]
          ) -> dict[StateKey, Counter[int]]:
    seen: dict[StateKey, Counter[int]] = {}
    for row, m, a in zip(keys.tolist(), lens.tolist(), acts.tolist()):
        seen.setdefault(tuple(row[:m]), Counter())[a] += 1
    return seen


def decisions(table: dict[StateKey, int], graphs: Sequence[Graph], encoding: str,
              fallback: str) -> dict[StateKey, Counter[int]]:
    """Per state key, the actions the FSM's own schedules on ``graphs`` took there."""
    seen: dict[StateKey, Counter[int]] = {}
    for g in graphs:
        for key, acts in trace(table, g, encoding, fallback)[0].items():
            seen.setdefault(key, Counter()).update(acts)
    return seen


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


class GraphPool:
    """A graph set with each graph's batches and visited keys under the current table, so
    a change at some keys is scored by rescheduling only the graphs that visit one of them
    (the others' schedules cannot change); the single-move and pair-move searches share it."""

    def __init__(self, graphs: Sequence[Graph], table: dict[StateKey, int], encoding: str,
                 fallback: str) -> None:
        self.graphs, self.encoding, self.fallback = list(graphs), encoding, fallback
        self.batches, self.keys = [], []
        for g in self.graphs:
            seen, nb = trace(table, g, encoding, fallback)
            self.batches.append(nb)
            self.keys.append(set(seen))

    @property
    def total(self) -> int:
        return sum(self.batches)

    def trial(self, table: dict[StateKey, int], keys: set[StateKey]
              ) -> tuple[int, dict[int, tuple[int, set[StateKey]]]]:
        """Total batches with ``table`` (which differs from the current one at ``keys``)
        and the new (batches, visited keys) of the graphs that visit one of ``keys``."""
        new = {}
        for i, g in enumerate(self.graphs):
            if not keys.isdisjoint(self.keys[i]):
                seen, nb = trace(table, g, self.encoding, self.fallback)
                new[i] = (nb, set(seen))
        return self.total + sum(b - self.batches[i] for i, (b, _) in new.items()), new

    def accept(self, new: dict[int, tuple[int, set[StateKey]]]) -> None:
        for i, (b, keys) in new.items():
            self.batches[i], self.keys[i] = b, keys


def improves(train: GraphPool, check: GraphPool, table: dict[StateKey, int],
             keys: set[StateKey]) -> bool:
    """Whether ``table`` (the current table changed at ``keys``) needs fewer batches on the
    ``train`` graphs and no more on the ``check`` graphs; if so both pools take it."""
    t, new_t = train.trial(table, keys)
    if t >= train.total:
        return False
    c, new_c = check.trial(table, keys)
    if c > check.total:
        return False
    train.accept(new_t)
    check.accept(new_c)
    return True


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
    tr = GraphPool(train, table, encoding, fallback)
    ch = GraphPool(check, table, encoding, fallback)
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
                if improves(tr, ch, trial, {key}):
                    table, current = trial, a
                    changes += 1
                    changed = True
        if not changed or evals >= max_evals:
            break
    return table, SearchStats(done, evals, changes, tr.total, ch.total)
