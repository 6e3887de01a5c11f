"""The module network's hand-written backwards equal autograd through the same forwards
(fp64), kind by kind: every op kind of the vocabulary, ``equal_object``, ``union`` and
``intersect`` included (rare or absent in small test mini-batches)."""

from __future__ import annotations

import pytest
import torch

from edbatch.executor import KERNELS, _fused, init_params
from edbatch.executor.param_grads import ParamGrads
from edbatch.graph import OpType
from edbatch.workloads.module_net import MAX_OBJECTS, ModuleNet, pack_object

WL = ModuleNet(embed_dim=4, hidden_dim=5)
B = 3


def _one_per_kind() -> list[OpType]:
    seen: dict[str, OpType] = {}
    for op in WL.vocab:
        if op.kind.startswith("module_net."):
            seen.setdefault(op.kind, op)
    return list(seen.values())


def _case(op: OpType, gen: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Random operands (attentions positive) and attrs of a batch of ``B`` nodes."""
    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    if op.kind == "module_net.object":
        codes = [pack_object([1, 5, 0, 2], -1.5, 2.25), pack_object([0, 7, 1, 0], 0.3, -3.0),
                 pack_object([1, 0, 1, 1], 3.0, 0.0)]
        return [], torch.tensor(codes)
    if op.kind == "module_net.objects":
        attrs = torch.tensor([3, 1, 2])
        width = op.out_shape[0] // MAX_OBJECTS
        return [rand(int((attrs > k).sum()), width) for k in range(3)], attrs
    if op.kind == "module_net.answer":
        return [rand(B, op.in_shapes[0][0]) - 0.5], torch.tensor([0, 4, 27])  # type: ignore[index]
    assert op.in_shapes is not None
    return [rand(B, *shape) - (0.5 if shape[0] != MAX_OBJECTS else 0.0)
            for shape in op.in_shapes], torch.zeros(B, dtype=torch.int64)


@pytest.mark.parametrize("op", _one_per_kind(), ids=lambda op: op.kind)
def test_hand_backward_equals_autograd(op: OpType) -> None:
    gen = torch.Generator().manual_seed(5)
    params = init_params(WL, torch.Generator().manual_seed(2), dtype=torch.float64)
    params = {k: v.detach() for k, v in params.items() if k in op.params}
    inputs, attrs = _case(op, gen)
    kernel = KERNELS[op.kind]
    leaves = [x.clone().requires_grad_() for x in inputs]
    ps = {k: v.clone().requires_grad_() for k, v in params.items()}
    y = kernel(op, leaves, ps, attrs)
    grad = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((y * grad).sum(), [*leaves, *ps.values()], allow_unused=True)
    saves: list = []
    with _fused.use(False):  # the torch bodies (the compiled ones: test_module_net_*_fused)
        y2 = kernel(op, inputs, params, attrs, save=saves)
        torch.testing.assert_close(y2, y.detach(), rtol=0, atol=0)
        acc = ParamGrads()
        got = kernel.backward(op, saves, grad, params, attrs, acc)
    total = acc.result(params)
    for k, (g, w) in enumerate(zip(got, want[:len(inputs)], strict=False)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"operand {k}")
    assert len(got) == len(inputs)
    for name, w in zip(ps, want[len(inputs):], strict=True):
        torch.testing.assert_close(total[name], w, rtol=1e-10, atol=1e-12, msg=name)


def test_scene_slot_rows_cpu_form_equals_sync_free_form() -> None:
    """The CPU's one-``nonzero`` slot rows equal the sync-free ``slot_nodes`` form."""
    from edbatch.executor.cells_module_net_scene import _slots
    from edbatch.executor.kernels import slot_nodes

    attrs = torch.tensor([3, 1, 10, 2, 7, 1])
    sizes = [int((attrs > k).sum()) for k in range(int(attrs.max()))]
    want = torch.cat([node * MAX_OBJECTS + j for j, node in
                      enumerate(slot_nodes(attrs, sizes, sync_free=True))])
    assert torch.equal(_slots(attrs, sizes), want)


def test_vector_weight_gradients_batched_across_batches() -> None:
    """``ParamGrads.linear`` with a vector weight (``y = x w + b``) over several batches
    equals the per-batch ``x^T d`` and ``sum(d)`` summed (fp64)."""
    gen = torch.Generator().manual_seed(3)
    f64 = torch.float64
    params = {"w": torch.zeros(4, dtype=f64), "b": torch.zeros(1, dtype=f64)}
    acc, dw, db = ParamGrads(), torch.zeros(4, dtype=f64), torch.zeros(1, dtype=f64)
    for rows in (5, 2, 7):
        x = torch.randn(rows, 4, generator=gen, dtype=torch.float64)
        d = torch.randn(rows, 1, generator=gen, dtype=torch.float64)
        acc.linear(("w", "b"), d, x)
        dw += x.t() @ d[:, 0]
        db += d.sum()
    total = acc.result(params)
    assert total["w"].shape == (4,) and total["b"].shape == (1,)
    torch.testing.assert_close(total["w"], dw, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total["b"], db, rtol=1e-12, atol=1e-12)
