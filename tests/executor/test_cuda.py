"""The executor on CUDA: equal to the CPU, both training paths, CUDA-graph capture and replay,
pinned index copies, the user API. Every test is marked ``gpu`` and skipped without a GPU."""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.executor import init_params, reference_loss
from edbatch.executor._reads import to_device
from edbatch.executor.kernels import fast_tanh
from edbatch.executor.torch_executor import TorchExecutor, execute
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.memory import STRATEGIES, MemoryPlan, Strategy, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import REAL_CASES, REAL_WORKLOADS, WORKLOADS, Workload, make_workload

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = "cuda"
ATOL = RTOL = 1e-4  # TF32 is off by default for matmuls; fp32 sums still reorder on the GPU
#: The workloads whose cell kinds all have hand-written backwards.
HAND = tuple(n for n in REAL_WORKLOADS if WORKLOADS[n].hand_backward)


def small(name: str, granularity: str = "cell") -> Workload:
    return make_workload(name, granularity=granularity,
                         **WORKLOADS[name].test_kwargs(dim=8, hidden=7))


@functools.cache
def setup(name: str, granularity: str, strategy: Strategy, count: int = 4,
          scheduler: str = "dynet_agenda") -> tuple[Workload, Graph, Schedule, MemoryPlan]:
    wl = small(name, granularity)
    graph = wl.minibatch(wl.default_eval_split, range(count))
    schedule = make_scheduler(scheduler)(graph)
    return wl, graph, schedule, plan_memory(graph, schedule, strategy)


def cuda_params(wl: Workload, seed: int = 0) -> dict[str, Tensor]:
    return dict(init_params(wl, torch.Generator().manual_seed(seed), device=CUDA))


def shuffled_attrs(graph: Graph, seed: int) -> Graph:
    """The same structure with other attrs: each op type's attrs permuted among its nodes
    of the same arity (token ids stay valid token ids, child positions valid positions, a
    variadic node's operand count its own)."""
    rng = np.random.default_rng(seed)
    attrs = graph.attrs.copy()
    arity = np.diff(graph.operand_ptr)
    for op, n in {(int(o), int(a)) for o, a in zip(graph.op_ids, arity, strict=True)}:
        nodes = np.flatnonzero((graph.op_ids == op) & (arity == n))
        attrs[nodes] = attrs[rng.permutation(nodes)]
    attrs.setflags(write=False)
    return dataclasses.replace(graph, attrs=attrs)


def grads_of(result_loss: Tensor | None, params: dict[str, Tensor]) -> dict[str, Tensor]:
    assert result_loss is not None
    grads = torch.autograd.grad(result_loss, list(params.values()), allow_unused=True)
    return {k: (torch.zeros_like(p) if g is None else g.to_dense())
            for (k, p), g in zip(params.items(), grads, strict=True)}


# ------------------------------------------------------------------ CUDA == CPU
def test_index_tensors_come_through_pinned_memory_without_blocking() -> None:
    rows = np.array([4, 0, 2], dtype=np.int64)
    idx = to_device(rows, torch.device(CUDA))
    assert idx.device.type == "cuda" and idx.dtype == torch.int64
    assert idx.cpu().tolist() == [4, 0, 2]
    rows[0] = 9  # the device copy owns its data
    torch.cuda.synchronize()
    assert idx.cpu().tolist() == [4, 0, 2]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("name", "granularity"), REAL_CASES)
def test_cuda_losses_and_gradients_equal_cpu_reference(name: str, granularity: str,
                                                       strategy: Strategy) -> None:
    wl, graph, schedule, plan = setup(name, granularity, strategy)
    cpu = dict(init_params(wl, torch.Generator().manual_seed(0)))
    ref_loss = reference_loss(graph, cpu)
    ref_grads = grads_of(ref_loss, cpu)
    params = {k: p.to(CUDA) for k, p in cpu.items()}
    ex = TorchExecutor(CUDA)
    inferred = ex.run(graph, schedule, plan, params)
    assert inferred.loss is not None and inferred.loss.device.type == "cuda"
    assert inferred.seconds > 0 and inferred.stats["exec/cuda_graph"] == 0.0
    torch.testing.assert_close(inferred.loss.cpu(), ref_loss.detach(), atol=ATOL, rtol=RTOL)
    trained = ex.run(graph, schedule, plan, params, grad=True)
    for k, g in grads_of(trained.loss, params).items():
        torch.testing.assert_close(g.cpu(), ref_grads[k], atol=ATOL, rtol=RTOL,
                                   msg=f"gradient of {k} differs")


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", HAND)
def test_hand_written_backwards_equal_autograd_on_cuda(name: str, sparse: bool) -> None:
    wl, graph, schedule, plan = setup(name, "cell", "planned", count=6)
    params = {k: p.to(torch.float64) for k, p in cuda_params(wl).items()}
    hand = TorchExecutor(CUDA, torch.float64, sparse_grads=sparse)
    auto = TorchExecutor(CUDA, torch.float64, hand_backward=False)
    got = grads_of(hand.run(graph, schedule, plan, params, grad=True).loss, params)
    want = grads_of(auto.run(graph, schedule, plan, params, grad=True).loss, params)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-10, rtol=1e-8, msg=k)


