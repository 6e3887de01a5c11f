"""Frontier: release order, forced steps, masks, invalid actions, T(a)."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import InvalidActionError
from edbatch.graph import Graph
from edbatch.schedule import Frontier, run_policy
from edbatch.schedule.heuristics import MaxFrontierPolicy


def test_frontier_initial_ready_set_is_the_sources(two_trees: Graph) -> None:
    f = Frontier(two_trees)
    assert f.ready_count.tolist() == [5, 0, 0, 0, 0]
    assert f.mask().tolist() == [1, 0, 0, 0, 0]
    assert f.ready_nodes(0).tolist() == [0, 1, 3, 7, 8]


def test_frontier_pop_releases_users(two_trees: Graph) -> None:
    f = Frontier(two_trees)
    batch = f.pop(0)
    assert batch.node_ids.tolist() == [0, 1, 3, 7, 8]
    assert f.ready_nodes(1).tolist() == [2, 9]
    b2 = f.pop(1)
    assert b2.node_ids.tolist() == [2, 9]
    # node 4 (second level of tree 0) and tanh 10 of tree 1 become ready
    assert f.ready_nodes(1).tolist() == [4]
    assert f.ready_nodes(2).tolist() == [10]
    assert f.remaining_count.tolist() == [0, 1, 2, 2, 1]


def test_frontier_runs_unbatchable_nodes_as_forced_steps(two_trees: Graph) -> None:
    s = run_policy(two_trees, MaxFrontierPolicy())
    s.validate(two_trees)
    assert s.batches[-1].forced and s.batches[-1].node_ids.tolist() == [12]
    assert sum(b.forced for b in s.batches) == 1
    assert s.num_decisions == s.num_batches - 1


@pytest.mark.parametrize("action", [1, 4, 99, -1])
def test_frontier_rejects_masked_action_naming_ready_ops(two_trees: Graph, action: int) -> None:
    f = Frontier(two_trees)
    with pytest.raises(InvalidActionError, match=r"ready op types are \['leaf'\]"):
        f.pop(action)
    assert f.num_executed == 0  # nothing changed


def _typewise_brute_force(g: Graph, executed: np.ndarray) -> list[int]:
    """T(a): unexecuted type-a nodes with no unexecuted type-a ancestor."""
    n = g.num_nodes
    anc = [set() for _ in range(n)]
    for v in range(n):
        for u in g.operands(v).tolist():
            anc[v] |= anc[u] | {u}
    out = [0] * len(g.vocab)
    for v in range(n):
        a = int(g.op_ids[v])
        if not executed[v] and not any(not executed[u] and g.op_ids[u] == a for u in anc[v]):
            out[a] += 1
    return out


def test_frontier_typewise_count_matches_brute_force(two_trees: Graph) -> None:
    f = Frontier(two_trees, typewise=True)
    executed = np.zeros(two_trees.num_nodes, bool)
    rng = np.random.default_rng(0)
    while not f.done:
        while (b := f.pop_forced()) is not None:
            executed[b.node_ids] = True
        if f.done:
            break
        batchable = f.graph.vocab.batchable
        counts = _typewise_brute_force(two_trees, executed)
        assert [c for c, ok in zip(f.typewise_count.tolist(), batchable) if ok] == \
               [c for c, ok in zip(counts, batchable) if ok]
        a = int(rng.choice(np.flatnonzero(f.mask())))
        executed[f.pop(a).node_ids] = True


def test_view_arrays_are_read_only(two_trees: Graph) -> None:
    view = Frontier(two_trees).view()
    with pytest.raises(ValueError):
        view.ready_count[0] = 3
