"""Batched executor == node-by-node reference: losses, gradients, gradcheck, errors."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError, ScheduleError
from edbatch.executor import init_params, reference_loss, run_reference
from edbatch.executor.cells_hoist import HOISTS
from edbatch.executor.torch_executor import RunResult, TorchExecutor, execute
from edbatch.graph import Graph, OpType
from edbatch.memory import STRATEGIES, Strategy, plan_memory
from edbatch.schedule import HEURISTICS, Schedule, depth_schedule, make_scheduler
from edbatch.workloads import REAL_CASES, REAL_WORKLOADS, WORKLOADS, Workload, make_workload
from tests.conftest import assert_gradcheck, recurrent_chains

GRANULARITIES = ("cell", "primitive")
DEFAULT_SCHEDULERS = ("depth", "dynet_agenda", "typewise_greedy", "critical_path")
OTHER_SCHEDULERS = tuple(s for s in HEURISTICS if s not in DEFAULT_SCHEDULERS)
ATOL = RTOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def small_workload(name: str, granularity: str) -> Workload:
    return make_workload(name, granularity=granularity, **WORKLOADS[name].test_kwargs())


@functools.cache
def case(name: str, granularity: str, device: str = "cpu"
         ) -> tuple[Graph, dict[str, Tensor], Tensor, list[Tensor]]:
    """3-instance mini-batch, fp32 parameters, reference loss and gradients."""
    wl = small_workload(name, granularity)
    graph = wl.minibatch(wl.default_eval_split, range(3))
    params: dict[str, Tensor] = dict(init_params(wl, torch.Generator().manual_seed(0),
                                                 device=device))
    loss = reference_loss(graph, params)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return graph, params, loss.detach(), [zero_if_none(g, p) for g, p in
                                          zip(grads, params.values(), strict=True)]


def zero_if_none(grad: Tensor | None, param: Tensor) -> Tensor:
    return torch.zeros_like(param) if grad is None else grad


def check_equivalence(name: str, granularity: str, scheduler: str, strategy: Strategy,
                      device: str = "cpu", hoist: bool | None = None) -> None:
    graph, params, ref_loss, ref_grads = case(name, granularity, device)
    schedule = make_scheduler(scheduler)(graph)
    plan = plan_memory(graph, schedule, strategy)
    executor = TorchExecutor(device, hoist=hoist)
    result = executor.run(graph, schedule, plan, params)
    assert result.loss is not None and not result.loss.requires_grad
    torch.testing.assert_close(result.loss, ref_loss, atol=ATOL, rtol=RTOL)
    # one kernel call per batch, plus the hoisted input projections (the default): some
    # exactly when a batch is of an LSTM cell kind with a hoisted form
    projections = int(result.stats["exec/hoisted_projections"])
    hoistable = any(graph.vocab[b.op_id].kind in HOISTS for b in schedule.batches)
    assert (projections > 0) == (hoist is not False and hoistable)
    program, _ = executor._program(graph, schedule, plan)  # a kernel running several batches
    merged = sum(len(s.kernel.steps) - 1 for s in program.steps  # (the module network's
                 if hasattr(s.kernel, "steps"))  # attention segments) names them
    assert result.num_kernel_calls == schedule.num_batches + projections - merged
    trained = executor.run(graph, schedule, plan, params, grad=True)
    assert trained.loss is not None
    torch.testing.assert_close(trained.loss.detach(), ref_loss, atol=ATOL, rtol=RTOL)
    grads = torch.autograd.grad(trained.loss, list(params.values()), allow_unused=True)
    for (pname, p), g, ref in zip(params.items(), grads, ref_grads, strict=True):
        torch.testing.assert_close(zero_if_none(g, p), ref, atol=ATOL, rtol=RTOL,
                                   msg=f"gradient of {pname} differs")


def _rotated(slow: bool) -> list[tuple[str, str, str, Strategy]]:
    """Every real case x default scheduler x memory strategy, split in two: the default run
    takes, for the i-th case, scheduler j with strategy (i + j) mod 3, so each case runs
    every default scheduler and every strategy, and each (scheduler, strategy) pair runs on
    7-8 cases; the slow run takes the other two thirds of the full product."""
    out = []
    for i, (name, granularity) in enumerate(REAL_CASES):
        for j, scheduler in enumerate(DEFAULT_SCHEDULERS):
            for k, strategy in enumerate(STRATEGIES):
                if (k == (i + j) % len(STRATEGIES)) != slow:
                    out.append((name, granularity, scheduler, strategy))
    return out


@pytest.mark.parametrize(("name", "granularity", "scheduler", "strategy"), _rotated(False))
def test_batched_equals_reference(name: str, granularity: str, scheduler: str,
                                  strategy: Strategy) -> None:
    check_equivalence(name, granularity, scheduler, strategy)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "granularity", "scheduler", "strategy"), _rotated(True))
def test_batched_equals_reference_rest_of_the_product(name: str, granularity: str,
                                                      scheduler: str, strategy: Strategy
                                                      ) -> None:
    check_equivalence(name, granularity, scheduler, strategy)


@pytest.mark.parametrize("scheduler", DEFAULT_SCHEDULERS)
@pytest.mark.parametrize("name", REAL_WORKLOADS)
def test_unhoisted_batched_equals_reference(name: str, scheduler: str) -> None:
    """``hoist=False`` (the per-batch cells; for the workloads whose default is hoisted,
    the other path) equals the reference."""
    check_equivalence(name, "cell", scheduler, "planned", hoist=False)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("scheduler", OTHER_SCHEDULERS)
@pytest.mark.parametrize(("name", "granularity"), REAL_CASES)
def test_batched_equals_reference_other_heuristics(name: str, granularity: str,
                                                   scheduler: str, strategy: Strategy
                                                   ) -> None:
    check_equivalence(name, granularity, scheduler, strategy)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", REAL_WORKLOADS)
def test_batched_equals_reference_on_cuda(name: str, strategy: Strategy) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for granularity in WORKLOADS[name].granularities:
        check_equivalence(name, granularity, "typewise_greedy", strategy, device="cuda")


# ------------------------------------------------------------------ gradcheck (fp64)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_gradcheck_through_batched_executor(granularity: str, strategy: Strategy) -> None:
    wl = make_workload("tree_lstm", granularity=granularity, embed_dim=3, hidden_dim=3,
                       vocab_size=12)
    trees = wl.load("dev")
    small = sorted(range(len(trees)), key=lambda i: trees[i].num_nodes)[:2]
    graph = wl.minibatch("dev", small)
    schedule = make_scheduler("typewise_greedy")(graph)
    plan = plan_memory(graph, schedule, strategy)
    assert_gradcheck(graph, schedule, plan,
                     init_params(wl, torch.Generator().manual_seed(1), dtype=torch.float64))


# ------------------------------------------------------------------ results and stats
def test_run_result_outputs_and_stats() -> None:
    graph, params, _, _ = case("tree_gru", "cell")
    schedule = make_scheduler("typewise_greedy")(graph)
    plan = plan_memory(graph, schedule, "planned")
    reference = run_reference(graph, params)
    for grad in (False, True):
        result = TorchExecutor().run(graph, schedule, plan, params, grad=grad)
        assert isinstance(result, RunResult)
        assert set(result.outputs) == set(graph.outputs.tolist()) == set(reference)
        for v, value in result.outputs.items():
            assert value.shape == reference[v].shape == (1, 1)
        assert result.loss is not None and result.loss.shape == ()
        assert result.seconds > 0
        stats = result.stats
        reads = sum(len(s) for s in plan.operands)
        assert stats["exec/num_views"] + stats["exec/num_gathers"] <= reads
        assert stats["exec/num_kernel_calls"] == schedule.num_batches
        if not grad:  # reads as planned; a variadic node's reads are merged into one
            variadic = sum(1 for b in schedule.batches if graph.vocab[b.op_id].arity is None)
            assert stats["exec/num_gathers"] <= plan.stats()["memory/gather_kernels"] + variadic


def test_training_reads_count_views_inside_one_batch() -> None:
    graph = chain_graph([4, 3, 2])
    schedule = depth_schedule(graph)
    plan = plan_memory(graph, schedule, "planned")
    result = TorchExecutor(kernels=TINY_KERNELS).run(graph, schedule, plan, tiny_params(),
                                                     grad=True)
    views, gathers = result.stats["exec/num_views"], result.stats["exec/num_gathers"]
    assert views > 0 and views + gathers >= 1


def test_execute_convenience_matches_reference() -> None:
    graph, params, ref_loss, _ = case("lattice_gru", "cell")
    for strategy in STRATEGIES:
        result = execute(graph, params=params, strategy=strategy)
        assert result.loss is not None
        torch.testing.assert_close(result.loss, ref_loss, atol=ATOL, rtol=RTOL)
        assert "memory/zero_copy_fraction" in result.stats


def test_program_cache_reuses_compilation() -> None:
    graph, params, _, _ = case("tree_lstm", "cell")
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "planned")
    executor = TorchExecutor()
    first = executor.run(graph, schedule, plan, params)
    second = executor.run(graph, schedule, plan, params)
    assert first.stats["exec/compile_seconds"] > 0 == second.stats["exec/compile_seconds"]
    torch.testing.assert_close(first.loss, second.loss, atol=0, rtol=0)


def test_plan_of_another_schedule_is_rejected() -> None:
    graph, params, _, _ = case("tree_lstm", "cell")
    plan = plan_memory(graph, make_scheduler("depth")(graph), "naive")
    with pytest.raises(ScheduleError, match="batches"):
        TorchExecutor().run(graph, make_scheduler("typewise_greedy")(graph), plan, params)


def test_schedule_and_plan_of_another_graph_are_rejected() -> None:
    """(Were a raw ``IndexError`` from the program's node arrays.)"""
    wl = make_workload("tree_lstm", **WORKLOADS["tree_lstm"].test_kwargs())
    trees = wl.load("dev")
    small, big = wl.build_graph(trees[:2]), wl.build_graph(trees[2:6])
    params = init_params(wl, torch.Generator().manual_seed(0))
    schedule = make_scheduler("depth")(big)
    with pytest.raises(ScheduleError, match=rf"the plan places {big.num_nodes} nodes but the "
                                            rf"graph has {small.num_nodes}: the schedule and "
                                            r"plan of another graph"):
        TorchExecutor().run(small, schedule, plan_memory(big, schedule), params)
    for strategy in STRATEGIES:
        with pytest.raises(ScheduleError, match=rf"the schedule runs {big.num_nodes} nodes but "
                                                rf"the graph has {small.num_nodes}: it is "
                                                r"another graph's"):
            plan_memory(small, schedule, strategy)


# ------------------------------------------------------------------ a private tiny kernel set
H = 2


def tiny_lookup(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    return params["E"].index_select(0, attrs)


def tiny_cell(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor) -> Tensor:
    return torch.tanh(torch.cat(list(inputs), 1) @ params["W"].T)


def tiny_zero(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor) -> Tensor:
    return params["E"].new_zeros((len(attrs), H))


def tiny_sum(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
             attrs: Tensor) -> Tensor:
    return torch.cat(list(inputs), 1).sum(1, keepdim=True)


def tiny_square(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    return (inputs[0] ** 2).sum(1, keepdim=True)


TINY_KERNELS = {"lookup": tiny_lookup, "cell": tiny_cell, "zero": tiny_zero,
                "sum": tiny_sum, "square": tiny_square}


def tiny_params() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"E": torch.randn(8, H, generator=g, requires_grad=True),
            "W": torch.randn(H, 2 * H, generator=g, requires_grad=True)}


def chain_graph(lengths: list[int]) -> Graph:
    return recurrent_chains(lengths, "square")


def tiny_reference(graph: Graph, params: Mapping[str, Tensor]) -> Tensor:
    values: dict[int, Tensor] = {}
    for v in range(graph.num_nodes):
        op = graph.vocab[int(graph.op_ids[v])]
        inputs = [values[int(u)] for u in graph.operands(v)]
        values[v] = TINY_KERNELS[op.kind](op, inputs, params, graph_attrs(graph, [v]))
    return values[int(graph.outputs[0])].reshape(())


def graph_attrs(graph: Graph, nodes: list[int]) -> Tensor:
    return torch.from_numpy(graph.attrs[nodes].copy())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_private_kernel_set(strategy: Strategy) -> None:
    graph = chain_graph([3, 1, 2])
    params = tiny_params()
    ref = tiny_reference(graph, params)
    schedule = make_scheduler("ed_batch_agenda")(graph)
    plan = plan_memory(graph, schedule, strategy)
    executor = TorchExecutor(kernels=TINY_KERNELS)
    for grad in (False, True):
        result = executor.run(graph, schedule, plan, params, grad=grad)
        assert result.loss is not None
        torch.testing.assert_close(result.loss.detach(), ref.detach())
    ref_grads = torch.autograd.grad(ref, list(params.values()))
    assert result.loss is not None
    grads = torch.autograd.grad(result.loss, list(params.values()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


# ------------------------------------------------------------------ errors
def failing(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
            attrs: Tensor) -> Tensor:
    raise RuntimeError("boom")


def wrong_shape(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    return torch.zeros(len(attrs), 7)


@pytest.mark.parametrize("grad", [False, True])
def test_kernel_errors_name_the_batch(grad: bool) -> None:
    graph = chain_graph([2, 2])
    schedule: Schedule = depth_schedule(graph)
    plan = plan_memory(graph, schedule, "planned")
    cell_batch = next(i for i, b in enumerate(schedule.batches) if b.op_id == 2)
    executor = TorchExecutor(kernels={**TINY_KERNELS, "cell": failing})
    with pytest.raises(ExecutionError, match=rf"batch {cell_batch} .*'cell'.*2 nodes.*boom"
                       ) as info:
        executor.run(graph, schedule, plan, tiny_params(), grad=grad)
    assert isinstance(info.value.__cause__, RuntimeError)
    executor = TorchExecutor(kernels={**TINY_KERNELS, "cell": wrong_shape})
    with pytest.raises(ExecutionError, match=r"returned shape \(2, 7\), expected \(2, 2\)"):
        executor.run(graph, schedule, plan, tiny_params(), grad=grad)