def test_execute_moves_cpu_parameters_to_the_device() -> None:
    wl, graph, _, _ = setup("tree_lstm", "cell", "planned")
    cpu = dict(init_params(wl, torch.Generator().manual_seed(0)))
    result = execute(graph, params=cpu, device=CUDA)
    assert result.loss is not None and result.loss.device.type == "cuda"
    torch.testing.assert_close(result.loss.cpu(), reference_loss(graph, cpu), atol=ATOL,
                               rtol=RTOL)


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", REAL_WORKLOADS)
def test_cuda_graph_replays_equal_eager_runs_for_every_graph_of_the_shape(
        name: str, strategy: Strategy) -> None:
    wl, graph, schedule, plan = setup(name, "cell", strategy)
    other = shuffled_attrs(graph, seed=1)
    assert other.structure_key() == graph.structure_key()
    assert not np.array_equal(other.attrs, graph.attrs)
    params = cuda_params(wl)
    eager = TorchExecutor(CUDA, hoist=False)  # as captured runs: the same gathers
    graphed = TorchExecutor(CUDA, cuda_graphs=True)
    assert graphed.graphs is not None
    runs = [graphed.run(g, schedule, plan, params) for g in (graph, graph, other, graph)]
    # first sight: eager; second: eager, then captured; later graphs of the shape: replays
    assert [r.stats["exec/cuda_graph"] for r in runs] == [0.0, 0.0, 1.0, 1.0]
    assert runs[1].stats["exec/capture_seconds"] > 0
    for g, r in zip((graph, graph, other, graph), runs, strict=True):
        want = eager.run(g, schedule, plan, params)
        assert r.outputs.keys() == want.outputs.keys()
        for v, value in want.outputs.items():
            torch.testing.assert_close(r.outputs[v], value, atol=1e-6, rtol=1e-6)
        assert r.stats["exec/num_gathers"] == want.stats["exec/num_gathers"]
    (entry,) = graphed.graphs.captured.values()
    assert entry.replays == 2


def test_cuda_graph_sees_in_place_updates_and_recaptures_for_new_parameter_tensors() -> None:
    wl, graph, schedule, plan = setup("tree_lstm", "cell", "planned")
    params = cuda_params(wl)
    ex = TorchExecutor(CUDA, cuda_graphs=True, capture_after=0)
    first = ex.run(graph, schedule, plan, params)  # captured right after this run
    assert first.stats["exec/capture_seconds"] > 0
    with torch.no_grad():
        for p in params.values():
            p.mul_(0.5)  # an optimizer step: same tensors, new values
    replayed = ex.run(graph, schedule, plan, params)
    assert replayed.stats["exec/cuda_graph"] == 1.0
    torch.testing.assert_close(replayed.loss, TorchExecutor(CUDA).run(
        graph, schedule, plan, params).loss)
    assert not torch.allclose(replayed.loss, first.loss)
    fresh = {k: p.clone() * 2 for k, p in params.items()}  # other tensors: not replayed
    again = ex.run(graph, schedule, plan, fresh)
    assert again.stats["exec/cuda_graph"] == 0.0
    torch.testing.assert_close(again.loss, first.loss)
    assert ex.run(graph, schedule, plan, fresh).stats["exec/cuda_graph"] == 1.0


def test_cpu_parameters_and_sparse_gradient_training_are_never_captured() -> None:
    wl, graph, schedule, plan = setup("bilstm_tagger", "cell", "planned")
    cpu = dict(init_params(wl, torch.Generator().manual_seed(0)))
    ex = TorchExecutor(CUDA, cuda_graphs=True, capture_after=0, sparse_grads=True)
    for _ in range(3):  # parameters moved every run are new tensors: stays eager
        assert ex.run(graph, schedule, plan, cpu).stats["exec/cuda_graph"] == 0.0
    params = {k: p.requires_grad_() for k, p in cuda_params(wl).items()}
    for _ in range(3):
        trained = ex.run(graph, schedule, plan, params, grad=True)
        assert trained.stats["exec/cuda_graph"] == 0.0 and trained.loss is not None
        assert trained.loss.requires_grad
    assert ex.graphs is not None and not ex.graphs.captured


