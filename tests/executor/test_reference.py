"""Reference executor tests: cell kernels == their primitive decomposition for every real
workload, gradients, errors, last-use freeing and parameter initialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.errors import GraphError, UnknownNameError
from edbatch.executor import ExecutionError, init_params, reference_loss, run_reference
from edbatch.executor.params import is_embedding
from edbatch.executor.reference import free_schedule
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS, Workload, make_workload

torch.set_num_threads(1)

INSTANCES = [0, 1, 2]


def small_workload(name: str, granularity: str) -> Workload:
    """A workload with small sizes (short seq2seq sentences) for fast tests."""
    return make_workload(name, granularity=granularity,
                         **WORKLOADS[name].test_kwargs(short=True))


def perturbed_params(wl: Workload, seed: int = 0) -> dict[str, torch.nn.Parameter]:
    """init_params with random (non-zero) biases, so that bias handling is compared too."""
    gen = torch.Generator().manual_seed(seed)
    params = init_params(wl, gen)
    with torch.no_grad():
        for p in params.values():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5, generator=gen)
    return params


def used_params(graph: Graph) -> set[str]:
    return {name for k in np.flatnonzero(graph.type_counts) for name in graph.vocab[k].params}


@pytest.mark.parametrize("name", [n for n in REAL_WORKLOADS
                                  if "primitive" in WORKLOADS[n].granularities])
def test_cell_equals_primitive_and_gradients_flow(name: str) -> None:
    cell, prim = small_workload(name, "cell"), small_workload(name, "primitive")
    assert cell.param_shapes() == prim.param_shapes()
    params = perturbed_params(cell)
    split = cell.default_eval_split
    losses = {}
    for wl in (cell, prim):
        graph = wl.minibatch(split, INSTANCES)
        loss = reference_loss(graph, params)
        assert loss.shape == () and torch.isfinite(loss) and loss.item() > 0
        for p in params.values():
            p.grad = None
        loss.backward()
        used = used_params(graph)
        assert used, wl
        for pname in used:
            grad = params[pname].grad
            assert grad is not None and torch.isfinite(grad).all(), (wl.granularity, pname)
        losses[wl.granularity] = loss.detach()
    torch.testing.assert_close(losses["cell"], losses["primitive"], atol=1e-5, rtol=1e-6)


def test_per_instance_outputs_match_between_granularities() -> None:
    """Without loss_sum the per-node losses agree one by one (tree-GRU, first instance)."""
    cell, prim = small_workload("tree_gru", "cell"), small_workload("tree_gru", "primitive")
    params = perturbed_params(cell, seed=3)
    outs = [run_reference(wl.minibatch("dev", [0], loss_sum=False), params)
            for wl in (cell, prim)]
    assert len(outs[0]) == len(outs[1]) == cell.load("dev")[0].num_nodes
    for a, b in zip(outs[0].values(), outs[1].values()):
        assert a.shape == (1, 1)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_missing_weight_raises_execution_error_naming_node_and_op() -> None:
    wl = small_workload("tree_lstm", "cell")
    params = dict(init_params(wl, torch.Generator().manual_seed(0)))
    del params["tree_lstm.U_iou"]
    graph = wl.minibatch("dev", [0])
    with pytest.raises(ExecutionError) as info:
        run_reference(graph, params)
    msg = str(info.value)
    first = int(np.flatnonzero(graph.op_ids == graph.vocab.id("tree_lstm.internal"))[0])
    assert str(graph.node(first)) in msg
    assert "'tree_lstm.internal'" in msg and "tree_lstm.U_iou" in msg
    assert isinstance(info.value.__cause__, UnknownNameError)
    assert isinstance(info.value, RuntimeError)


def test_unknown_kind_fails_before_running() -> None:
    vocab = Vocab([OpType("type1", "abstract", None, ())])
    b = GraphBuilder(vocab)
    graph = b.build([b.add("type1")])
    with pytest.raises(UnknownNameError, match="scheduled, not executed"):
        run_reference(graph, {})


def tiny_graph(outputs: str = "last") -> Graph:
    h = 3
    vocab = Vocab([OpType("leaf", "lookup", (), (h,), ("E",)),
                   OpType("t", "tanh", ((h,),), (h,)),
                   OpType("add", "add", ((h,), (h,)), (h,))])
    b = GraphBuilder(vocab)
    x, y = b.add("leaf", attr=1), b.add("leaf", attr=2)
    t = b.add("t", x)
    z = b.add("add", t, y)
    unused = b.add("t", z)  # noqa: F841  (a value nobody reads)
    w = b.add("t", z)
    return b.build([w] if outputs == "last" else [t, w])


def test_free_schedule_and_outputs() -> None:
    graph = tiny_graph("two")
    frees = free_schedule(graph)
    # x dies at its user t (%2), y at z (%3), the unread %4 at once, z at its last user %5;
    # the outputs t (%2) and w (%5) are kept.
    assert frees == [[], [], [0], [1], [4], [3]]
    table = torch.randn(4, 3)
    out = run_reference(graph, {"E": table})
    assert sorted(out) == [2, 5]
    t = torch.tanh(table[1:2])
    torch.testing.assert_close(out[2], t)
    torch.testing.assert_close(out[5], torch.tanh(t + table[2:3]))


def test_reference_loss_needs_one_output_and_device_argument() -> None:
    with pytest.raises(GraphError, match="exactly one output"):
        reference_loss(tiny_graph("two"), {"E": torch.randn(4, 3)})
    with pytest.raises(GraphError, match="3 values"):
        reference_loss(tiny_graph("last"), {"E": torch.randn(4, 3)})
    out = run_reference(tiny_graph(), {"E": torch.randn(4, 3, dtype=torch.float64)},
                        device="cpu")
    assert next(iter(out.values())).dtype == torch.float64


def test_init_params_rules_and_determinism() -> None:
    wl = small_workload("lattice_lstm", "cell")
    a = init_params(wl, torch.Generator().manual_seed(7))
    b = init_params(wl, torch.Generator().manual_seed(7), dtype=torch.float64)
    c = init_params(wl, torch.Generator().manual_seed(8))
    assert list(a) == list(wl.param_shapes())
    for name, shape in wl.param_shapes().items():
        p = a[name]
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad
        assert tuple(p.shape) == shape and p.dtype == torch.float32
        assert b[name].dtype == torch.float64
        torch.testing.assert_close(b[name].float(), p.detach())
        if len(shape) == 1:
            assert not p.any()
        elif is_embedding(name):
            assert p.abs().max() <= 0.1 and not torch.equal(p, c[name])
        else:
            assert p.abs().max() <= (6 / (shape[0] + shape[1])) ** 0.5
            assert not torch.equal(p, c[name])
    assert {n for n in a if is_embedding(n)} == {"lattice_lstm.char_emb",
                                                 "lattice_lstm.word_emb"}


def test_kernel_overrides_fall_back_to_the_registry() -> None:
    """A partial kernels mapping overrides its kinds; every other kind uses the registry."""
    import torch

    from edbatch.executor import init_params, run_reference
    from edbatch.executor.kernels import KERNELS
    from edbatch.executor.torch_executor import TorchExecutor
    from edbatch.memory import plan_memory
    from edbatch.schedule import make_scheduler
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=3)
    graph = wl.build_graph(wl.load("dev")[:2])
    params = init_params(wl, torch.Generator().manual_seed(0))
    calls = []

    def doubled_loss(op, inputs, params, attrs):  # type: ignore[no-untyped-def]
        calls.append(len(attrs))
        return 2.0 * KERNELS.get("tree_lstm.loss")(op, inputs, params, attrs)

    override = {"tree_lstm.loss": doubled_loss}
    plain = run_reference(graph, params)
    twice = run_reference(graph, params, kernels=override)
    (v,) = plain
    torch.testing.assert_close(twice[v], 2.0 * plain[v])
    assert calls and sum(calls) == int(graph.type_counts[wl.vocab.id("tree_lstm.loss")])
    schedule = make_scheduler("depth")(graph)
    result = TorchExecutor(kernels=override).run(graph, schedule,
                                                 plan_memory(graph, schedule), params)
    torch.testing.assert_close(result.loss, 2.0 * plain[v].reshape(()))


@pytest.mark.parametrize(("grad", "hand"), [(False, True), (True, True), (True, False)])
def test_profiled_run_splits_reads_and_kernels_without_changing_values(grad: bool,
                                                                       hand: bool) -> None:
    import torch

    from edbatch.executor import init_params
    from edbatch.executor.torch_executor import TorchExecutor
    from edbatch.memory import plan_memory
    from edbatch.schedule import make_scheduler
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=6, hidden_dim=5)
    graph = wl.minibatch("dev", range(8))
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    params = {k: p.requires_grad_(grad)
              for k, p in init_params(wl, torch.Generator().manual_seed(0)).items()}
    plain = TorchExecutor(hand_backward=hand).run(graph, schedule, plan, params, grad=grad)
    profiled = TorchExecutor(profile=True, hand_backward=hand).run(graph, schedule, plan,
                                                                   params, grad=grad)
    assert plain.loss is not None and profiled.loss is not None
    assert torch.equal(plain.loss.detach(), profiled.loss.detach())
    stats = profiled.stats
    assert stats["exec/num_gathers"] > 0  # naive plan of trees: children are gathered
    assert 0 < stats["exec/gather_seconds"] <= stats["exec/read_seconds"]
    assert stats["exec/kernel_seconds"] > 0
    assert "exec/read_seconds" not in plain.stats
