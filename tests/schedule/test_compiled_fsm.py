"""The FSM's run-time path on the compiled core against the Python FSMPolicy (the oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from edbatch.graph import Graph
from edbatch.schedule import FrontierView, PolicyScheduler, run_policy
from edbatch.schedule.compiled import COMPILED_ENCODINGS, COMPILED_RULES, CompiledFsmScheduler
from edbatch.workloads import REAL_CASES
from envs.encoding import encode_state, key_actions
from policies.expert import ExpertConfig, fit_table, teacher_samples
from policies.fsm import FSMPolicy, make_fallback
from tests.schedule.test_compiled import assert_same, minibatch
from tests.schedule.test_properties import graphs

FALLBACKS = [f for f in COMPILED_RULES if f != "ed_batch"] + ["ed_batch"]


class _Recorder:
    """Visits states along a run; maps every other new state to its *first* ready type,
    which is usually not what any fallback picks, so the table changes the schedule."""

    def __init__(self, encoding: str, needs_typewise: bool) -> None:
        self.encoding, self.needs_typewise = encoding, needs_typewise
        self.table: dict[tuple[int, ...], int] = {}
        self.seen = 0

    def choose(self, view: FrontierView) -> int:
        key = encode_state(view, self.encoding)
        first = key_actions(key, self.encoding)[0]
        if key not in self.table:
            self.seen += 1
            if self.seen % 2:
                self.table[key] = first
        return self.table.get(key, view.ready_ops[-1])


def table_for(graph: Graph, encoding: str) -> dict[tuple[int, ...], int]:
    rec = _Recorder(encoding, True)
    run_policy(graph, rec)
    return rec.table


def check(graph: Graph, encoding: str, fallback: str, table: dict) -> None:  # type: ignore[type-arg]
    names = graph.vocab.names
    py = FSMPolicy(table, encoding, names, fallback)
    co = FSMPolicy(table, encoding, names, fallback)
    sched = co.scheduler("fsm")
    assert isinstance(sched, CompiledFsmScheduler)
    assert isinstance(py.scheduler("fsm", backend="python"), PolicyScheduler)
    s = sched(graph)
    s.validate(graph)
    assert_same(s, py.scheduler("fsm", backend="python")(graph))
    assert (co.hits, co.misses) == (py.hits, py.misses)


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_fsm_equals_python(workload: str, granularity: str) -> None:
    """Every encoding, each with one fallback in turn (all pairs: the slow test below)."""
    graph = minibatch(workload, granularity, 8 if granularity == "cell" else 4)
    for i, encoding in enumerate(COMPILED_ENCODINGS):
        table = table_for(graph, encoding)
        assert table
        check(graph, encoding, FALLBACKS[i % len(FALLBACKS)], table)
        check(graph, encoding, "ed_batch", {})  # empty table: the fallback alone


#: a teacher cheap enough for a unit test (rollout only, small budget, one graph)
_TEACHER = ExpertConfig(rounds=1, budget=2_000, exact_max_nodes=0, prune=False, augment=0)


def expert_tables(graph: Graph, train: Graph) -> dict[str, dict[tuple[int, ...], int]]:
    """Two non-empty ``expert`` tables for ``graph``: the teacher's majority votes on
    ``train`` (:mod:`policies.expert`, unpruned), and the Python policy's own keys on
    ``graph`` mapped to seeded random ready types of the key."""
    votes: dict = {}  # type: ignore[type-arg]
    teacher_samples([train], [lambda: make_fallback("critical_path", "expert")], _TEACHER,
                    votes)
    rng = np.random.default_rng(0)
    rec = _Recorder("expert", True)
    run_policy(graph, rec)
    own = {key: int(rng.choice(key_actions(key, "expert"))) for key in rec.table}
    return {"teacher": fit_table(votes, 1, 0.5), "random": own}


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_expert_fsm_equals_python(workload: str, granularity: str) -> None:
    """The ``expert`` key (critical-path gap and completeness per ready type) on learned and
    random non-empty tables: same schedule, hits and misses as the Python FSMPolicy."""
    graph = minibatch(workload, granularity, 8)
    tables = expert_tables(graph, minibatch(workload, granularity, 4))
    for kind, table in tables.items():
        assert table, kind
        for fallback in ("critical_path", "ed_batch", "typewise_greedy"):
            check(graph, "expert", fallback, table)
    policy = FSMPolicy(tables["random"], "expert", graph.vocab.names, "critical_path")
    policy.scheduler()(graph)
    assert policy.hits > 0  # the random table answers some decisions


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_fsm_equals_python_all_pairs(workload: str, granularity: str) -> None:
    graph = minibatch(workload, granularity)
    for encoding in COMPILED_ENCODINGS:
        table = table_for(graph, encoding)
        for fallback in FALLBACKS:
            check(graph, encoding, fallback, table)


def test_table_hits_happen_and_change_the_schedule() -> None:
    graph = minibatch("lattice_lstm", "cell")
    table = table_for(graph, "sorted")
    policy = FSMPolicy(table, "sorted", graph.vocab.names, "critical_path")
    with_table = policy.scheduler()(graph)
    assert policy.hits > 0 and policy.misses > 0
    alone = FSMPolicy({}, "sorted", graph.vocab.names, "critical_path").scheduler()(graph)
    assert [b.op_id for b in with_table.batches] != [b.op_id for b in alone.batches]


def test_table_actions_that_are_not_ready_fall_back() -> None:
    graph = minibatch("tree_lstm", "cell")
    table = {k: (a + 1) % len(graph.vocab) for k, a in table_for(graph, "base").items()}
    check(graph, "base", "typewise_greedy", table)


def test_unknown_encoding_keeps_the_python_path() -> None:
    graph = minibatch("tree_lstm", "cell")
    policy = FSMPolicy({}, "base", graph.vocab.names, "dynet_agenda")
    policy.encoding = "not_compiled"  # e.g. a key added in envs.encoding but not compiled
    assert isinstance(policy.scheduler(), PolicyScheduler)


@settings(max_examples=25, deadline=None)
@given(graphs())
def test_compiled_fsm_equals_python_on_random_dags(graph: Graph) -> None:
    assert "expert" in COMPILED_ENCODINGS
    for encoding in COMPILED_ENCODINGS:
        table = table_for(graph, encoding)
        for fallback in ("ed_batch", "critical_path", "ed_batch_agenda"):
            check(graph, encoding, fallback, table)
