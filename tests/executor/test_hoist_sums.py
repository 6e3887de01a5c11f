"""A hoisted program's sum batches are deferred (``edbatch.executor._hoist_sums``): their
rows come from the plan's operands, not from compiled reads, and equal what the eager path
makes (``compile_program`` compiling every sum's reads, ``sum_short`` making its short step
from them): same chain rows, and once built the same steps, short steps and read counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from edbatch.executor import _fast_sum
from edbatch.executor._fast_chain import step_row
from edbatch.executor._fast_sum import FastSumStep, _sum_step, row_sum_step, sum_row, sum_short
from edbatch.executor._hoist import compile_hoisted, hoist_kinds, hoist_program, hoisted_batches
from edbatch.executor._hoist_sums import deferred_sums
from edbatch.executor._program import LazySteps, compile_program
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import assert_same_steps

CPU = torch.device("cpu")


def _case(scheduler: str, strategy: str) -> tuple[Any, Any, Any]:
    wl = make_workload("lattice_lstm", granularity="cell",
                       **WORKLOADS["lattice_lstm"].test_kwargs(dim=6, hidden=5, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(8))
    schedule = make_scheduler(scheduler)(graph)
    return graph, schedule, plan_memory(graph, schedule, strategy)


def _eager(graph: Any, schedule: Any, plan: Any) -> Any:
    """The path before: every sum's reads compiled, its short step made from them."""
    kinds = hoist_kinds(True)
    by_type = hoisted_batches(graph, schedule, plan, kinds)
    program = compile_program(graph, schedule, plan, CPU, None,
                              [b for v in by_type.values() for b in v])
    program = hoist_program(program, graph, schedule, plan, CPU, kinds, None, by_type)
    list(program.steps), list(program.short)  # every entry built
    return sum_short(program, CPU)


def _short_key(f: Any) -> Any:
    if type(f) is FastSumStep:
        return ("sum", f.arenas, f.which.tolist(), f.idx.tolist(), f.oa, f.os, f.n, f.name)
    return (type(f).__name__,) if f is None or type(f).__name__ != "FastStep" else \
        ("fast", step_row(f)[:3], step_row(f)[4:])


@pytest.mark.parametrize(("scheduler", "strategy"),
                         [("critical_path", "naive"), ("depth", "planned"),
                          ("dynet_agenda", "naive")])
def test_plan_rows_equal_the_rows_of_the_compiled_reads(scheduler: str, strategy: str) -> None:
    graph, schedule, plan = _case(scheduler, strategy)
    rows = deferred_sums(graph, schedule, plan, CPU, None)
    eager = compile_program(graph, schedule, plan, CPU, None)
    want = {}
    for b, step in enumerate(eager.steps):
        if step.op.kind == _fast_sum.KIND and step.op.arity is not None:
            fast = _sum_step(step, plan.arenas)
            if fast is not None:
                want[b] = sum_row(fast)
    assert want and rows.keys() == want.keys()
    for b, row in rows.items():
        got, ref = row, want[b]
        assert (got[0], got[1], got[3], got[4], got[5], got[6]) == \
            (ref[0], ref[1], ref[3], ref[4], ref[5], ref[6])
        assert got[2].dtype == np.int64 and got[2].flags.c_contiguous
        assert np.array_equal(got[2], ref[2])
        assert _short_key(row_sum_step(row)) == _short_key(_sum_step(eager.steps[b],
                                                                     plan.arenas))


@pytest.mark.parametrize(("scheduler", "strategy"),
                         [("critical_path", "naive"), ("depth", "planned")])
def test_deferred_sums_build_the_eager_programs_entries(scheduler: str, strategy: str) -> None:
    graph, schedule, plan = _case(scheduler, strategy)
    lazy = compile_hoisted(graph, schedule, plan, CPU, None, hoist_kinds(True), None)
    assert isinstance(lazy.steps, LazySteps) and not lazy.steps.built
    sums = [i for i, row in lazy.deferred.items() if row[0] == 2]  # type: ignore[attr-defined]
    assert sums  # deferred: no step of theirs given
    given = dict(lazy.steps.given())  # type: ignore[attr-defined]
    assert not set(sums) & set(given)
    eager = _eager(graph, schedule, plan)
    assert lazy.counts == eager.counts
    assert_same_steps(lazy.steps, eager.steps)
    assert [_short_key(f) for f in lazy.short] == [_short_key(f) for f in eager.short]  # type: ignore[attr-defined]


def test_no_sum_is_deferred_off_the_cpu_or_with_a_users_sum_kernel() -> None:
    graph, schedule, plan = _case("critical_path", "naive")
    assert deferred_sums(graph, schedule, plan, torch.device("meta"), None) == {}
    own = {"sum": lambda *a, **k: None}
    assert deferred_sums(graph, schedule, plan, CPU, own) == {}  # type: ignore[arg-type]
