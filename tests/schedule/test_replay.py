"""The ``replay:<heuristic>`` fallback: compiled rule vs its Python twin, the trace, names."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from edbatch.errors import UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import make_scheduler
from edbatch.schedule._compiled_replay import replay_choice
from edbatch.schedule.compiled import CompiledFsmScheduler, FsmTable
from edbatch.schedule.named import HEURISTICS, make_heuristic
from edbatch.schedule.replay import (
    REPLAYABLE,
    ReplayPolicy,
    rank_of,
    replay_heuristic,
    replay_ranks,
    replay_trace,
)
from policies.fsm import FSMPolicy
from policies.table_search import policy_votes
from tests.schedule.test_compiled import assert_same, minibatch
from tests.schedule.test_compiled_fsm import table_for
from tests.schedule.test_properties import graphs


def _pair(graph: Graph, fallback: str, table: dict, encoding: str = "hints"  # type: ignore[type-arg]
          ) -> tuple[FSMPolicy, FSMPolicy]:
    """The compiled FSM and its Python oracle (the twin, ranks from the Python heuristic)."""
    names = graph.vocab.names
    co, py = FSMPolicy(table, encoding, names, fallback), FSMPolicy(table, encoding, names,
                                                                    fallback)
    py.fallback = ReplayPolicy(replay_heuristic(fallback), backend="python")  # type: ignore[arg-type]
    return co, py


def _check(graph: Graph, fallback: str, table: dict, encoding: str = "hints") -> int:  # type: ignore[type-arg]
    co, py = _pair(graph, fallback, table, encoding)
    sched = co.scheduler("fsm")
    assert isinstance(sched, CompiledFsmScheduler)
    s = sched(graph)
    s.validate(graph)
    assert_same(s, py.scheduler("fsm", backend="python")(graph))
    assert (co.hits, co.misses) == (py.hits, py.misses)
    return s.num_batches


@settings(max_examples=10, deadline=None)
@given(graphs())
def test_make_heuristic_gives_the_registry_schedule_on_both_backends(graph: Graph) -> None:
    """The one registry both replay and zoo use: the compiled and the Python form of each
    heuristic give the schedule ``make_scheduler`` gives, and replay follows exactly them."""
    assert REPLAYABLE == HEURISTICS
    for h in HEURISTICS:
        want = [tuple(b.node_ids) for b in make_scheduler(h, backend="python")(graph).batches]
        for backend in ("compiled", "python"):
            got = make_heuristic(h, backend)(graph)
            assert [tuple(b.node_ids) for b in got.batches] == want, (h, backend)
    with pytest.raises(UnknownNameError, match="'rollout'.*critical_path"):
        make_heuristic("rollout")


@settings(max_examples=25, deadline=None)
@given(graphs())
def test_compiled_replay_equals_the_twin_on_random_graphs(graph: Graph) -> None:
    for h in REPLAYABLE:
        _check(graph, "replay:" + h, {})
    _check(graph, "replay:typewise_greedy_backward", table_for(graph, "hints"))


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_replay_never_needs_more_batches_than_the_replayed_schedule(graph: Graph) -> None:
    """The property proven in :mod:`edbatch.schedule.replay`: each decision finishes the
    earliest unfinished batch of the replayed schedule."""
    for h in REPLAYABLE:
        own = make_scheduler(h)(graph).num_batches
        co, _ = _pair(graph, "replay:" + h, {})
        assert co.scheduler("fsm")(graph).num_batches <= own, h


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_compiled_level_agenda_ranks_equal_the_python_schedule(graph: Graph) -> None:
    np.testing.assert_array_equal(
        replay_ranks(graph, "dynet_level_agenda"),
        rank_of(make_scheduler("dynet_level_agenda", backend="python")(graph), graph.num_nodes))


@pytest.mark.parametrize(("workload", "granularity"), [("lattice_lstm", "cell"),
                                                       ("lattice_lstm", "primitive")])
def test_compiled_replay_equals_the_twin_on_real_graphs(workload: str, granularity: str) -> None:
    graph = minibatch(workload, granularity, 2 if granularity == "cell" else 1)
    cheap = granularity == "primitive"  # the Python oracles are slow on primitive graphs
    for h in ("typewise_greedy_backward",) if cheap else ("typewise_greedy_backward",
                                                          "dynet_level_agenda", "depth"):
        _check(graph, "replay:" + h, {})
        _check(graph, "replay:" + h, table_for(graph, "expert"), "expert")


def test_replay_with_empty_table_follows_the_rank_rule() -> None:
    """The replay alone on a schedule's own ranks: at each decision the chosen batch holds
    the smallest rank among the ready nodes (checked through the Python frontier)."""
    graph = minibatch("lattice_lstm", "cell", 2)
    rank = replay_ranks(graph, "typewise_greedy_backward")
    own = make_scheduler("typewise_greedy_backward")(graph)
    np.testing.assert_array_equal(rank, rank_of(own, graph.num_nodes))
    assert rank.min() == 0 and rank.max() == own.num_batches - 1
    co, _ = _pair(graph, "replay:typewise_greedy_backward", {})
    s = co.scheduler("fsm")(graph)
    done = np.zeros(graph.num_nodes, bool)
    ptr, ids = graph.operand_ptr, graph.operand_ids
    for b in s.batches:
        ready = [v for v in range(graph.num_nodes) if not done[v]
                 and done[ids[ptr[v]:ptr[v + 1]]].all() and graph.batchable_node[v]]
        if not b.forced:
            assert rank[b.node_ids].min() == min(rank[ready])
            assert sorted(b.node_ids) == [v for v in ready if graph.op_ids[v] == b.op_id]
        done[b.node_ids] = True


def test_make_scheduler_runs_the_replay_alone() -> None:
    graph = minibatch("lattice_lstm", "cell", 2)
    co = make_scheduler("replay:typewise_greedy_backward")(graph)
    assert co.scheduler == "replay:typewise_greedy_backward"
    assert_same(co, make_scheduler("replay:typewise_greedy_backward", backend="python")(graph))
    with pytest.raises(UnknownNameError, match="replay:critical_path"):
        make_scheduler("replay:nope")


def test_replay_choice_ties_go_to_the_smallest_op_id() -> None:
    rlen = np.array([1, 1, 1], np.int64)
    start = np.array([0, 1, 2, 3], np.int64)
    ready = np.array([0, 1, 2], np.int64)
    batchable = np.array([True, True, True])
    assert replay_choice(3, rlen, batchable, ready, start, np.array([5, 3, 3])) == 1
    assert replay_choice(3, rlen, batchable, ready, start, np.array([5, 4, 3])) == 2
    assert replay_choice(3, rlen, np.array([True, True, False]), ready, start,
                         np.array([5, 4, 3])) == 1
    assert replay_choice(3, np.zeros(3, np.int64), batchable, ready, start,
                         np.array([5, 4, 3])) == -1


@pytest.mark.parametrize("encoding", ["hints", "expert"])
def test_compiled_trace_equals_the_python_votes(encoding: str) -> None:
    graph = minibatch("lattice_lstm", "cell", 2)
    table = table_for(graph, encoding)
    co, py = _pair(graph, "replay:dynet_level_agenda", table, encoding)
    keys, lens, acts, nb = replay_trace(graph, "replay:dynet_level_agenda", encoding,
                                          FsmTable(table))
    got: dict = {}  # type: ignore[type-arg]
    for row, m, a in zip(keys.tolist(), lens.tolist(), acts.tolist()):
        got.setdefault(tuple(row[:m]), {}).setdefault(a, 0)
        got[tuple(row[:m])][a] += 1
    want = {k: dict(c) for k, c in policy_votes(py, [graph], encoding).items()}
    assert got == want
    assert nb == co.scheduler("fsm")(graph).num_batches


@pytest.mark.parametrize("bad", ["replay:", "replay:typewise_greedy_backwards", "replay:exact"])
def test_bad_replay_names_name_the_value_and_the_choices(bad: str) -> None:
    with pytest.raises(UnknownNameError, match="replay:typewise_greedy_backward") as e:
        replay_heuristic(bad)
    assert repr(bad) in str(e.value)
    with pytest.raises(UnknownNameError):
        ReplayPolicy(bad[len("replay:"):])
    assert replay_heuristic("critical_path") is None


def test_python_level_agenda_is_the_same_on_every_run_and_from_a_copy() -> None:
    """The Python policy counts the unexecuted (type, depth) groups of the frontier it is
    given. (It counted a graph's groups once per policy object: a second run of one
    scheduler on the same graph read the counts the first had used up, 436 then 698 batches
    on 16 lattices; and a new policy on a frontier part-way through counted the executed
    nodes too.)"""
    from edbatch.schedule import CompleteLevelAgendaPolicy, Frontier

    g = minibatch("lattice_lstm", "cell", 8)
    sched = make_scheduler("dynet_level_agenda", backend="python")
    first, again = sched(g), sched(g)
    assert rank_of(first, g.num_nodes).tolist() == rank_of(again, g.num_nodes).tolist()
    assert rank_of(first, g.num_nodes).tolist() == \
        replay_ranks(g, "dynet_level_agenda").tolist()
    policy, frontier = CompleteLevelAgendaPolicy(), Frontier(g)
    for _ in range(first.num_batches // 2):  # half way along the policy's own run
        while frontier.pop_forced() is not None:
            pass
        frontier.pop(policy.choose(frontier.view()))
    copy = frontier.copy()
    rest = [frontier.pop(policy.choose(frontier.view())).op_id for _ in range(5)]
    fresh = CompleteLevelAgendaPolicy()
    assert [copy.pop(fresh.choose(copy.view())).op_id for _ in range(5)] == rest
