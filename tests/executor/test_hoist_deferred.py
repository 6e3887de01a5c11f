"""A hoisted program defers its recurrent batches' ``Step`` and ``FastStep`` entries
(``LazySteps``) and builds its chains from their rows: a chained inference run builds none
of them, and the program equals the one built eagerly (the previous path: every entry made,
then chained from the ``FastStep``\\ s): same chains, steps and short steps, bit-identical
outputs in inference (chains on and off) and equal losses and gradients in training."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from edbatch.executor import _fast_chain, init_params
from edbatch.executor._fast_chain import ChainStep
from edbatch.executor._fast_lstm import FastStep
from edbatch.executor._head_reads import head_reads
from edbatch.executor._hoist import HoistedProgram, compile_hoisted
from edbatch.executor._program import LazySteps, Program
from edbatch.executor.torch_executor import TorchExecutor, short_paths
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload
from tests.executor.conftest import assert_same_steps, read_key

CPU = torch.device("cpu")
HOISTED = ("bilstm_tagger", "bilstm_char_tagger", "lattice_lstm", "transition_parser")


def _case(name: str, dtype: torch.dtype) -> tuple[Any, Any, Any, dict[str, torch.Tensor]]:
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(6))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "naive")
    return graph, schedule, plan, init_params(wl, torch.Generator().manual_seed(3),
                                              dtype=dtype)


def _eager(ex: TorchExecutor, graph: Any, schedule: Any, plan: Any) -> Program:
    """The program as the executor made it before: every entry built, then chained."""
    program = compile_hoisted(graph, schedule, plan, CPU, None, ex.hoist, None)
    assert isinstance(program, HoistedProgram)
    list(program.steps), list(program.short)  # built: chain_short chains the FastSteps
    return short_paths(head_reads(program), CPU)


def _run(ex: TorchExecutor, program: Program, graph: Any, schedule: Any, plan: Any,
         params: dict[str, torch.Tensor], grad: bool = False) -> Any:
    ex._cache[(id(graph), id(plan))] = (graph, plan, program)  # run this program
    return ex.run(graph, schedule, plan, params, grad=grad)


def _entry(f: Any) -> tuple[Any, ...]:
    if type(f) is FastStep:
        return ("fast", read_key(f.state), f.pa, f.lo, f.n, f.oa, f.os, f.weight, f.hidden,
                f.name)
    if type(f) is ChainStep:
        return ("chain", f.meta.tolist(), f.idx.tolist(), f.arenas, f.weights, f.rows,
                f.width, f.name, f.binders, f.count)
    return (type(f).__name__,)


@pytest.mark.skipif(not _fast_chain.AVAILABLE, reason="no chains: torch's ?gemm not bound")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", HOISTED)
def test_chained_inference_builds_no_deferred_entry_and_equals_the_eager_program(
        name: str, dtype: torch.dtype) -> None:
    graph, schedule, plan, params = _case(name, dtype)
    ex = TorchExecutor(dtype=dtype)
    lazy, _ = ex._program(graph, schedule, plan)
    assert isinstance(lazy, HoistedProgram) and lazy.deferred
    assert isinstance(lazy.steps, LazySteps) and isinstance(lazy.short, LazySteps)
    eager = _eager(TorchExecutor(dtype=dtype), graph, schedule, plan)
    assert [_entry(f) for f in lazy.chained] == [_entry(f) for f in eager.chained]
    got = ex.run(graph, schedule, plan, params).outputs
    assert not lazy.steps.built and not lazy.short.built  # the run read none of them
    want = _run(TorchExecutor(dtype=dtype), eager, graph, schedule, plan, params).outputs
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), f"output of node {k} differs"
    # built on demand: the same steps and short steps as the eager program's
    assert_same_steps(lazy.steps, eager.steps)
    assert [_entry(f) for f in lazy.short] == [_entry(f) for f in eager.short]
    assert lazy.counts == eager.counts


@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm"])
def test_runs_that_need_the_deferred_steps_build_them_and_equal_the_eager_program(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, schedule, plan, params = _case(name, torch.float64)
    eager = _eager(TorchExecutor(dtype=torch.float64), graph, schedule, plan)
    monkeypatch.setattr(_fast_chain, "ENABLED", [False])  # one short step per batch
    ex = TorchExecutor(dtype=torch.float64)
    lazy, _ = ex._program(graph, schedule, plan)
    got = ex.run(graph, schedule, plan, params).outputs
    assert lazy.short.built  # type: ignore[attr-defined]
    want = _run(TorchExecutor(dtype=torch.float64), eager, graph, schedule, plan,
                params).outputs
    for k in got:
        assert torch.equal(got[k], want[k])
    # training (hand-written backwards over the hoisted steps): same loss and gradients
    grads = []
    for program in (TorchExecutor(dtype=torch.float64)._program(graph, schedule, plan)[0],
                    _eager(TorchExecutor(dtype=torch.float64), graph, schedule, plan)):
        leaves = {k: p.detach().clone().requires_grad_(True) for k, p in params.items()}
        res = _run(TorchExecutor(dtype=torch.float64), program, graph, schedule, plan,
                   leaves, grad=True)
        assert res.loss is not None
        res.loss.backward()
        grads.append((res.loss.detach(), {k: p.grad for k, p in leaves.items()}))
        assert program.steps.built or not isinstance(program.steps, LazySteps)  # type: ignore[attr-defined]
    assert torch.equal(grads[0][0], grads[1][0])
    for k, g in grads[0][1].items():
        other = grads[1][1][k]
        assert (g is None) == (other is None)
        if g is not None:
            assert torch.equal(g, other), k


def test_lazy_steps_build_once_on_first_access_to_a_deferred_entry() -> None:
    calls = []

    def build() -> dict[int, str]:
        calls.append(1)
        return {1: "b", 3: "d"}

    steps = LazySteps(["a", None, "c", None], [1, 3], build)
    assert len(steps) == 4 and not steps.built
    assert list(steps.given()) == [(0, "a"), (2, "c")] and steps[2] == "c" and not calls
    headed = steps.replaced({0: "A"})
    with pytest.raises(ValueError, match="entry 1 is deferred"):
        steps.replaced({1: "x"})
    assert steps[1] == "b" and calls == [1] and steps.built
    assert list(steps) == ["a", "b", "c", "d"] and steps[1:3] == ("b", "c") and calls == [1]
    assert list(headed) == ["A", "b", "c", "d"] and calls == [1, 1]  # its own copy's build
