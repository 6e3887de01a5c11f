"""The sequence search: compiled replay and search against their Python twins, schedules
valid and never worse, and the FSM's ``lookahead=search``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.errors import ScheduleError
from edbatch.graph import Graph
from edbatch.schedule import lower_bound, make_scheduler
from edbatch.schedule._compiled_search import replay_count, search_sequence
from edbatch.schedule.path_bound import path_lower_bound
from edbatch.schedule.search import (
    SearchScheduler,
    _arrays,
    decisions,
    improve_schedule,
    replay_count_python,
    replay_sequence,
    search_sequence_python,
)
from edbatch.workloads.synthetic import chains, random_lattices
from policies.fsm import FSMPolicy
from tests.schedule.test_compiled import minibatch
from tests.schedule.test_properties import graphs


def _compiled_replay(graph: Graph, seq: list[int]) -> tuple[int, list[int]]:
    out = np.empty(graph.num_nodes + 1, np.int64)
    b, n = replay_count(np.asarray(seq, dtype=np.int64), *_arrays(graph), out)
    return b, out[:n].tolist()


@settings(max_examples=60, deadline=None)
@given(graphs(), st.lists(st.integers(0, 5), max_size=30))
def test_compiled_replay_equals_python_and_the_frontier(graph: Graph, raw: list[int]) -> None:
    seq = [t % len(graph.vocab) for t in raw]
    got = _compiled_replay(graph, seq)
    assert got == replay_count_python(graph, seq)
    sched = replay_sequence(graph, seq)
    sched.validate(graph)
    assert sched.num_batches == got[0]
    assert decisions(sched).tolist() == got[1]


@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 3), st.sampled_from([0.0, 0.5, 2.0]),
       st.sampled_from([1, 3]), st.booleans())
def test_compiled_search_equals_python_twin(graph: Graph, seed: int, temperature: float,
                                            window: int, floored: bool) -> None:
    if not graph.vocab.batchable.any():
        return
    seq = decisions(make_scheduler("critical_path")(graph))
    types = np.flatnonzero(graph.vocab.batchable).astype(np.int64)
    floor = lower_bound(graph) if floored else -1  # (stops once a sequence meets it)
    b, best, accepted = search_sequence(seq, *_arrays(graph), types, 150, window,
                                        temperature, seed, floor)
    assert (b, best.tolist(), accepted) == search_sequence_python(
        graph, seq.tolist(), 150, window, temperature, seed, floor)
    assert b >= lower_bound(graph)


def test_a_schedule_at_the_lower_bound_is_returned_without_search(monkeypatch) -> None:
    """(A 5,000-node chain of 5,000 op types, critical path at LB, ran the 200,000 mutants
    for minutes: each replay of a mutant that skipped a type scanned every type per
    decision.)"""
    from edbatch.schedule import _compiled_search

    g = chains(np.random.default_rng(0), 1, 400, 300)
    sched = make_scheduler("critical_path")(g)
    assert sched.num_batches == lower_bound(g)

    def fail(*args: object) -> None:
        raise AssertionError("searched a schedule that meets the lower bound")

    monkeypatch.setattr(_compiled_search, "search_sequence", fail)
    assert improve_schedule(g, sched) is sched


@pytest.mark.parametrize("name", ["critical_path", "typewise_greedy", "dynet_agenda", "rollout"])
def test_replaying_a_schedules_decisions_gives_its_batches(name: str) -> None:
    g = random_lattices(np.random.default_rng(2), 10, 9, 3)
    sched = make_scheduler(name)(g)
    assert _compiled_replay(g, decisions(sched).tolist())[0] == sched.num_batches


def test_improve_schedule_is_valid_never_worse_and_deterministic() -> None:
    rng = np.random.default_rng(11)
    for _ in range(4):
        g = random_lattices(rng, 16, 10, 4)
        start = make_scheduler("critical_path")(g)
        better = improve_schedule(g, start, iterations=2000)
        better.validate(g)
        assert better.num_batches <= start.num_batches
        again = improve_schedule(g, start, iterations=2000)
        assert [b.node_ids.tolist() for b in again.batches] == \
            [b.node_ids.tolist() for b in better.batches]


def test_improves_critical_path_on_real_lattices_down_to_the_path_bound() -> None:
    g = minibatch("lattice_lstm", "cell", 8)
    start = make_scheduler("critical_path")(g)
    better = improve_schedule(g, start, iterations=3000)
    better.validate(g)
    assert path_lower_bound(g).bound <= better.num_batches < start.num_batches
    assert better.scheduler == start.scheduler


def test_bad_arguments_are_named() -> None:
    g = random_lattices(np.random.default_rng(0), 2, 4, 2)
    s = make_scheduler("critical_path")(g)
    for kw in ({"iterations": -1}, {"window": 0}, {"temperature": -0.1}):
        with pytest.raises(ScheduleError, match="improve_schedule needs"):
            improve_schedule(g, s, **kw)  # type: ignore[arg-type]
        with pytest.raises(ScheduleError, match="improve_schedule needs"):
            SearchScheduler(make_scheduler("critical_path"), **kw)  # type: ignore[arg-type]


@pytest.mark.slow  # about 40 s on 2 cores; the registered search scheduler is in the default run
def test_fsm_lookahead_search_round_trips_and_is_never_worse(tmp_path: Path) -> None:
    g = random_lattices(np.random.default_rng(4), 12, 10, 3)
    fsm = FSMPolicy({}, "expert", g.vocab.names, "critical_path", lookahead="search")
    path = tmp_path / "p.json"
    fsm.save(path)
    loaded = FSMPolicy.load(path)
    assert loaded.lookahead == "search"
    sched = loaded.scheduler("fsm")(g)
    sched.validate(g)
    rollout = FSMPolicy({}, "expert", g.vocab.names, "critical_path", lookahead="rollout")
    assert sched.num_batches <= rollout.scheduler("fsm")(g).num_batches
    assert sched.scheduler == "fsm"


def test_registered_search_scheduler_is_never_worse_than_the_rollout() -> None:
    g = minibatch("lattice_lstm", "cell", 8)
    sched = make_scheduler("search", iterations=2000)(g)
    sched.validate(g)
    assert sched.scheduler == "search"
    assert sched.num_batches <= make_scheduler("rollout")(g).num_batches
