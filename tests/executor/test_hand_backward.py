"""Hand-written backwards (``edbatch.executor._analytic``): which programs use them, and their
gradients against autograd (fp64), gradcheck, sparse embedding gradients."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.executor import init_params, reference_loss
from edbatch.executor._analytic import analytic
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import STRATEGIES, MemoryPlan, Strategy, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import REAL_CASES, REAL_WORKLOADS, WORKLOADS, Workload, make_workload
from tests.conftest import assert_gradcheck

#: The workloads whose cell kinds all have hand-written backwards.
HAND = tuple(n for n in REAL_WORKLOADS if WORKLOADS[n].hand_backward)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def small(name: str, granularity: str = "cell", dim: int = 6, short: bool = False, **kw: int
          ) -> Workload:
    return make_workload(name, granularity=granularity, **{
        **WORKLOADS[name].test_kwargs(dim=dim, hidden=dim - 1, short=short), **kw})


def setup(wl: Workload, count: int = 4, strategy: Strategy = "planned",
          scheduler: str = "critical_path") -> tuple[Graph, Schedule, MemoryPlan]:
    graph = wl.minibatch(wl.default_eval_split, range(count))
    schedule = make_scheduler(scheduler)(graph)
    return graph, schedule, plan_memory(graph, schedule, strategy)


def small_covering_pair(wl: Workload, pool: int = 12) -> Graph:
    """A mini-batch of two of the first ``pool`` eval instances, as few nodes as found, whose
    op types include every type of the first two instances' mini-batch (gradcheck runs the
    graph twice per parameter entry: the smallest pair that reads the same cells)."""
    split = wl.default_eval_split
    want = set(np.flatnonzero(wl.minibatch(split, range(2)).type_counts))
    sizes = {i: wl.minibatch(split, [i]).num_nodes
             for i in range(min(pool, len(wl.load(split))))}
    for pair in sorted(itertools.combinations(sizes, 2), key=lambda p: sizes[p[0]] + sizes[p[1]]):
        graph = wl.minibatch(split, list(pair))
        if want <= set(np.flatnonzero(graph.type_counts)):
            return graph
    raise AssertionError("no pair covers the first two instances' op types")  # (0, 1) does


def gradients(wl: Workload, graph: Graph, schedule: Schedule, plan: MemoryPlan,
              executor: TorchExecutor, dtype: torch.dtype = torch.float64
              ) -> tuple[Tensor, dict[str, Tensor]]:
    params = {k: p.requires_grad_() for k, p in
              init_params(wl, torch.Generator().manual_seed(3), dtype=dtype).items()}
    result = executor.run(graph, schedule, plan, params, grad=True)
    assert result.loss is not None
    grads = torch.autograd.grad(result.loss, list(params.values()), allow_unused=True)
    return result.loss.detach(), {k: g for k, g in zip(params, grads, strict=True)
                                  if g is not None}


@pytest.mark.parametrize(("name", "granularity"), REAL_CASES)
def test_which_programs_run_hand_written_backwards(name: str, granularity: str) -> None:
    graph, schedule, plan = setup(small(name, granularity), count=2)
    program, _ = TorchExecutor()._program(graph, schedule, plan)
    # the LSTM-family cell programs: every kernel has a backward; primitive graphs (slices,
    # affines, ...) and the GRU / MV-RNN cells fall back to per-batch autograd
    assert analytic(program) == (name in HAND and granularity == "cell")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", HAND)
def test_hand_backward_equals_autograd_in_fp64(name: str, strategy: Strategy) -> None:
    wl = small(name)
    graph, schedule, plan = setup(wl, strategy=strategy)
    hand_loss, hand = gradients(wl, graph, schedule, plan, TorchExecutor(dtype=torch.float64))
    auto_loss, auto = gradients(wl, graph, schedule, plan,
                                TorchExecutor(dtype=torch.float64, hand_backward=False))
    # the same kernels compute the values (compiled bodies, e.g. module_net's attention
    # segments, sum in another order: rounding level)
    torch.testing.assert_close(hand_loss, auto_loss, rtol=1e-13, atol=0)
    # every parameter of an op type the graph uses gets a gradient, from both sides
    used = {p for k in np.flatnonzero(graph.type_counts) for p in graph.vocab[k].params}
    assert hand.keys() == auto.keys() == used
    for k in hand:
        torch.testing.assert_close(hand[k], auto[k], rtol=1e-10, atol=1e-12,
                                   msg=f"gradient of {k} differs")


@pytest.mark.parametrize("name", HAND)
def test_gradcheck_through_hand_backward(name: str) -> None:
    small_vocab = ({"vocab_size": 12} if "vocab_size" in
                   inspect.signature(WORKLOADS[name]).parameters else {})
    wl = small(name, dim=3, short=True, **small_vocab)  # short: gradcheck runs twice per entry
    graph = small_covering_pair(wl)
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "planned")
    assert_gradcheck(graph, schedule, plan,
                     init_params(wl, torch.Generator().manual_seed(1), dtype=torch.float64))


@pytest.mark.parametrize("name", HAND)  # the autograd cells give dense gradients
def test_sparse_embedding_gradients_equal_dense_ones(name: str) -> None:
    wl = small(name)
    graph, schedule, plan = setup(wl)
    _, dense = gradients(wl, graph, schedule, plan, TorchExecutor(dtype=torch.float64))
    loss, sparse = gradients(wl, graph, schedule, plan,
                             TorchExecutor(dtype=torch.float64, sparse_grads=True))
    tables = [k for k, g in sparse.items() if g.is_sparse]
    assert tables  # every model here has an embedding table
    for k in dense:
        torch.testing.assert_close(sparse[k].to_dense(), dense[k], rtol=1e-12, atol=1e-12)
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    touched = sparse[tables[0]].coalesce().indices()[0]
    assert 0 < len(touched) < params[tables[0]].shape[0]  # only the rows read
    torch.testing.assert_close(loss, reference_loss(graph, params))
    for k in tables:  # a plain SGD step takes the sparse gradient
        p = params[k].clone()
        p.add_(sparse[k], alpha=-0.1)
        torch.testing.assert_close(p, params[k] - 0.1 * dense[k])


def test_hand_backward_runs_twice_on_one_graph() -> None:
    wl = small("lattice_lstm")
    graph, schedule, plan = setup(wl)
    params = {k: p.requires_grad_() for k, p in init_params(wl).items()}
    result = TorchExecutor().run(graph, schedule, plan, params, grad=True)
    assert result.loss is not None
    first = torch.autograd.grad(result.loss, list(params.values()), retain_graph=True)
    second = torch.autograd.grad(result.loss, list(params.values()))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
