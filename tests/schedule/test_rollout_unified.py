"""One fortified rollout for both objectives: batch count (a cost of 1 per batch) and any
``(op type, batch size) -> cost``. The two separate rollouts the project had before are kept
here, frozen, as references: the unified one must give the same schedules and the same
floats on real workload graphs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest

from edbatch.graph import Graph
from edbatch.schedule import (
    CriticalPathPolicy,
    TypewiseGreedyPolicy,
    lower_bound,
    rollout_schedule,
)
from edbatch.schedule.frontier import Frontier
from edbatch.schedule.policy import Policy, drive
from edbatch.workloads import make_workload


def _old_batch_rollout(graph: Graph, bases: Sequence[Callable[[], Policy]],
                       budget: int) -> list[tuple[int, tuple[int, ...]]]:
    """The batch-count rollout as it was (edbatch/schedule/rollout.py before unification)."""
    typewise = any(getattr(b(), "needs_typewise", False) for b in bases)
    frontier = Frontier(graph, typewise=typewise)
    floor = lower_bound(graph)
    best_cost, best_tail, spent = -1, [], 0

    def complete(f: Frontier, policy: Policy) -> list[int]:
        batches = drive(f, lambda fr: int(policy.choose(fr.view())))
        return [b.op_id for b in batches if not b.forced]

    def search(start: Frontier, first: int | None) -> None:
        nonlocal best_cost, best_tail, spent
        for i, base in enumerate(bases):
            f = start if i == len(bases) - 1 else start.copy()
            before = f.num_batches
            tail = complete(f, base())
            spent += f.num_batches - before
            if best_cost < 0 or f.num_batches < best_cost:
                best_cost = f.num_batches
                best_tail = tail if first is None else [first, *tail]

    def decide(f: Frontier) -> int:
        nonlocal best_tail
        ready = f.view().ready_ops
        if len(ready) > 1 and spent < budget and best_cost > floor:
            planned = best_tail[0]
            for a in ready:
                if a != planned:
                    trial = f.copy()
                    trial.pop(a)
                    search(trial, a)
        action, best_tail = best_tail[0], best_tail[1:]
        return action

    search(frontier.copy(), None)
    return [(b.op_id, tuple(b.node_ids.tolist())) for b in drive(frontier, decide)]


def _old_cost_rollout(graph: Graph, cost, bases: Sequence[Callable[[], Policy]],
                      budget: int) -> list[tuple[int, tuple[int, ...]]]:
    """The modelled-cost rollout as it was (edbatch/executor/cost_schedule.py before)."""
    vocab = graph.vocab
    typewise = any(getattr(b(), "needs_typewise", False) for b in bases)
    frontier = Frontier(graph, typewise=typewise)
    best: list[float] = [math.inf]
    plan: list[int] = []
    spent = 0

    def complete(start: Frontier, prefix_cost: float, first: int | None) -> None:
        nonlocal plan, spent
        for i, base in enumerate(bases):
            f = start if i == len(bases) - 1 else start.copy()
            policy = base()
            tail = drive(f, lambda fr, p=policy: int(p.choose(fr.view())))
            spent += len(tail)
            total = prefix_cost + sum(cost(vocab[b.op_id], len(b)) for b in tail)
            if total < best[0] - 1e-12:
                best[0] = total
                decisions = [b.op_id for b in tail if not b.forced]
                plan = decisions if first is None else [first, *decisions]

    prefix = 0.0

    def decide(f: Frontier) -> int:
        nonlocal plan
        ready = f.view().ready_ops
        if len(ready) > 1 and spent < budget:
            for a in ready:
                if a != plan[0]:
                    trial = f.copy()
                    first = trial.pop(a)
                    complete(trial, prefix + cost(vocab[a], len(first)), a)
        action, plan = plan[0], plan[1:]
        return action

    complete(frontier.copy(), 0.0, None)
    out = []
    while True:
        while (forced := frontier.pop_forced()) is not None:
            out.append(forced)
            prefix += cost(vocab[forced.op_id], len(forced))
        if frontier.done:
            break
        b = frontier.pop(decide(frontier))
        out.append(b)
        prefix += cost(vocab[b.op_id], len(b))
    return [(b.op_id, tuple(b.node_ids.tolist())) for b in out]


def _batches(schedule) -> list[tuple[int, tuple[int, ...]]]:
    return [(b.op_id, tuple(b.node_ids.tolist())) for b in schedule.batches]


def _graphs() -> list[tuple[str, Graph]]:
    out = []
    for name, gran, size in [("tree_lstm", "primitive", 2), ("lattice_lstm", "cell", 8),
                             ("lattice_lstm", "primitive", 2), ("bilstm_tagger", "cell", 8)]:
        wl = make_workload(name, granularity=gran)
        for k, g in enumerate(wl.batches("dev", size, limit=1)):
            out.append((f"{name}/{gran}/{k}", g))
    return out


GRAPHS = _graphs()
BASES = [CriticalPathPolicy, TypewiseGreedyPolicy]


@pytest.mark.parametrize("budget", [0, 2_000, 20_000])
@pytest.mark.parametrize("label_graph", GRAPHS, ids=[g[0] for g in GRAPHS])
def test_unit_cost_rollout_is_the_old_batch_count_rollout(label_graph, budget) -> None:
    _, g = label_graph
    new = rollout_schedule(g, BASES, budget=budget)
    assert _batches(new) == _old_batch_rollout(g, BASES, budget)
    # an explicit unit cost function (no lower-bound stop) reaches the same schedule
    unit = rollout_schedule(g, BASES, budget=budget, cost=lambda op, n: 1.0)
    assert unit.num_batches == new.num_batches
    unit.validate(g)


def _model_cost(g: Graph):
    """A deterministic modelled cost with launch overhead and per-row terms of unequal size
    per op type (floats that do not add up exactly, so float order matters)."""
    weights = {op.name: 0.1 + 0.37 * (i % 5) for i, op in enumerate(g.vocab)}

    def cost(op, n: int) -> float:
        return 0.013 + weights[op.name] * math.log1p(n) / 3.0

    return cost


@pytest.mark.parametrize("label_graph", GRAPHS, ids=[g[0] for g in GRAPHS])
def test_cost_rollout_is_the_old_cost_rollout_to_the_float(label_graph) -> None:
    from edbatch.executor.cost_schedule import cost_rollout_schedule

    _, g = label_graph
    cost = _model_cost(g)
    new = cost_rollout_schedule(g, cost, BASES, budget=5_000)
    old = _old_cost_rollout(g, cost, BASES, 5_000)
    assert _batches(new) == old
    new_ms = sum(cost(g.vocab[b.op_id], len(b)) for b in new.batches)
    old_ms = sum(cost(g.vocab[op], len(nodes)) for op, nodes in old)
    assert new_ms == old_ms


@pytest.mark.slow  # about 10 s on an idle machine, 25 s at load 9
def test_both_rules_on_a_graph_where_they_part() -> None:
    """On this lattice mini-batch the cost rollout's old rule (once a candidate has beaten
    the plan, the formerly planned type is tried too) gives another schedule than the batch
    rollout's (never try the planned type): each entry point keeps its own."""
    from edbatch.executor.cost_schedule import cost_rollout_schedule

    g = list(make_workload("lattice_lstm").batches("dev", 16, limit=2))[1]
    cost = _model_cost(g)
    retried = cost_rollout_schedule(g, cost, BASES, budget=30_000)
    assert _batches(retried) == _old_cost_rollout(g, cost, BASES, 30_000)
    kept = rollout_schedule(g, BASES, budget=30_000, cost=cost)
    assert _batches(kept) != _batches(retried)  # the graph does tell the rules apart
    assert _batches(rollout_schedule(g, BASES, budget=30_000)) == _old_batch_rollout(
        g, BASES, 30_000)
