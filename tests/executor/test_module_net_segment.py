"""The module network's compiled paths equal the torch bodies they replace: the attention
segments (:mod:`edbatch.executor.cells_module_net_segment`: runs of attention batches as one
numba call each way), and the scene-arena reads (``ArenaRows``, ``SceneGrad``) of the fused
``filter``, ``relate`` and ``query`` bodies."""

from __future__ import annotations

import pytest
import torch

from edbatch.executor import KERNELS, _fused, init_params
from edbatch.executor._reads import IndexedRead
from edbatch.executor.cells_module_net_segment import Segment
from edbatch.executor.param_grads import ParamGrads
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.module_net import MAX_OBJECTS, ModuleNet

WL = ModuleNet(embed_dim=4, hidden_dim=5)


def _run(dtype: torch.dtype, strategy: str, bias: float | None = None, **kw: object
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor], TorchExecutor]:
    graph = WL.minibatch("val", range(24))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    params = init_params(WL, torch.Generator().manual_seed(4), dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    params = {k: (v + 0.1 * torch.randn(v.shape, generator=gen, dtype=dtype)).requires_grad_()
              for k, v in params.items()}  # non-zero biases: every parameter matters
    if bias is not None:  # every filter's bias: its sigmoid exactly 0 or 1 (fp64)
        with torch.no_grad():
            for k, v in params.items():
                if ".filter_" in k and k.endswith(".b"):
                    v.fill_(bias)
    ex = TorchExecutor("cpu", dtype, **kw)  # type: ignore[arg-type]
    res = ex.run(graph, schedule, plan, params, grad=True)
    assert res.loss is not None
    grads = torch.autograd.grad(res.loss, list(params.values()), allow_unused=True)
    ex._last = (graph, schedule, plan)  # type: ignore[attr-defined]
    return res.loss.detach(), {k: g for k, g in zip(params, grads, strict=True)
                               if g is not None}, ex


@pytest.mark.parametrize("strategy", ["aligned", "naive"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_segments_equal_per_batch_kernels_and_autograd(dtype: torch.dtype,
                                                       strategy: str) -> None:
    """Segments (fused on) against the same program batch by batch (fused off: the segment
    runs its batches' own torch kernels) and against per-batch autograd (no segments)."""
    loss, grads, ex = _run(dtype, strategy)
    program, _ = ex._program(*ex._last)  # type: ignore[attr-defined]
    kernels = [s.kernel for s in program.steps]
    segments = [k for k in kernels if isinstance(k, Segment)]
    covered = sum(len(k.steps) for k in segments)
    assert segments and len(kernels) == ex._last[1].num_batches - covered + len(segments)
    at = 0  # the steps tile the attrs in plan row order, a segment's its batches'
    for step in program.steps:
        assert step.attrs.data_ptr() == program.attrs[at:].data_ptr() and \
            len(step.attrs) == step.size
        if isinstance(step.kernel, Segment):
            assert step.size == sum(s.size for s in step.kernel.steps)
            assert torch.equal(step.attrs, torch.cat([s.attrs for s in step.kernel.steps]))
        at += step.size
    assert at == len(program.attrs)
    assert covered > len(kernels) // 2  # most batches of a CLEVR schedule are attentions
    kinds = {s.op.kind for k in segments for s in k.steps}
    assert {"module_net.filter", "module_net.relate", "module_net.same"} <= kinds
    tol = {"rtol": 1e-11, "atol": 1e-13} if dtype == torch.float64 else \
        {"rtol": 2e-5, "atol": 2e-6}
    for other in ({"fused": False}, {"hand_backward": False}):
        loss2, grads2, _ = _run(dtype, strategy, **other)
        torch.testing.assert_close(loss, loss2, **tol)
        assert grads.keys() == grads2.keys() and len(grads) > 20
        for k in grads:
            torch.testing.assert_close(grads[k], grads2[k], **tol, msg=k)


@pytest.mark.parametrize("bias", [-800.0, 800.0])
def test_segments_skip_exact_zeros_as_the_torch_path(bias: float) -> None:
    """The bodies' zero skips (attention exactly 0 on real objects, not only padded ones:
    every filter's sigmoid 0 at bias -800, or exactly 1 at +800, its derivative 0) give the
    torch path's and autograd's loss and gradients (fp64)."""
    loss, grads, _ = _run(torch.float64, "aligned", bias)
    for other in ({"fused": False}, {"hand_backward": False}):
        loss2, grads2, _ = _run(torch.float64, "aligned", bias, **other)
        torch.testing.assert_close(loss, loss2, rtol=1e-11, atol=1e-13)
        assert grads.keys() == grads2.keys() and len(grads) > 20
        for k in grads:
            torch.testing.assert_close(grads[k], grads2[k], rtol=1e-11, atol=1e-13, msg=k)


def test_segments_in_inference_equal_the_torch_path() -> None:
    graph = WL.minibatch("val", range(24, 40))
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "aligned")
    params = init_params(WL, torch.Generator().manual_seed(1), dtype=torch.float64)
    losses = [TorchExecutor("cpu", torch.float64, fused=on).run(graph, schedule, plan, params)
              .loss for on in (True, False)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=0)



def test_a_rerun_program_reads_this_runs_parameters() -> None:
    """A cached program with a parameterised segment, run again after the parameters
    changed in place (as an optimizer step does), gives what a fresh executor gives (a
    segment must not keep the parameter vector of an earlier run)."""
    graph = WL.minibatch("val", range(24))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "aligned")
    params = init_params(WL, torch.Generator().manual_seed(3), dtype=torch.float64)
    params = {k: v.requires_grad_() for k, v in params.items()}
    ex = TorchExecutor("cpu", torch.float64)
    program, _ = ex._program(graph, schedule, plan)
    assert any(isinstance(s.kernel, Segment) and s.kernel.names for s in program.steps)
    out = []
    for fresh in (False, True):
        run = TorchExecutor("cpu", torch.float64) if fresh else ex
        for step in range(1 if fresh else 2):
            res = run.run(graph, schedule, plan, params, grad=True)
            assert res.loss is not None
            grads = torch.autograd.grad(res.loss, list(params.values()), allow_unused=True)
            if not fresh and step == 0:
                with torch.no_grad():
                    for v in params.values():
                        v.mul_(1.25)
        out.append((res.loss.detach(), grads))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-12, atol=0)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)


