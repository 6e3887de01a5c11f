"""Input-projection hoisting (``edbatch.executor._hoist``): the rewritten program, values and
gradients equal to the unhoisted executor and the node-by-node reference (fp64, hand-written
backwards), fallbacks, and errors on misuse."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from edbatch.api import DynamicBatch, take_graph
from edbatch.errors import ConfigError, UnknownNameError
from edbatch.executor import init_params, reference_loss
from edbatch.executor._analytic import analytic
from edbatch.executor._hoist import HoistedProgram, hoist_kinds, unhoisted
from edbatch.executor.cells_hoist import HOISTS
from edbatch.executor.kernels import ParamGrads
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, Strategy, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import Workload, make_workload

WORKLOADS = ("bilstm_tagger", "lattice_lstm", "seq2seq")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def small(name: str) -> Workload:
    return make_workload(name, embed_dim=6, hidden_dim=5)


def setup(wl: Workload, count: int = 4, scheduler: str = "critical_path",
          strategy: Strategy = "planned") -> tuple[Graph, Schedule, MemoryPlan]:
    graph = wl.minibatch(wl.default_eval_split, range(count))
    schedule = make_scheduler(scheduler)(graph)
    return graph, schedule, plan_memory(graph, schedule, strategy)


def run(wl: Workload, graph: Graph, schedule: Schedule, plan: MemoryPlan,
        executor: TorchExecutor, *, grad: bool
        ) -> tuple[Tensor, dict[str, Tensor], dict[str, float]]:
    params = {k: p.requires_grad_(grad) for k, p in
              init_params(wl, torch.Generator().manual_seed(3), dtype=executor.dtype).items()}
    result = executor.run(graph, schedule, plan, params, grad=grad)
    assert result.loss is not None
    if not grad:
        return result.loss, {}, result.stats
    grads = torch.autograd.grad(result.loss, list(params.values()), allow_unused=True)
    return result.loss.detach(), {k: g for k, g in zip(params, grads, strict=True)
                                  if g is not None}, result.stats


def test_bilstm_program_projects_layer_one_in_one_step_per_type() -> None:
    graph, schedule, plan = setup(small("bilstm_tagger"), count=5)
    plain, _ = TorchExecutor(hoist=False)._program(graph, schedule, plan)
    program, _ = TorchExecutor(hoist=True)._program(graph, schedule, plan)
    assert isinstance(program, HoistedProgram)
    base = unhoisted(program)
    assert not isinstance(base, HoistedProgram) and unhoisted(base) is base
    assert [s.kernel for s in base.steps] == [s.kernel for s in plain.steps]
    projections = [s for s in program.steps if s.op.kind.endswith(".projection")]
    assert len(program.steps) == len(plain.steps) + len(projections)
    assert program.num_projections == len(projections)
    kinds = [s.op.kind for s in projections]
    # every layer-1 input (a word embedding) is ready before the first layer-1 batch
    assert kinds.count("bilstm.l1_fwd.projection") == 1
    assert kinds.count("bilstm.l1_bwd.projection") == 1
    nodes = {k: sum(1 for v in range(graph.num_nodes) if graph.vocab[graph.op_ids[v]].kind == k)
             for k in ("bilstm.l1_fwd", "bilstm.l2_bwd")}
    for kind, count in nodes.items():  # every node of the type projected exactly once
        assert sum(s.size for s in projections if s.op.kind == f"{kind}.projection") == count
    # each projection step runs before every batch that reads it
    seen: set[int] = set()
    for step in program.steps:
        if step.op.kind.endswith(".projection"):
            seen.add(step.out_arena)
        elif step.op.kind in HOISTS:
            assert step.reads[1].b in seen  # type: ignore[attr-defined]
    assert analytic(program)


@pytest.mark.parametrize("scheduler", ["critical_path", "depth", "dynet_agenda"])
@pytest.mark.parametrize("name", WORKLOADS)
def test_hoisted_values_and_gradients_equal_unhoisted_in_fp64(name: str, scheduler: str
                                                              ) -> None:
    wl = small(name)
    graph, schedule, plan = setup(wl, scheduler=scheduler)
    ref_loss = reference_loss(graph, init_params(wl, torch.Generator().manual_seed(3),
                                                 dtype=torch.float64))
    for grad in (False, True):
        base = run(wl, graph, schedule, plan, TorchExecutor(dtype=torch.float64, hoist=False),
                   grad=grad)
        hoisted = run(wl, graph, schedule, plan,
                      TorchExecutor(dtype=torch.float64, hoist=True), grad=grad)
        assert hoisted[2]["exec/hoisted_projections"] > 0
        assert base[2]["exec/hoisted_projections"] == 0
        torch.testing.assert_close(hoisted[0], base[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(hoisted[0], ref_loss, rtol=1e-12, atol=1e-12)
        assert hoisted[1].keys() == base[1].keys()
        assert not grad or len(hoisted[1]) == len(init_params(wl))
        for k in hoisted[1]:
            torch.testing.assert_close(hoisted[1][k], base[1][k], rtol=1e-10, atol=1e-12,
                                       msg=f"gradient of {k} differs")


@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm"])
def test_hoisted_float32_matches_reference_and_autograd(name: str) -> None:
    wl = small(name)
    graph, schedule, plan = setup(wl, count=6, strategy="naive")
    loss, grads, _ = run(wl, graph, schedule, plan, TorchExecutor(hoist=True), grad=True)
    params = {k: p.requires_grad_() for k, p in
              init_params(wl, torch.Generator().manual_seed(3)).items()}
    ref = reference_loss(graph, params)  # node by node, through autograd
    ref_grads = torch.autograd.grad(ref, list(params.values()), allow_unused=True)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    for k, g in zip(params, ref_grads, strict=True):
        if g is not None:
            torch.testing.assert_close(grads[k], g, rtol=1e-4, atol=1e-5, msg=k)


def test_autograd_training_path_runs_unhoisted() -> None:
    wl = small("bilstm_tagger")
    graph, schedule, plan = setup(wl)
    loss, grads, stats = run(wl, graph, schedule, plan,
                             TorchExecutor(dtype=torch.float64, hoist=True,
                                           hand_backward=False), grad=True)
    assert stats["exec/hoisted_projections"] == 0
    base_loss, base, _ = run(wl, graph, schedule, plan,
                             TorchExecutor(dtype=torch.float64, hoist=False), grad=True)
    torch.testing.assert_close(loss, base_loss)
    for k in base:
        torch.testing.assert_close(grads[k], base[k], rtol=1e-10, atol=1e-12)


def test_only_the_named_kinds_are_hoisted() -> None:
    graph, schedule, plan = setup(small("bilstm_tagger"))
    program, _ = TorchExecutor(hoist=["bilstm.l1_fwd"])._program(graph, schedule, plan)
    kinds = {s.op.kind for s in program.steps if s.op.kind.endswith(".projection")}
    assert kinds == {"bilstm.l1_fwd.projection"}
    none, _ = TorchExecutor(hoist=["lattice_lstm.char_arc"])._program(graph, schedule, plan)
    assert not isinstance(none, HoistedProgram)


def test_api_recorded_bilstm_is_hoisted() -> None:
    from benchmarks.peers.bilstm_tagger import record as record_bilstm_tagger

    wl = small("bilstm_tagger")
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    batch = DynamicBatch.from_workload(wl, params, dtype=torch.float64)
    record_bilstm_tagger(batch, wl, wl.load(wl.default_eval_split)[:3])
    graph = take_graph(batch)[0]
    schedule = make_scheduler("dynet_agenda")(graph)
    plan = plan_memory(graph, schedule, "naive")
    res = TorchExecutor(dtype=torch.float64, hoist=True).run(graph, schedule, plan, params)
    assert res.stats["exec/hoisted_projections"] >= 4
    assert res.loss is not None
    torch.testing.assert_close(res.loss, reference_loss(graph, params), rtol=1e-12, atol=0)


def test_param_grads_column_blocks_sum_to_the_full_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(8, 5, generator=gen), torch.randn(8, generator=gen)
    x, h = torch.randn(3, 3, generator=gen), torch.randn(3, 2, generator=gen)
    dy = torch.randn(3, 8, generator=gen)
    full, split = ParamGrads(), ParamGrads()
    full.linear(("w", "b"), dy, torch.cat([x, h], dim=1))
    split.linear(("w", "b"), dy, x)
    split.linear(("w",), dy, h, start=3)
    want, got = full.result({"w": w, "b": b}), split.result({"w": w, "b": b})
    torch.testing.assert_close(got["w"], want["w"])
    torch.testing.assert_close(got["b"], want["b"])  # the bias counted once


def test_misuse_gives_clear_errors() -> None:
    with pytest.raises(UnknownNameError, match="bilstm.l1_fwd"):
        TorchExecutor(hoist=["bilstm.l1_fwdd"])
    with pytest.raises(UnknownNameError, match="tree_lstm.leaf"):
        hoist_kinds(["tree_lstm.leaf"])
    with pytest.raises(ConfigError, match="hoist=3"):
        TorchExecutor(hoist=3)  # type: ignore[arg-type]
    assert hoist_kinds(False) == frozenset() and hoist_kinds(True) == frozenset(HOISTS)
    assert hoist_kinds("seq2seq.enc") == {"seq2seq.enc"}


def test_the_default_hoists_except_for_captured_cuda_graphs() -> None:
    assert TorchExecutor().hoist == frozenset(HOISTS)
    assert TorchExecutor(cuda_graphs=True).hoist == frozenset(HOISTS)  # no capture on CPU
    assert TorchExecutor(hoist=False).hoist == frozenset()


def test_weights_updated_in_place_are_seen_by_the_next_run() -> None:
    wl = small("bilstm_tagger")
    graph, schedule, plan = setup(wl)
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    hoisted, base = TorchExecutor(dtype=torch.float64, hoist=True), \
        TorchExecutor(dtype=torch.float64, hoist=False)
    first = hoisted.run(graph, schedule, plan, params).loss
    with torch.no_grad():
        for name in ("bilstm.l1_fwd", "bilstm.l2_bwd"):
            params[name].mul_(1.5)  # an optimizer step: same tensors, new values
    second = hoisted.run(graph, schedule, plan, params).loss
    assert second is not None and first is not None and not torch.equal(first, second)
    torch.testing.assert_close(second, base.run(graph, schedule, plan, params).loss,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strategy", ["aligned", "naive"])
def test_hoisted_under_other_memory_layouts(strategy: Strategy) -> None:
    wl = small("bilstm_tagger")
    graph, schedule, plan = setup(wl, scheduler="depth", strategy=strategy)
    base = run(wl, graph, schedule, plan, TorchExecutor(dtype=torch.float64, hoist=False),
               grad=True)
    hoisted = run(wl, graph, schedule, plan, TorchExecutor(dtype=torch.float64, hoist=True),
                  grad=True)
    torch.testing.assert_close(hoisted[0], base[0], rtol=1e-12, atol=1e-12)
    for k in base[1]:
        torch.testing.assert_close(hoisted[1][k], base[1][k], rtol=1e-10, atol=1e-12, msg=k)


@pytest.mark.parametrize("grad", [False, True])
def test_dynamic_batch_run_hoists_by_default(grad: bool) -> None:
    from benchmarks.peers.bilstm_tagger import record as record_bilstm_tagger

    wl = small("bilstm_tagger")
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    batch = DynamicBatch.from_workload(wl, params, dtype=torch.float64)
    got = {}
    for hoist in (False, True, None):  # None: the default, hoisted
        record_bilstm_tagger(batch, wl, wl.load(wl.default_eval_split)[:3])
        res = batch.run("dynet_agenda", strategy="aligned", grad=grad, hoist=hoist)
        assert res.loss is not None
        got[hoist] = (res.loss.detach(), res.run.stats["exec/hoisted_projections"])
    assert got[False][1] == 0 and (got[True][1] >= 4 or grad) and got[None][1] == got[True][1]
    torch.testing.assert_close(got[True][0], got[False][0], rtol=1e-12, atol=0)
