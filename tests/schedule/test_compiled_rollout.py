"""The compiled fortified rollout equals the Python search (the oracle), batch for batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.graph import Graph
from edbatch.schedule import (
    AgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    MaxFrontierPolicy,
    RandomPolicy,
    TypewiseGreedyPolicy,
    rollout_schedule,
    run_policy,
)
from edbatch.schedule import rollout as rollout_module
from edbatch.schedule.compiled_rollout import compiled_bases, compiled_rollout
from edbatch.schedule.replay import ReplayPolicy
from edbatch.workloads import REAL_CASES
from policies.fsm import FSMPolicy
from tests.schedule.test_compiled import assert_same, minibatch
from tests.schedule.test_compiled_fsm import table_for
from tests.schedule.test_properties import graphs

BASE_SETS = [[CriticalPathPolicy], [TypewiseGreedyPolicy, CriticalPathPolicy],
             [MaxFrontierPolicy, DynetAgendaPolicy, AgendaPolicy]]


def both(graph: Graph, bases: list, **kw: object) -> None:  # type: ignore[type-arg]
    """Compiled and Python rollouts give the same valid schedule."""
    assert compiled_bases(bases) is not None
    s = rollout_schedule(graph, bases, **kw)  # type: ignore[arg-type]
    s.validate(graph)
    assert_same(s, rollout_schedule(graph, bases, backend="python", **kw))  # type: ignore[arg-type]


def fsm_bases(graph: Graph, encoding: str, fallback: str) -> list:  # type: ignore[type-arg]
    fsm = FSMPolicy(table_for(graph, encoding), encoding, graph.vocab.names, fallback)
    assert fsm.table
    return [fsm.fork]


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_rollout_equals_python_on_every_workload(workload: str, granularity: str
                                                          ) -> None:
    graph = minibatch(workload, granularity, 4)
    budget = 4_000 if granularity == "cell" else 1_500  # the Python oracle is the slow side
    for bases in BASE_SETS:
        both(graph, bases, budget=budget)
    both(graph, fsm_bases(graph, "expert", "critical_path"), budget=budget)
    both(graph, [*fsm_bases(graph, "hints", "typewise_greedy"), CriticalPathPolicy],
         budget=budget, retry_planned=True)


@settings(max_examples=40, deadline=None)
@given(graphs(), st.sampled_from(range(len(BASE_SETS))), st.sampled_from([0, 7, 60, 100_000]),
       st.booleans())
def test_compiled_rollout_equals_python_on_random_dags(graph: Graph, which: int, budget: int,
                                                       retry: bool) -> None:
    both(graph, BASE_SETS[which], budget=budget, retry_planned=retry)


@settings(max_examples=25, deadline=None)
@given(graphs(), st.sampled_from(["sorted", "expert", "complete"]),
       st.sampled_from(["ed_batch", "critical_path", "max_frontier"]))
def test_compiled_rollout_over_an_fsm_equals_python(graph: Graph, encoding: str,
                                                    fallback: str) -> None:
    table = table_for(graph, encoding)
    if table:  # a graph whose decisions all fall in one state (or none) records no entry
        fsm = FSMPolicy(table, encoding, graph.vocab.names, fallback)
        both(graph, [fsm.fork], budget=500)
    empty = FSMPolicy({}, encoding, graph.vocab.names, fallback)
    both(graph, [empty.fork], budget=500)


@settings(max_examples=25, deadline=None)
@given(graphs(), st.sampled_from(["sorted", "hints", "complete"]),
       st.sampled_from(["typewise_greedy_backward", "dynet_level_agenda", "depth"]),
       st.booleans())
def test_compiled_rollout_over_replay_fallbacks_equals_python(graph: Graph, encoding: str,
                                                              heuristic: str, retry: bool
                                                              ) -> None:
    """FSMs whose fallback is ``replay:<heuristic>`` (what ``fallback: auto`` picks when a
    whole-graph heuristic is best) and the replay rule alone run on the core too (the Python
    search took ~90 s per 1,000-node, 100-type graph), with the same schedules."""
    fallback = "replay:" + heuristic
    table = table_for(graph, encoding)
    bases = [FSMPolicy(table, encoding, graph.vocab.names, fallback).fork,
             lambda: ReplayPolicy("typewise_greedy_backward")]
    if table:
        both(graph, bases, budget=300, retry_planned=retry)
    both(graph, [FSMPolicy({}, encoding, graph.vocab.names, fallback).fork, CriticalPathPolicy],
         budget=300)


def test_replay_fallback_rollout_runs_compiled_on_a_real_minibatch() -> None:
    graph = minibatch("lattice_lstm", "cell", 4)
    fallback = "replay:typewise_greedy_backward"
    fsm = FSMPolicy(table_for(graph, "hints"), "hints", graph.vocab.names, fallback)
    (core,) = compiled_bases([fsm.fork])  # type: ignore[misc]
    assert core[:2] == (fallback, "hints") and core[2] is not None and core[2].size
    both(graph, [fsm.fork], budget=2_000)


@settings(max_examples=25, deadline=None)
@given(graphs(), st.sampled_from([0, 40, 400, 10**6]), st.sampled_from([0, 5, 50]),
       st.sampled_from([0, 30]))
def test_level2_equals_python_and_never_loses_to_its_first_plan(
        graph: Graph, budget: int, inner: int, plan: int) -> None:
    bases = [CriticalPathPolicy, MaxFrontierPolicy]
    kw = {"budget": budget, "level": 2, "inner_budget": inner, "plan_budget": plan}
    both(graph, bases, **kw)
    s = rollout_schedule(graph, bases, **kw)  # type: ignore[arg-type]
    assert s.num_batches <= rollout_schedule(graph, bases, budget=plan).num_batches


def test_level2_on_a_real_minibatch_equals_python_and_improves() -> None:
    graph = minibatch("lattice_lstm", "cell", 4)
    bases = [CriticalPathPolicy]
    kw = {"budget": 20_000, "level": 2, "inner_budget": 300, "plan_budget": 1_000}
    both(graph, bases, **kw)
    level1 = rollout_schedule(graph, bases, budget=1_000).num_batches
    assert rollout_schedule(graph, bases, **kw).num_batches <= level1  # type: ignore[arg-type]


def test_budget_is_counted_in_batches_so_schedules_repeat() -> None:
    graph = minibatch("lattice_lstm", "cell", 8)
    bases = compiled_bases([CriticalPathPolicy])
    assert bases is not None
    runs = [compiled_rollout(graph, bases, budget=b) for b in (2_000, 2_000, 0)]
    assert_same(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    # a search stops at the first decision after its budget is spent: one more decision's
    # rollouts (at most ready types x one completion) can exceed it
    assert 2_000 <= runs[0][1] <= 2_000 + graph.num_nodes * len(graph.vocab)
    # budget 0: the base's own schedule (one rollout, then no search)
    alone = run_policy(graph, CriticalPathPolicy())
    assert runs[2][0].num_batches == alone.num_batches
    assert runs[2][1] == alone.num_batches


def test_unsupported_bases_and_costs_take_the_python_search(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    graph = minibatch("tree_lstm", "cell", 4)
    calls = []
    real = rollout_module.compiled_rollout
    monkeypatch.setattr(rollout_module, "compiled_rollout",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    assert compiled_bases([lambda: RandomPolicy(3)]) is None
    rollout_schedule(graph, [lambda: RandomPolicy(3)], budget=500).validate(graph)
    rollout_schedule(graph, [CriticalPathPolicy], budget=500, cost=lambda op, n: 1.0)
    rollout_schedule(graph, [CriticalPathPolicy], budget=500, backend="python")
    monkeypatch.setenv("EDBATCH_BACKEND", "python")
    rollout_schedule(graph, [CriticalPathPolicy], budget=500)
    assert not calls
    monkeypatch.delenv("EDBATCH_BACKEND")
    rollout_schedule(graph, [CriticalPathPolicy], budget=500)
    assert calls == [1]


def test_bad_level_and_budgets() -> None:
    graph = minibatch("tree_lstm", "cell", 2)
    with pytest.raises(ValueError, match="level=3"):
        rollout_schedule(graph, [CriticalPathPolicy], level=3)
    with pytest.raises(ValueError, match="no cost"):
        rollout_schedule(graph, [CriticalPathPolicy], level=2, cost=lambda op, n: 1.0)
    with pytest.raises(ValueError, match="inner_budget=-1"):
        rollout_schedule(graph, [CriticalPathPolicy], level=2, inner_budget=-1)


def test_fsm_lookahead_rollout2_option(tmp_path: object) -> None:
    """``lookahead=rollout2``: level 2 over the FSM, compiled == Python, saved in the
    artifact; a bad value names the choices."""
    from pathlib import Path

    from edbatch.errors import PolicyFileError, UnknownNameError

    graph = minibatch("tree_lstm", "cell", 2)
    table = table_for(graph, "expert")
    fsm = FSMPolicy(table, "expert", graph.vocab.names, "critical_path", lookahead="rollout2")
    sched = fsm.scheduler("fsm")
    assert (sched.level, sched.budget) == (2, 10_000_000)  # type: ignore[attr-defined]
    s = sched(graph)
    s.validate(graph)
    assert_same(s, fsm.scheduler("fsm", backend="python")(graph))
    level1 = FSMPolicy(table, "expert", graph.vocab.names, "critical_path", lookahead="rollout")
    assert s.num_batches <= level1.scheduler("fsm")(graph).num_batches
    path = fsm.save(Path(str(tmp_path)) / "p.json")
    assert FSMPolicy.load(path).lookahead == "rollout2"
    with pytest.raises(UnknownNameError, match="unknown lookahead 'rollout3'.*rollout2"):
        FSMPolicy(table, "expert", graph.vocab.names, "critical_path", lookahead="rollout3")
    path.write_text(path.read_text().replace('"rollout2"', '"rollout_2"'))
    with pytest.raises(PolicyFileError, match="lookahead 'rollout_2'"):
        FSMPolicy.load(path)


@pytest.mark.parametrize("override, key", [("policy.lookahead=rollout3", "policy.lookahead"),
                                           ("++trainer.lookahead=beam", "trainer.lookahead")])
def test_bad_lookahead_in_a_config_is_a_config_error(override: str, key: str) -> None:
    from edbatch.errors import ConfigError
    from experiments._schema import validate
    from tests.experiments.test_bad_config import _compose

    validate(_compose("train", ["policy.lookahead=rollout2"]))  # the new option is accepted
    with pytest.raises(ConfigError, match=f"config key {key}=.*rollout2"):
        validate(_compose("train", [override]))
