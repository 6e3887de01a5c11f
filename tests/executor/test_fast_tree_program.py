"""The Tree-LSTM program made from the plan (``edbatch.executor._fast_tree.tree_program``):
the same short steps, read counts and (built on demand) steps as the usual compile followed
by ``tree_short``, the oracle; ``None`` where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.executor import KERNELS
from edbatch.executor._fast_tree import KIND, FastTreeStep, tree_program, tree_short
from edbatch.executor._hoist import compile_hoisted, hoist_kinds
from edbatch.executor._program import LazySteps
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload
from tests.executor.conftest import assert_same_steps

CPU = torch.device("cpu")


def _case(strategy: str, scheduler: str, size: int = 12) -> tuple[object, ...]:
    wl = make_workload("tree_lstm", embed_dim=8, hidden_dim=6)
    graph = next(iter(wl.batches("dev", size, limit=1)))
    schedule = make_scheduler(scheduler)(graph)
    return graph, schedule, plan_memory(graph, schedule, strategy, cache=False)


def _fields(step: FastTreeStep) -> tuple[object, ...]:
    return (step.arena, step.left.tolist(), step.right.tolist(), step.oa, step.os, step.n,
            step.names, step.hidden, step.name, step.left.dtype, step.left.flags.writeable)


@pytest.mark.parametrize(("strategy", "scheduler"), [("naive", "critical_path"),
                                                     ("planned", "depth"),
                                                     ("aligned", "dynet_agenda")])
def test_same_program_as_compiling_then_tree_short(strategy: str, scheduler: str) -> None:
    graph, schedule, plan = _case(strategy, scheduler)
    kinds = hoist_kinds(True)
    got = tree_program(graph, schedule, plan, CPU, None, kinds)
    want = tree_short(compile_hoisted(graph, schedule, plan, CPU, None, kinds, None), CPU)
    assert got is not None and isinstance(got.steps, LazySteps) and not got.steps.built
    short = [(i, s) for i, s in enumerate(got.short) if s is not None]
    assert short and [i for i, _ in short] == \
        [i for i, s in enumerate(want.short) if s is not None]
    for i, step in short:
        assert isinstance(step, FastTreeStep)
        assert _fields(step) == _fields(want.short[i])
    assert got.counts == want.counts
    assert got.arenas == want.arenas and got.outputs == want.outputs
    assert torch.equal(got.attrs, want.attrs)
    assert_same_steps(got.steps, want.steps)  # the deferred steps built with their reads
    assert got.steps.built


def test_not_applied_where_the_usual_compile_must_run() -> None:
    graph, schedule, plan = _case("naive", "critical_path")
    other = {KIND: lambda *a, **k: None}  # a user's own kernel for the kind
    assert KERNELS.get(KIND) is not other[KIND]
    assert tree_program(graph, schedule, plan, CPU, other, hoist_kinds(True)) is None
    kinds = frozenset({KIND})  # a kind of the graph to hoist: the hoisting compile
    assert tree_program(graph, schedule, plan, CPU, None, kinds) is None
    wl = make_workload("bilstm_tagger", embed_dim=8, hidden_dim=6)
    g = next(iter(wl.batches("dev", 4, limit=1)))
    s = make_scheduler("depth")(g)
    assert tree_program(g, s, plan_memory(g, s, "naive"), CPU, None,
                        hoist_kinds(False)) is None  # no Tree-LSTM batch


def test_short_rows_are_the_plans_children() -> None:
    graph, schedule, plan = _case("naive", "depth")
    program = tree_program(graph, schedule, plan, CPU, None, hoist_kinds(True))
    assert program is not None
    _, bptr, _nodes, _ = schedule.flat()
    for b, step in enumerate(program.short):
        if step is None:
            continue
        order = plan.row_order[b]
        kids = graph.operand_ids[graph.operand_ptr[order][:, None] + np.arange(2)]
        np.testing.assert_array_equal(step.left, plan.node_row[kids[:, 0]])
        np.testing.assert_array_equal(step.right, plan.node_row[kids[:, 1]])
        assert step.n == len(order) == bptr[b + 1] - bptr[b]
