"""The compiled trace of an FSM's decisions equals the Python frontier's, and the ``fill`` key
equals its compiled twin."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edbatch.schedule import Frontier
from edbatch.schedule._compiled_keys import key_crit, key_fill
from edbatch.schedule.bounds import height_list
from edbatch.workloads import make_workload
from envs.encoding import crit_key, encode_state, fill_key, key_actions
from policies.fsm import FSMPolicy
from policies.table_search import policy_votes, table_batches, trace


@pytest.fixture(scope="module")
def graphs() -> list:
    return list(make_workload("lattice_lstm").batches("train", 8, limit=2))


def _table(graph, encoding: str) -> dict:  # type: ignore[no-untyped-def]
    """A table that disagrees with critical path on every other visited state."""
    seen = policy_votes(FSMPolicy({}, encoding, graph.vocab.names, "critical_path"), [graph],
                        encoding)
    table = {}
    for i, (key, acts) in enumerate(sorted(seen.items())):
        options = sorted(set(key_actions(key, encoding)) - set(acts))
        if i % 2 == 0 and options:
            table[key] = options[0]
    return table


@pytest.mark.parametrize("encoding", ["expert", "fill", "rich", "crit"])
@pytest.mark.parametrize("fallback", ["critical_path", "ed_batch", "typewise_greedy"])
def test_compiled_trace_equals_the_python_frontier(graphs, encoding: str, fallback: str
                                                   ) -> None:
    for g in graphs:
        table = _table(g, encoding)
        assert table
        policy = FSMPolicy(table, encoding, g.vocab.names, fallback)
        want = policy_votes(policy, [g], encoding)
        seen, nb = trace(table, g, encoding, fallback)
        assert seen == want
        assert nb == table_batches(table, [g], encoding, fallback)
        assert sum(sum(c.values()) for c in seen.values()) < nb  # forced steps not counted


def test_trace_falls_back_to_python_for_keys_the_core_lacks(graphs) -> None:
    g = graphs[0]
    seen, nb = trace({}, g, "hints", "max_frontier")
    assert seen and isinstance(next(iter(seen.values())), Counter)
    assert nb == table_batches({}, [g], "hints", "max_frontier")


@pytest.mark.parametrize(("twin", "key"), [(key_fill, fill_key), (key_crit, crit_key)])
def test_keys_agree_with_their_compiled_twins(twin, key, compiled_key) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    for _ in range(400):
        k = int(rng.integers(1, 9))
        ready = rng.integers(0, 6, size=k) * (rng.random(k) < 0.6)
        tw = ready + rng.integers(0, 6, size=k)
        height = rng.integers(0, 25, size=k)
        assert compiled_key(twin, ready, tw, height) == key(ready, tw, height)


def test_fill_key_features(graphs) -> None:
    # type 0 critical and 2 of 5 ready (fill 0); type 1 is 9 below (class 1), 3 of 5 (fill
    # 1); type 3 is 10 below (class 2) and complete (fill 2)
    assert fill_key(np.array([2, 3, 0, 4]), np.array([5, 5, 1, 4]),
                    np.array([30, 21, 0, 20])) == (0, 9 + 3 + 1, 27 + 6 + 2)
    g = graphs[0]
    f = Frontier(g, typewise=True)
    h = height_list(g)
    for _ in range(5):
        view = f.view()
        heights = np.array([view.max_over_ready(a, h) if view.count(a) else 0
                            for a in range(len(view.mask))])
        counts = np.where(view.mask > 0, view.ready_count, 0)
        assert encode_state(view, "fill") == fill_key(counts, view.typewise_count, heights)
        f.pop(view.ready_ops[-1])


def test_crit_key_features() -> None:
    # types 0 and 1 on the critical path, 2 of 5 (fill 0) and 3 of 5 (fill 1) ready; type 2
    # complete one below (1 + 2 + 1); type 3 incomplete 5 below (1 + 4 + 0)
    assert crit_key(np.array([2, 3, 4, 1]), np.array([5, 5, 4, 3]),
                    np.array([30, 30, 29, 25])) == (0, 7 + 1, 14 + 4, 21 + 5)


def test_search_min_visits_leaves_rare_states_alone(graphs) -> None:
    from policies.table_search import search_table, visited_states

    train, check = graphs[:1], graphs[1:]
    seen = visited_states({}, train, "expert", "critical_path")
    cut = sorted(seen.values())[-3]  # only the 3 most visited states may change
    table, st = search_table({}, train, check, "expert", "critical_path", sweeps=1,
                             min_visits=cut, max_evals=200)
    assert all(seen[k] >= cut for k in table)
    _, none = search_table({}, train, check, "expert", "critical_path", sweeps=1,
                           min_visits=max(seen.values()) + 1)
    assert none.evaluations == 0 and st.evaluations > 0
