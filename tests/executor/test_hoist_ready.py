"""The projection groups' readiness from the graph (``_ready_nodes``: each hoisted slot's
producer batch by node) equals the plan-based oracle (``_ready``: the producer batch of
every row the plan reads), and their operand reads from the graph
(``projection_operands``) the plan's, on the hoisted workloads, schedulers and plans; in
both forms (``_hoist_ready_compiled``'s numba loops and their numpy twins)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from edbatch.executor._hoist import hoist_kinds, hoisted_batches
from edbatch.executor._hoist_ready import projection_operands
from edbatch.executor._hoist_ready import ready as _ready
from edbatch.executor._hoist_ready import ready_nodes as _ready_nodes
from edbatch.executor._reads import RowLocator
from edbatch.executor.cells_hoist import HOISTS
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import make_workload


def _fixed_arity_groups(graph: Graph, schedule: Schedule, plan: MemoryPlan
                        ) -> Iterator[tuple[list[int], tuple[int, ...]]]:
    """Each hoisted fixed-arity op type's batches and its hoisted slots."""
    for op_id, batches in hoisted_batches(graph, schedule, plan, hoist_kinds(True)).items():
        op = graph.vocab[op_id]
        if op.arity is not None:
            yield batches, HOISTS[op.kind].hoisted


@pytest.mark.parametrize("backend", ["compiled", "python"])
@pytest.mark.parametrize("scheduler", ["depth", "critical_path", "dynet_agenda"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "seq2seq",
                                  "bilstm_char_tagger"])
def test_ready_from_graph_equals_plan_oracle(name: str, scheduler: str, backend: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Both forms (numba; numpy, its twin) equal the plan's oracle."""
    monkeypatch.setenv("EDBATCH_BACKEND", backend)
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(8))
    compared = 0
    for schedule in (make_scheduler(scheduler)(graph),):
        bare = Schedule(schedule.batches, schedule.scheduler)  # flat() from the batches
        for strategy in ("naive", "planned"):
            plan = plan_memory(graph, schedule, strategy, cache=False)
            batch_of = RowLocator(plan).batch_of
            for s in (schedule, bare):
                _, bptr, nodes, _ = s.flat()
                step = np.empty(graph.num_nodes, np.int64)
                step[nodes] = np.repeat(np.arange(len(bptr) - 1), np.diff(bptr))
                for batches, slots in _fixed_arity_groups(graph, s, plan):
                    assert _ready_nodes(graph, s, step, batches, slots) == \
                        _ready(plan, batch_of, batches, slots)
                    compared += 1
    assert compared


def _same(a: object, b: object) -> bool:
    va, vb = a.view, b.view  # type: ignore[attr-defined]
    if (va is None) != (vb is None) or a.arena != b.arena:  # type: ignore[attr-defined]
        return False
    if va is not None:
        return (va.arena, va.start, va.stop) == (vb.arena, vb.start, vb.stop)
    return bool(np.array_equal(a.gather, b.gather))  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["compiled", "python"])
@pytest.mark.parametrize("scheduler", ["depth", "critical_path"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "seq2seq",
                                  "bilstm_char_tagger", "transition_parser"])
def test_projection_operands_from_graph_equal_the_plans(name: str, scheduler: str,
                                                        backend: str,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A projection group's hoisted operand reads from the graph's operand rows (one
    compiled loop, or one numpy pass: its twin) equal the plan operands' concatenation,
    every group size, both plans."""
    monkeypatch.setenv("EDBATCH_BACKEND", backend)
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(8))
    schedule = make_scheduler(scheduler)(graph)
    _, bptr, _, _ = schedule.flat()
    compared = views = graphed = 0
    for strategy in ("naive", "planned"):
        plan = plan_memory(graph, schedule, strategy, cache=False)
        order = plan.flat_order().astype(np.int64)
        base = np.arange(max(rows for rows, _ in plan.arenas), dtype=np.int64)
        for batches, slots in _fixed_arity_groups(graph, schedule, plan):
            for group in (batches, batches[:1], batches[1::2] or batches):
                nodes = np.concatenate([order[bptr[b]:bptr[b + 1]] for b in group])
                mine = projection_operands(plan, group, slots, base, graph, nodes)
                want = projection_operands(plan, group, slots, base)
                assert len(mine) == len(want) == len(slots)
                assert all(_same(a, b) for a, b in zip(mine, want, strict=True))
                views += sum(o.view is not None for o in mine)
                compared += 1
                graphed += all(bool((plan.node_arena[graph.operand_ids[
                    graph.operand_ptr[nodes] + k]] == o.arena).all())
                    for k, o in zip(slots, want, strict=True))  # (the graph's way taken)
    assert compared and graphed == compared
    if name == "bilstm_tagger":
        assert views  # (the layer-1 inputs: one embedding view)
