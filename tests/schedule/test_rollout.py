"""Fortified rollout: valid schedules, never worse than its bases, budget and LB stops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from edbatch.graph import Graph
from edbatch.schedule import (
    CriticalPathPolicy,
    MaxFrontierPolicy,
    RolloutScheduler,
    TypewiseGreedyPolicy,
    lower_bound,
    make_scheduler,
    rollout_schedule,
    run_policy,
)
from edbatch.schedule.exact import exact_schedule
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_lattices
from tests.schedule.test_properties import SETTINGS, graphs


@SETTINGS
@given(graphs())
def test_rollout_is_valid_and_never_worse_than_any_base(graph: Graph) -> None:
    bases = [MaxFrontierPolicy, TypewiseGreedyPolicy]
    s = rollout_schedule(graph, bases)
    s.validate(graph)
    base_counts = [run_policy(graph, b()).num_batches for b in bases]
    assert lower_bound(graph) <= s.num_batches <= min(base_counts)
    exact = exact_schedule(graph, node_budget=50_000)
    assert exact.optimal and exact.num_batches <= s.num_batches


def test_rollout_beats_its_base_on_a_real_lattice_minibatch() -> None:
    """On 16 SST-style lattices the search finds schedules the greedy rule misses."""
    g = next(iter(make_workload("lattice_lstm").batches("dev", 16, limit=1)))
    base = run_policy(g, CriticalPathPolicy()).num_batches
    s = make_scheduler("rollout")(g)
    s.validate(g)
    assert s.num_batches < base
    assert s.scheduler == "rollout"


def test_zero_budget_is_the_best_base_alone() -> None:
    g = random_lattices(np.random.default_rng(3), 6, 12, 3)
    bases = [MaxFrontierPolicy, TypewiseGreedyPolicy]
    best = min(run_policy(g, b()).num_batches for b in bases)
    s = rollout_schedule(g, bases, budget=0)
    assert s.num_batches == best
    s.validate(g)


def test_stops_searching_at_the_lower_bound() -> None:
    """A graph the base already schedules at LB costs one rollout, not one per decision."""
    calls = []

    class Counting(CriticalPathPolicy):
        def __init__(self) -> None:
            super().__init__()
            calls.append(1)

    g = next(iter(make_workload("tree_lstm").batches("dev", 8, limit=1)))
    s = rollout_schedule(g, [Counting])
    assert s.num_batches == lower_bound(g)
    assert len(calls) == 2  # one probe for needs_typewise, one rollout


def test_bad_arguments() -> None:
    g = random_lattices(np.random.default_rng(0), 1, 4, 2)
    with pytest.raises(ValueError, match="at least one base"):
        rollout_schedule(g, [])
    with pytest.raises(ValueError, match="negative"):
        rollout_schedule(g, [CriticalPathPolicy], budget=-1)
    with pytest.raises(ValueError, match="at least one base"):
        RolloutScheduler([])
