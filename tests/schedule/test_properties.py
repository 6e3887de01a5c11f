"""Property tests: every scheduler on random synthetic graphs, and frontier invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.graph import Graph
from edbatch.schedule import (
    AgendaPolicy,
    CompleteLevelAgendaPolicy,
    DynetAgendaPolicy,
    Frontier,
    MaxFrontierPolicy,
    RandomPolicy,
    TypewiseGreedyPolicy,
    depth_schedule,
    lower_bound,
    run_policy,
    typewise_greedy_backward,
)
from edbatch.schedule.exact import exact_schedule
from edbatch.workloads.synthetic import chains, random_binary_trees, random_dag, random_lattices

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    """Graphs of up to ~40 nodes from every synthetic generator."""
    kind = draw(st.sampled_from(["dag", "trees", "chains", "lattices"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "dag":
        return random_dag(rng, draw(st.integers(1, 40)), draw(st.integers(1, 4)),
                          draw(st.integers(0, 4)), draw(st.sampled_from([0.0, 0.1, 0.3])),
                          draw(st.one_of(st.none(), st.integers(1, 8))))
    if kind == "trees":
        return random_binary_trees(rng, draw(st.integers(1, 4)), draw(st.integers(1, 10)))
    if kind == "chains":
        return chains(rng, draw(st.integers(1, 4)), draw(st.integers(1, 10)),
                      draw(st.integers(1, 3)))
    return random_lattices(rng, draw(st.integers(1, 3)), draw(st.integers(1, 10)),
                           draw(st.integers(1, 4)))


HEURISTICS = {
    "depth": depth_schedule,
    "dynet_agenda": lambda g: run_policy(g, DynetAgendaPolicy()),
    "agenda": lambda g: run_policy(g, AgendaPolicy()),
    "level_agenda": lambda g: run_policy(g, CompleteLevelAgendaPolicy()),
    "max_frontier": lambda g: run_policy(g, MaxFrontierPolicy()),
    "typewise": lambda g: run_policy(g, TypewiseGreedyPolicy()),
    "typewise_backward": typewise_greedy_backward,
    "random": lambda g: run_policy(g, RandomPolicy(7)),
}


@SETTINGS
@given(graphs())
def test_schedulers_are_valid_and_exact_is_between_lb_and_heuristics(graph: Graph) -> None:
    lb = lower_bound(graph)
    counts = {}
    for name, scheduler in HEURISTICS.items():
        s = scheduler(graph)
        s.validate(graph)
        assert s.num_batches >= lb, name
        counts[name] = s.num_batches
    result = exact_schedule(graph, node_budget=50_000)
    result.schedule.validate(graph)
    assert result.optimal
    assert lb <= result.num_batches <= min(counts.values())
    if lb in counts.values():
        assert result.num_batches == lb


def _ancestors(graph: Graph) -> list[set[int]]:
    anc: list[set[int]] = []
    for v in range(graph.num_nodes):
        s: set[int] = set()
        for u in graph.operands(v).tolist():
            s.add(u)
            s |= anc[u]
        anc.append(s)
    return anc


def _check_frontier(graph: Graph, frontier: Frontier, executed: set[int],
                    anc: list[set[int]]) -> None:
    ops, batchable = graph.op_ids.tolist(), graph.vocab.batchable
    todo = [v for v in range(graph.num_nodes) if v not in executed]
    ready = [v for v in todo if anc[v] <= executed]
    mask = frontier.mask()
    for a in range(len(graph.vocab)):
        nodes = frontier.ready_nodes(a).tolist() if batchable[a] else []
        want = [v for v in ready if ops[v] == a] if batchable[a] else []
        assert nodes == want
        assert bool(mask[a]) == (batchable[a] and bool(want))
        if batchable[a]:  # T(a): unexecuted type-a nodes with no unexecuted type-a ancestor
            free = [v for v in todo if ops[v] == a and not any(
                ops[u] == a and u not in executed for u in anc[v])]
            assert frontier.typewise_count is not None
            assert int(frontier.typewise_count[a]) == len(free)
            assert len(want) <= len(free)


@SETTINGS
@given(graphs(), st.integers(0, 2**32 - 1))
def test_frontier_matches_brute_force_along_a_random_run(graph: Graph, seed: int) -> None:
    anc = _ancestors(graph)
    frontier = Frontier(graph, typewise=True)
    policy = RandomPolicy(seed)
    executed: set[int] = set()
    while True:
        while (forced := frontier.pop_forced()) is not None:
            executed.update(forced.node_ids.tolist())
        _check_frontier(graph, frontier, executed, anc)
        if frontier.done:
            break
        batch = frontier.pop(policy.choose(frontier.view()))
        assert len(batch) > 0
        executed.update(batch.node_ids.tolist())
    assert len(executed) == graph.num_nodes
