"""Heuristics: hand-checked batch counts and the registry."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import ScheduleError, UnknownNameError
from edbatch.graph import Graph, GraphBuilder
from edbatch.schedule import (
    HEURISTICS,
    SCHEDULERS,
    Batch,
    Schedule,
    depth_schedule,
    lower_bound,
    make_scheduler,
    reverse_graph,
)
from tests.conftest import small_vocab


def test_depth_schedule_counts_distinct_depth_type_pairs(two_trees: Graph) -> None:
    s = depth_schedule(two_trees)
    s.validate(two_trees)
    pairs = {(int(d), int(o)) for d, o in zip(two_trees.depth, two_trees.op_ids) if o != 4}
    assert s.num_batches == len(pairs) + 1  # + the unbatchable sum


def test_lower_bound_of_two_trees(two_trees: Graph) -> None:
    # leaf 1 + node chain 2 + tanh 1 + loss 1 + the unbatchable sum 1
    assert lower_bound(two_trees) == 6


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_registered_scheduler_is_valid(two_trees: Graph, name: str) -> None:
    s = make_scheduler(name)(two_trees)
    s.validate(two_trees)
    assert s.num_batches >= lower_bound(two_trees)
    assert s.scheduler == name


def test_agenda_differs_from_depth_where_depth_splits_levels() -> None:
    # A 4-leaf left chain next to a 2-leaf tree: depth splits the 'node' batches by depth,
    # the agenda merges the two trees' first internal nodes.
    b = GraphBuilder(small_vocab())
    from tests.conftest import left_chain_tree

    left_chain_tree(b, 4)
    left_chain_tree(b, 2)
    g = b.build()
    counts = {n: make_scheduler(n)(g).num_batches for n in HEURISTICS}
    assert counts["depth"] == 4 and counts["typewise_greedy"] == 4 == lower_bound(g)


def test_unknown_scheduler_has_hint() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'dynet_agenda'"):
        make_scheduler("dynet_agnda")


def test_reverse_graph_flips_edges(two_trees: Graph) -> None:
    r = reverse_graph(two_trees)
    n = two_trees.num_nodes
    edges = {(int(u), v) for v in range(n) for u in two_trees.operands(v)}
    redges = {(n - 1 - v, n - 1 - int(u)) for v in range(n) for u in r.operands(v)}
    assert edges == redges


def test_validate_catches_late_operand_and_duplicates(two_trees: Graph) -> None:
    good = depth_schedule(two_trees)
    swapped = Schedule((good.batches[1], good.batches[0], *good.batches[2:]), "bad")
    with pytest.raises(ScheduleError, match="operands must run earlier"):
        swapped.validate(two_trees)
    dup = Schedule((*good.batches, good.batches[0]), "bad")
    with pytest.raises(ScheduleError, match="runs 2 times"):
        dup.validate(two_trees)
    wrong = Schedule((Batch(1, np.array([0], np.int32)),), "bad")
    with pytest.raises(ScheduleError, match="a batch holds one op type"):
        wrong.validate(two_trees)