@pytest.mark.parametrize("name", REAL_WORKLOADS)
def test_captured_training_runs_equal_eager_losses_and_gradients(name: str) -> None:
    wl, graph, schedule, plan = setup(name, "cell", "planned")
    other = shuffled_attrs(graph, seed=2)
    params = {k: p.requires_grad_() for k, p in cuda_params(wl).items()}
    eager, graphed = TorchExecutor(CUDA), TorchExecutor(CUDA, cuda_graphs=True)
    for i, g in enumerate((graph, graph, other, graph, other)):
        got = graphed.run(g, schedule, plan, params, grad=True)
        assert got.stats["exec/cuda_graph"] == float(i >= 2), i
        assert got.loss is not None and got.loss.requires_grad
        loss = got.loss.detach().clone()
        got_grads = grads_of(got.loss, params)
        want = eager.run(g, schedule, plan, params, grad=True)
        torch.testing.assert_close(loss, want.loss.detach(), atol=1e-5, rtol=1e-5)
        for k, grad in grads_of(want.loss, params).items():
            torch.testing.assert_close(got_grads[k], grad, atol=1e-5, rtol=1e-5, msg=k)


def test_captured_training_accumulates_into_grad_like_eager_training() -> None:
    wl, graph, schedule, plan = setup("tree_lstm", "cell", "planned")
    other = shuffled_attrs(graph, seed=3)
    params = {k: p.requires_grad_() for k, p in cuda_params(wl).items()}
    graphed = TorchExecutor(CUDA, cuda_graphs=True, capture_after=0)
    graphed.run(graph, schedule, plan, params, grad=True)  # eager, then captured
    for g in (graph, other):  # two replays, .grad accumulated without zeroing
        result = graphed.run(g, schedule, plan, params, grad=True)
        assert result.stats["exec/cuda_graph"] == 1.0 and result.loss is not None
        result.loss.backward()
    got = {k: p.grad.clone() for k, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    eager = TorchExecutor(CUDA)
    for g in (graph, other):
        loss = eager.run(g, schedule, plan, params, grad=True).loss
        assert loss is not None
        loss.backward()
    for k, p in params.items():
        if p.grad is not None:
            torch.testing.assert_close(got[k], p.grad, atol=1e-5, rtol=1e-5, msg=k)


def test_a_kernel_that_cannot_be_captured_runs_eagerly_with_a_warning() -> None:
    vocab = Vocab([OpType("x", "lookup", (), (3,), ("emb",)),
                   OpType("f", "host_sync", ((3,),), (3,))])
    b = GraphBuilder(vocab)
    graph = b.build([b.add("f", b.add("x", attr=i)) for i in range(4)])
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "planned")

    def host_sync(op: OpType, inputs: list[Tensor], params: object, attrs: Tensor) -> Tensor:
        scale = float(inputs[0].abs().sum().item())  # a host synchronisation
        return inputs[0] / (1.0 + scale)

    params = {"emb": torch.randn(5, 3, device=CUDA)}
    ex = TorchExecutor(CUDA, kernels={"host_sync": host_sync}, cuda_graphs=True,
                       capture_after=0)
    with pytest.warns(RuntimeWarning, match="CUDA-graph capture failed"):
        first = ex.run(graph, schedule, plan, params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = ex.run(graph, schedule, plan, params)  # not tried again
    assert second.stats["exec/cuda_graph"] == 0.0
    for v, value in first.outputs.items():
        torch.testing.assert_close(second.outputs[v], value)


# ------------------------------------------------------------------ the user API
def test_user_api_cells_run_batched_on_cuda_equal_plain_pytorch() -> None:
    from edbatch.api import DynamicBatch
    from tests.test_api import DIM, TREES, _grads, _modules, _plain_loss, _record

    mods = _modules()
    plain, _ = _plain_loss(TREES, *mods)
    plain.backward()
    want = _grads(mods)
    dev = tuple(copy.deepcopy(m).to(CUDA) for m in mods)
    for m in dev:
        m.zero_grad()
    batch = DynamicBatch(device=CUDA)
    comp = batch.cell(dev[1], "compose", [DIM, DIM], DIM)
    cls = batch.cell(dev[2], "loss", [DIM], (), takes_attr=True)
    roots = _record(batch, TREES, dev[0], comp, cls)
    out = batch.run("typewise_greedy", outputs=roots)
    assert out.loss is not None and out.loss.device.type == "cuda"
    out.loss.backward()
    torch.testing.assert_close(out.loss.cpu(), plain.detach(), atol=ATOL, rtol=RTOL)
    for got, exp in zip(_grads(dev), want, strict=True):
        torch.testing.assert_close(got.cpu(), exp, atol=ATOL, rtol=RTOL)


def test_cuda_without_an_index_means_the_current_device_and_parameters_stay_put() -> None:
    ex = TorchExecutor(CUDA)
    assert ex.device == torch.device("cuda", torch.cuda.current_device())
    params = {"w": torch.zeros(2, device=CUDA)}
    assert ex._on_device(params) is params  # no per-run copy of parameters on the device


def test_fast_tanh_is_torch_tanh_on_cuda() -> None:
    x = torch.linspace(-20, 20, 10_001, device="cuda")
    assert torch.equal(fast_tanh(x), torch.tanh(x))  # the sigmoid form is for the CPU only