def test_a_segment_without_parameters_trains() -> None:
    """A run of parameter-free batches (``unique`` then ``intersect``, as ``depth`` schedules
    these 8 test questions) is a segment with no parameters: its backward routes the
    attention gradients and adds no parameter gradient (it used to split a placeholder)."""
    graph = WL.minibatch("test", [81, 100, 308, 466, 314, 143, 52, 457])
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "aligned")
    ex = TorchExecutor("cpu", torch.float64)
    program, _ = ex._program(graph, schedule, plan)
    assert any(isinstance(s.kernel, Segment) and not s.kernel.names for s in program.steps)
    params = init_params(WL, torch.Generator().manual_seed(2), dtype=torch.float64)
    params = {k: v.requires_grad_() for k, v in params.items()}
    out = []
    for fused in (True, False):
        res = TorchExecutor("cpu", torch.float64, fused=fused).run(graph, schedule, plan,
                                                                   params, grad=True)
        assert res.loss is not None
        out.append((res.loss, torch.autograd.grad(res.loss, list(params.values()),
                                                  allow_unused=True)))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-12, atol=0)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)

@pytest.mark.parametrize("kind", ["module_net.filter", "module_net.relate", "module_net.query"])
def test_scene_arena_reads_equal_gathered_reads(kind: str) -> None:
    """A fused body reading its scenes in the arena by row (``IndexedRead``, repeated rows
    included) and routing a ``SceneGrad`` equals the torch body on the gathered rows with a
    dense ``index_add_`` (fp64)."""
    f64 = torch.float64
    op = next(o for o in WL.vocab if o.kind == kind)
    params = {k: v.detach() for k, v in init_params(
        WL, torch.Generator().manual_seed(2), dtype=f64).items() if k in op.params}
    gen = torch.Generator().manual_seed(3)
    width = op.in_shapes[1][0] // MAX_OBJECTS  # type: ignore[index]
    arena = torch.randn(9, MAX_OBJECTS, width, generator=gen, dtype=f64)
    arena[:, 7:, 0], arena[:, :7, 0] = 0.0, 1.0  # seven objects, three padded rows
    arena = arena.reshape(9, -1)
    idx = torch.tensor([4, 0, 4, 8, 2])
    att = torch.rand(5, MAX_OBJECTS, generator=gen, dtype=f64)
    grad = torch.randn(5, op.out_shape[0], generator=gen, dtype=f64)
    kernel, runs = KERNELS[kind], []
    for on in (True, False):
        read = IndexedRead(0, idx)
        with torch.no_grad(), _fused.use(on):
            saves: list = []
            y = kernel(op, [att, read([arena])], params, torch.zeros(5), save=saves)
            acc = ParamGrads()
            got = kernel.backward(op, saves, grad, params, torch.zeros(5), acc)
            d_arena = torch.zeros_like(arena)
            read.route(got[1], [d_arena])
        assert isinstance(got[1], torch.Tensor) != on  # fused: a SceneGrad
        runs.append((y, got[0], d_arena, *acc.result(params).values()))
    for have, want in zip(*runs, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_object_rows_equal_the_numpy_rows(dtype: torch.dtype) -> None:
    """``module_net.object``'s compiled rows (fused on) equal its numpy/torch rows and save
    the same table rows."""
    graph = WL.minibatch("val", range(6))
    op = next(o for o in WL.vocab if o.kind == "module_net.object")
    nodes = [v for v in range(graph.num_nodes) if graph.vocab[graph.op_ids[v]] is op]
    attrs = torch.as_tensor(graph.attrs[nodes])
    table = init_params(WL, torch.Generator().manual_seed(6), dtype=dtype)[op.params[0]]
    runs = []
    for on in (True, False):
        saves: list = []
        with torch.no_grad(), _fused.use(on):
            runs.append((KERNELS[op.kind](op, [], {op.params[0]: table}, attrs, save=saves),
                         saves[0].index))
    assert len(nodes) > 20 and runs[0][0].shape == (len(nodes), op.out_shape[0])
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-6 if dtype == torch.float32
                               else 1e-13, atol=0)
    assert torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_object_table_gradient_equals_the_torch_rows(dtype: torch.dtype) -> None:
    """``module_net.object``'s compiled backward (fused on) gives the table the gradient the
    torch body's repeated rows give through ``ParamGrads`` (``index_add_``), bit for bit (the
    same additions in the same order), and routes nothing to operands (it has none); the
    sparse-rows accumulator keeps the torch body (its gradient stays sparse)."""
    graph = WL.minibatch("val", range(6))
    op = next(o for o in WL.vocab if o.kind == "module_net.object")
    nodes = [v for v in range(graph.num_nodes) if graph.vocab[graph.op_ids[v]] is op]
    attrs = torch.as_tensor(graph.attrs[nodes])
    name = op.params[0]
    table = init_params(WL, torch.Generator().manual_seed(7), dtype=dtype)[name].detach()
    grad = torch.randn(len(nodes), op.out_shape[0], generator=torch.Generator().manual_seed(8),
                       dtype=dtype)
    kernel, got = KERNELS[op.kind], []
    for on in (True, False):
        saves: list = []
        acc = ParamGrads()
        with torch.no_grad(), _fused.use(on):
            kernel(op, [], {name: table}, attrs, save=saves)
            assert kernel.backward(op, saves, grad, {name: table}, attrs, acc) == []
        assert (name in acc._dense) == on  # the compiled body ran (on) or the rows path
        got.append(acc.result({name: table})[name])
    assert len(nodes) > 20 and torch.equal(got[0], got[1]) and got[0].abs().sum() > 0
    sparse = ParamGrads(sparse_rows=True)
    saves = []
    with torch.no_grad():
        kernel(op, [], {name: table}, attrs, save=saves)
        kernel.backward(op, saves, grad, {name: table}, attrs, sparse)
    dense = sparse.result({name: table})[name]
    assert dense.is_sparse and torch.allclose(dense.to_dense(), got[1])
