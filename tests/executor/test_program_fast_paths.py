"""Fast paths of program compilation against the plain ones: ``new_step`` builds the same
``Step`` as its ``__init__``; the attrs and gather indices split out of one tensor each
equal the plan's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from edbatch.executor._program import Step, new_step
from edbatch.executor._reads import RowsRead, SliceRead
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import Strategy, plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload

HIDDEN = 5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _graph(name: str, size: int = 40) -> Graph:
    wl = make_workload(name, embed_dim=6, hidden_dim=HIDDEN)
    return wl.minibatch(wl.default_eval_split, range(size))


def test_new_step_equals_step() -> None:
    args = ("op", "kernel", torch.arange(3), 3, 4, 1, 7, (SliceRead(0, 1, 4),), False, False,
            True)
    fast, plain = new_step(*args), Step(*args)  # type: ignore[arg-type]
    assert fast == plain and type(fast) is Step
    assert vars(fast) == vars(plain)
    assert [f.name for f in dataclasses.fields(Step)] == list(vars(fast))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.size = 2  # type: ignore[misc]


@pytest.mark.parametrize("strategy", ["naive", "planned", "aligned"])
@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_split_attrs_and_gathers_equal_the_plan(name: str, strategy: Strategy) -> None:
    graph = _graph(name, 12)
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)
    program, _ = TorchExecutor(hoist=False)._program(graph, schedule, plan)
    base = program.attrs.untyped_storage().data_ptr()
    gathers = 0
    for b, step in enumerate(program.steps):
        np.testing.assert_array_equal(step.attrs.numpy(), graph.attrs[plan.row_order[b]])
        assert step.attrs.untyped_storage().data_ptr() == base  # views of one tensor
        assert step.size == len(plan.row_order[b])
        for o, read in zip(plan.operands[b], step.reads, strict=False):
            if isinstance(read, RowsRead) and o.view is None and not step.split:
                np.testing.assert_array_equal(read.idx.numpy(), o.gather)
                gathers += 1
    assert gathers


@pytest.mark.parametrize("name", ["bilstm_tagger", "tree_lstm"])
def test_dropped_program_freed_without_the_cycle_collector(name: str) -> None:
    """A compiled program holds no reference cycle (its lazily compiled training reads refer
    to it weakly): dropped, it is freed by reference counting, not left for ``gc`` with its
    arenas' worth of steps; its training reads still fill in the outputs' local rows."""
    import gc
    import weakref

    graph = _graph(name, 12)
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    gc.collect()
    gc.disable()
    try:
        ex = TorchExecutor("cpu")
        program, _ = ex._program(graph, schedule, plan)
        refs = [weakref.ref(program), weakref.ref(program.steps[0])]
        base = getattr(program, "base", None) or program
        refs.append(weakref.ref(base))
        del ex, program, base
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()
    program = TorchExecutor("cpu")._program(graph, schedule, plan)[0]
    base = getattr(program, "base", None) or program
    assert all(r == -1 for *_, r in base.outputs)
    base.grad_steps()
    assert [r for *_, r in base.outputs] == [
        int(plan.node_row[v]) - plan.outputs[b].start
        for (v, *_), b in zip(base.outputs, base.output_batch, strict=True)]
