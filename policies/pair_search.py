"""Pair moves over an FSM table: change two states' actions at once, keep what helps.

:func:`policies.table_search.search_table` changes one state at a time, so it stops at a
table no single change improves. Two changes that only pay together (e.g. deviate from the
fallback at one state *and* take the follow-up decision differently at the state that
deviation leads to) are out of its reach. :func:`pair_search` tries them: over the ``top``
most visited states of the current table's schedules it lists every single move (a state and
another ready op type of its key), and scores every pair of moves on different states by
rescheduling the graphs that visit either state; a pair is kept when the training graphs need
fewer batches and the check graphs no more (the same guard as the single-move search).
After a kept pair the visited states are listed again. Deterministic: moves in (visits, key,
op) order, pairs in lexicographic order.
"""

from __future__ import annotations

from collections.abc import Sequence

from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from envs.encoding import StateKey, key_actions
from policies.table_search import GraphPool, SearchStats, improves, visited_states

__all__ = ["pair_search"]


def pair_search(table: dict[StateKey, int], train: Sequence[Graph], check: Sequence[Graph],
                encoding: str, fallback: str, *, top: int = 12, max_evals: int = 2000
                ) -> tuple[dict[StateKey, int], SearchStats]:
    """Pair moves over the ``top`` most visited states (see the module docstring).

    Returns:
        The improved table and :class:`~policies.table_search.SearchStats` (``sweeps``: the
        listings of moves, ``changes``: the pairs kept).
    """
    table = dict(table)
    tr = GraphPool(train, table, encoding, fallback)
    ch = GraphPool(check, table, encoding, fallback)
    floor = sum(lower_bound(g) for g in train)
    evals = kept = rounds = 0
    improved = top > 0
    while improved and evals < max_evals and tr.total > floor:
        improved = False
        rounds += 1
        seen = visited_states(table, train, encoding, fallback)
        states = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        moves = [(key, a) for key, _ in states
                 for a in sorted(set(key_actions(key, encoding))) if a != table.get(key)]
        for i, (k1, a1) in enumerate(moves):
            for k2, a2 in moves[i + 1:]:
                if k1 == k2 or evals >= max_evals:
                    continue
                trial = {**table, k1: a1, k2: a2}
                evals += 1
                if improves(tr, ch, trial, {k1, k2}):
                    table = trial
                    kept += 1
                    improved = True
                    break
            if improved:
                break
    return table, SearchStats(rounds, evals, kept, tr.total, ch.total)
