"""The executor's hoisted program is compiled without the per-batch reads of the hoisted
batches (``compile_program(skip=...)``) and equals the program compiled the old way (every
read compiled, then rewritten by ``hoist_program``): same steps, reads, short steps, chain
rows and read counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from edbatch.executor import init_params
from edbatch.executor._fast_chain import ChainStep
from edbatch.executor._fast_lstm import FastStep
from edbatch.executor._hoist import (
    HoistedProgram,
    _count,
    head_reads,
    hoist_program,
    hoisted_batches,
    unhoisted,
)
from edbatch.executor._program import LazySteps, Program, compile_program
from edbatch.executor.torch_executor import TorchExecutor, short_paths
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload
from tests.executor.conftest import assert_same_steps, read_key

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _old_path(graph: Any, schedule: Any, plan: Any, kinds: frozenset[str]) -> Program:
    """The program as built before the skip: every read compiled, then rewritten."""
    program = compile_program(graph, schedule, plan, CPU, None)
    program = hoist_program(program, graph, schedule, plan, CPU, kinds)
    return short_paths(head_reads(program), CPU)


def _short(f: Any) -> tuple[Any, ...]:
    if f is None:
        return (None,)
    if type(f) is FastStep:
        return ("fast", read_key(f.state), f.pa, f.lo, f.n, f.oa, f.os, f.weight, f.hidden)
    if type(f) is ChainStep:
        return ("chain", f.meta.tolist(), f.idx.tolist(), f.arenas, f.weights, f.rows,
                f.width, f.name, list(f.binders), f.count)
    return (type(f).__name__,)


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "seq2seq"])
def test_skipped_reads_program_equals_the_old_path(name: str, strategy: str) -> None:
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(6))
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, strategy)
    executor = TorchExecutor(dtype=torch.float64)
    new, _ = executor._program(graph, schedule, plan)
    old = _old_path(graph, schedule, plan, executor.hoist)
    assert isinstance(new, HoistedProgram) and isinstance(old, HoistedProgram)
    hoisted = [b for v in hoisted_batches(graph, schedule, plan, executor.hoist).values()
               for b in v]
    assert hoisted
    # the reads of the hoisted batches are not compiled (they would be thrown away) ...
    assert all(unhoisted(new).steps[b].reads == () for b in hoisted)
    assert all(unhoisted(old).steps[b].reads for b in hoisted)
    # ... and the rewritten program is the old one, step by step
    assert new.arenas == old.arenas
    assert_same_steps(new.steps, old.steps)
    assert [_short(f) for f in new.short] == [_short(f) for f in old.short]
    assert [_short(f) for f in new.chained] == [_short(f) for f in old.chained]
    assert any(type(f) is ChainStep for f in new.chained) or name != "bilstm_tagger"
    assert new.counts[False] == old.counts[False] == _count(new.steps)
    assert new.num_projections == old.num_projections
    np.testing.assert_array_equal(new.attr_nodes, old.attr_nodes)
    # the training reads (from the plan, not the inference reads) are the old ones too
    assert [[read_key(r) for r in s.reads] for s in new.grad_steps()] == \
        [[read_key(r) for r in s.reads] for s in old.grad_steps()]


_FIELDS = ("op", "kernel", "size", "width", "out_arena", "out_start", "split", "stacked",
           "writes_out")


@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "tree_lstm"])
def test_inference_run_makes_no_skipped_step(name: str) -> None:
    """The steps of the batches a rewrite takes (hoisted cells, deferred sums, Tree-LSTM
    internal batches) are deferred: an inference run on the short paths makes none; made
    later they are the steps ``compile_program`` makes without ``skip``, less their reads."""
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(6))
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    params = init_params(wl, torch.Generator().manual_seed(2), dtype=torch.float64)
    executor = TorchExecutor(dtype=torch.float64)
    program, _ = executor._program(graph, schedule, plan)
    # a hoisted program's base, or the Tree-LSTM program's own steps
    steps = unhoisted(program).steps if name != "tree_lstm" else program.steps
    assert isinstance(steps, LazySteps) and steps.later()
    later = steps.later()
    assert executor.run(graph, schedule, plan, params).outputs
    assert not steps.built
    eager = compile_program(graph, schedule, plan, CPU, None).steps
    made = list(steps)  # (made now)
    assert steps.built and len(made) == len(eager)
    for b in later:
        for f in _FIELDS:
            assert getattr(made[b], f) == getattr(eager[b], f), (b, f)
        assert torch.equal(made[b].attrs, eager[b].attrs)
        if name != "tree_lstm":  # (the Tree-LSTM program's own steps carry their reads)
            assert made[b].reads == ()
