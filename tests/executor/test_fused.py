"""Fused cell bodies (``edbatch.executor._fused``): the compiled element-wise kernels equal
the unfused torch path (fp64: to rounding, gradients included, on real workload graphs;
fp32: within the rational ``tanh``'s error), and they really run where they apply."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from edbatch.executor import _chain_train, _fused, _fused_sick, init_params
from edbatch.executor.cells import lstm_step_backward
from edbatch.executor.cells_hoist import lstm_from_gates
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS, make_workload

#: The workloads whose cell kinds all have hand-written backwards (the fused kinds' users).
HAND = tuple(n for n in REAL_WORKLOADS if WORKLOADS[n].hand_backward)
KERNELS = ("lstm_forward", "lstm_backward", "tree_forward", "tree_backward", "sick_forward",
           "sick_forward_rows", "sick_backward")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the fused kernels' calls (so a test sees the fused path really ran)."""
    counter: Counter[str] = Counter()
    for name in KERNELS:
        module = _fused_sick if name in _fused_sick.__all__ else _fused
        real = getattr(module, name)

        def counted(*args: object, _real: object = real, _name: str = name) -> None:
            counter[_name] += 1
            _real(*args)  # type: ignore[operator]
        monkeypatch.setattr(module, name, counted)
    chain = _chain_train._Chain.__call__  # training chains run the fused rows compiled

    def chained(self: object, *args: object) -> None:
        counter["train_chain"] += 1
        chain(self, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(_chain_train._Chain, "__call__", chained)
    yield counter


def _run(name: str, dtype: torch.dtype, fused: bool, hoist: bool | None
         ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    wl = make_workload(name, granularity="cell",
                       **WORKLOADS[name].test_kwargs(dim=6, hidden=5, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(4))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "planned")
    params = {k: p.requires_grad_() for k, p in
              init_params(wl, torch.Generator().manual_seed(3), dtype=dtype).items()}
    executor = TorchExecutor(dtype=dtype, fused=fused, hoist=hoist)
    infer = executor.run(graph, schedule, plan, params).loss
    result = executor.run(graph, schedule, plan, params, grad=True)
    assert infer is not None and result.loss is not None
    grads = torch.autograd.grad(result.loss, list(params.values()), allow_unused=True)
    return infer, result.loss.detach(), {k: g for k, g in zip(params, grads, strict=True)
                                         if g is not None}


@pytest.mark.parametrize("hoist", [None, False])
@pytest.mark.parametrize("name", HAND)
def test_fused_equals_unfused_in_fp64(name: str, hoist: bool | None,
                                      calls: Counter[str]) -> None:
    infer, loss, grads = _run(name, torch.float64, True, hoist)
    used = sum(calls.values())
    infer0, loss0, grads0 = _run(name, torch.float64, False, hoist)
    assert sum(calls.values()) == used  # fused=False: the unfused path only
    torch.testing.assert_close(infer, infer0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, loss0, rtol=1e-10, atol=1e-12)
    assert grads.keys() == grads0.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], grads0[k], rtol=1e-10, atol=1e-12,
                                   msg=f"gradient of {k} differs")
    if name in ("tree_lstm", "lattice_lstm", "bilstm_tagger"):  # the throughput rows
        kind = "tree" if name == "tree_lstm" else "lstm"  # (or the chains' compiled rows)
        assert calls[f"{kind}_forward"] + calls["train_chain"] > 0
        assert calls[f"{kind}_backward"] + calls["train_chain"] > 0
    if name == "tree_lstm_sick":  # leaf and internal batches, inference and training
        assert calls["sick_forward"] >= 2  # training (inference: the short path's kernel)
        assert calls["sick_forward_rows"] >= 2
        assert calls["sick_backward"] >= 2


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger", "tree_lstm_sick"])
def test_fused_close_to_unfused_in_fp32(name: str, calls: Counter[str]) -> None:
    infer, loss, grads = _run(name, torch.float32, True, None)
    infer0, loss0, grads0 = _run(name, torch.float32, False, None)
    assert calls  # the fused kernels ran in float32
    torch.testing.assert_close(infer, infer0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, loss0, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(grads[k], grads0[k], rtol=1e-4, atol=1e-5)


def _lstm_case(dtype: torch.dtype, fused: bool) -> list[Tensor]:
    gen = torch.Generator().manual_seed(0)
    batch, hidden = 9, 7
    g = torch.randn(batch, 4 * hidden, generator=gen, dtype=dtype) * 4
    state = torch.randn(batch, 3 * hidden, generator=gen, dtype=dtype)  # c: strided rows
    c = state[:, hidden:2 * hidden]
    grad = torch.randn(batch, 2 * hidden, generator=gen, dtype=dtype)
    xh = torch.randn(batch, 3, generator=gen, dtype=dtype)
    weight = torch.randn(4 * hidden, 3, generator=gen, dtype=dtype)
    with _fused.use(fused):
        save: dict[str, Tensor] = {"xh": xh}
        out = lstm_from_gates(g, c, None, save)
        saved = type("Saved", (), save)
        d_gates, d_in = lstm_step_backward(saved, grad, weight)
    return [out, save["t"], d_gates, d_in]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstm_kernels_on_strided_operands(dtype: torch.dtype, calls: Counter[str]) -> None:
    fused, unfused = _lstm_case(dtype, True), _lstm_case(dtype, False)
    assert calls["lstm_forward"] == 1 and calls["lstm_backward"] == 1
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for a, b in zip(fused, unfused, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_float32_activation_error_is_small() -> None:
    """The rational ``tanh`` (and the sigmoid from it) across the range, against float64."""
    x = torch.linspace(-12, 12, 4001, dtype=torch.float32).reshape(1, -1)
    hidden = x.shape[1]
    g = x.repeat(1, 4)
    out, t = torch.empty(1, 2 * hidden), torch.empty(1, hidden)
    _fused.lstm_forward(g, torch.zeros(1, hidden), out, t)
    sig, u = g[:, :hidden].double(), g[:, 3 * hidden:].double()
    assert (u - torch.tanh(x.double())).abs().max().item() < 3e-7
    assert (sig - torch.sigmoid(x.double())).abs().max().item() < 3e-7
    assert (t.double() - torch.tanh(out[:, hidden:].double())).abs().max().item() < 3e-7


def test_usable_only_where_it_applies() -> None:
    x = torch.zeros(3, 4)
    assert _fused.usable(x, x)
    assert not _fused.usable(x.long())  # other dtypes
    assert not _fused.usable(x, x.double())  # mixed dtypes
    assert not _fused.usable(torch.zeros(4, 3).t())  # strided columns
    with torch.enable_grad():
        assert not _fused.usable(x.requires_grad_())  # autograd records it
    with _fused.use(False):
        assert not _fused.usable(torch.zeros(3, 4))
        with _fused.use(None):  # leaves the setting
            assert not _fused.enabled()
    assert _fused.enabled() == _fused.DEFAULT


def test_unfused_backward_reads_a_fused_forwards_saves() -> None:
    """A fused forward saves all of ``g`` as ``gates``; the unfused backward reads it too
    (the switch turned off between forward and backward)."""
    gen = torch.Generator().manual_seed(1)
    batch, hidden = 4, 3
    g = torch.randn(batch, 4 * hidden, generator=gen, dtype=torch.float64)
    c = torch.randn(batch, hidden, generator=gen, dtype=torch.float64)
    grad = torch.randn(batch, 2 * hidden, generator=gen, dtype=torch.float64)
    weight = torch.randn(4 * hidden, 2, generator=gen, dtype=torch.float64)
    got = []
    for fused_forward in (True, False):
        save: dict[str, Tensor] = {"xh": torch.zeros(batch, 2, dtype=torch.float64)}
        with _fused.use(fused_forward):
            lstm_from_gates(g.clone(), c, None, save)
        assert save["gates"].shape[1] == (4 if fused_forward else 3) * hidden
        with _fused.use(False):
            got.append(lstm_step_backward(type("Saved", (), save), grad, weight))
    for a, b in zip(got[0], got[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["tree_lstm.leaf", "tree_lstm.internal", "bilstm.l1_fwd"])
def test_kernel_switch_between_forward_and_backward(kind: str) -> None:
    """Every combination of fused / unfused forward and backward of a kind gives the
    all-unfused gradients (fp64): the saves of either forward serve either backward."""
    from edbatch.executor import KERNELS
    from edbatch.executor.param_grads import ParamGrads
    from tests.executor.test_kernels import catalogue, random_attrs

    op, params = catalogue()[kind][0]
    params = {k: v.double() for k, v in params.items()}
    gen = torch.Generator().manual_seed(4)
    batch = 5
    inputs = [torch.randn(batch, w, generator=gen, dtype=torch.float64)
              for w in [int(torch.tensor(s).prod()) for s in op.in_shapes or ()]]
    attrs = random_attrs(kind, op, params, batch, gen)
    kernel = KERNELS.get(kind)
    results = {}
    for forward in (True, False):
        for backward in (True, False):
            saved: list[Tensor] = []
            with torch.no_grad(), _fused.use(forward):
                out = kernel(op, inputs, params, attrs, save=saved)
            grad = torch.ones_like(out) * torch.linspace(-1, 1, out.shape[1], dtype=out.dtype)
            acc = ParamGrads()
            with torch.no_grad(), _fused.use(backward):
                operands = kernel.backward(op, saved, grad, params, attrs, acc)
            results[forward, backward] = (out, operands, acc.result(params))
    out0, ops0, grads0 = results[False, False]
    for out, operands, grads in results.values():
        torch.testing.assert_close(out, out0, rtol=1e-12, atol=1e-12)
        for a, b in zip(operands, ops0, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert grads.keys() == grads0.keys()
        for k in grads:
            torch.testing.assert_close(grads[k], grads0[k], rtol=1e-12, atol=1e-12)
