"""Kernel contract tests: every registered kernel, batch of 4 == 4 batches of 1, shapes,
purity, and the semantics of the primitive kinds."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from edbatch.errors import GraphError, UnknownNameError
from edbatch.executor import KERNELS, init_params, kernel_for
from edbatch.executor.kernels import FAST_TANH_MIN, fast_tanh, op_params, parse_slice
from edbatch.graph import OpType
from edbatch.registry import Registry
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS, make_workload

torch.set_num_threads(1)

#: Attr values in [0, ATTR_BOUND) are valid token ids and labels for every op type below,
#: except those of :data:`ATTR_RANGES` and ``lookup`` (its table's rows): see ``random_attrs``.
ATTR_BOUND = 5
#: Kinds whose attrs are not small ids: their valid ``[low, high)``.
ATTR_RANGES = {"tree_lstm_sick.sim": (1000, 5001)}  # round(score * 1000), score in 1..5


def random_attrs(kind: str, op: OpType, params: dict[str, torch.Tensor], n: int,
                 gen: torch.Generator) -> torch.Tensor:
    """``n`` valid attrs of ``op`` (kind ``kind``): ids and labels below ``ATTR_BOUND`` (a
    lookup's table may have 2 rows), the ranges of :data:`ATTR_RANGES`."""
    low, high = ATTR_RANGES.get(kind, (0, ATTR_BOUND))
    if kind == "lookup":
        high = min(high, len(params[op.params[0]]))
    return torch.randint(low, high, (n,), generator=gen)


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, list[tuple[OpType, dict[str, torch.Tensor]]]]:
    """Kind -> every op type of that kind in the real workloads (both granularities)."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, list[tuple[OpType, dict[str, torch.Tensor]]]] = {}
    seen: set[str] = set()
    for name in REAL_WORKLOADS:
        for granularity in WORKLOADS[name].granularities:
            wl = make_workload(name, granularity=granularity,
                               **WORKLOADS[name].test_kwargs(short=True))
            params = {k: v.detach() for k, v in init_params(wl, gen).items()}
            with torch.no_grad():
                for p in params.values():  # non-zero biases, so bias handling is tested
                    if p.dim() == 1:
                        p.uniform_(-0.5, 0.5, generator=gen)
            for op in wl.vocab:
                if op.name not in seen:
                    seen.add(op.name)
                    out.setdefault(op.kind, []).append((op, params))
    return out


def test_every_workload_kind_has_a_kernel_and_every_kernel_is_used() -> None:
    kinds = set(catalogue())
    assert kinds - set(KERNELS.names()) == set()
    assert set(KERNELS.names()) - kinds == set()


def random_inputs(op: OpType, batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    assert op.in_shapes is not None
    return [torch.randn(batch, math.prod(s), generator=gen) for s in op.in_shapes]


@pytest.mark.parametrize("kind", KERNELS.names())
def test_batch_equals_singles(kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    kernel = KERNELS.get(kind)
    for op, params in catalogue()[kind]:
        if op.in_shapes is None:  # the variadic loss_sum runs alone; tested below
            continue
        inputs = random_inputs(op, 4, gen)
        attrs = random_attrs(kind, op, params, 4, gen)
        before = [x.clone() for x in inputs]
        param_before = {k: params[k].clone() for k in op.params}
        batched = kernel(op, inputs, params, attrs)
        assert batched.shape == (4, math.prod(op.out_shape)), op.name
        assert batched.dtype == torch.float32
        singles = torch.cat([kernel(op, [x[i:i + 1] for x in inputs], params, attrs[i:i + 1])
                             for i in range(4)])
        torch.testing.assert_close(batched, singles, atol=1e-6, rtol=1e-6, msg=op.name)
        for x, y in zip(inputs, before):
            assert torch.equal(x, y), f"{op.name} modified an input in place"
        for k in op.params:
            assert torch.equal(params[k], param_before[k]), f"{op.name} modified {k}"


def call(kind: str, op: OpType, inputs: list[torch.Tensor],
         params: dict[str, torch.Tensor] | None = None, attrs: list[int] | None = None
         ) -> torch.Tensor:
    b = inputs[0].shape[0] if inputs else len(attrs or [0])
    a = torch.tensor(attrs if attrs is not None else [-1] * b)
    return KERNELS[kind](op, inputs, params or {}, a)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-7), (torch.float64, 1e-15)])
def test_fast_tanh_matches_tanh(dtype: torch.dtype, atol: float) -> None:
    x = torch.cat([torch.linspace(-30, 30, FAST_TANH_MIN + 100_001, dtype=dtype),
                   torch.tensor([0.0, -0.0, 1e-30, float("inf"), float("-inf")], dtype=dtype)])
    keep = x.clone()
    y = fast_tanh(x)
    assert y.dtype == dtype and torch.equal(x, keep)  # the input is never written
    torch.testing.assert_close(y, torch.tanh(x), rtol=0, atol=atol)
    assert torch.isnan(fast_tanh(torch.tensor([float("nan")], dtype=dtype))).all()


def test_fast_tanh_gradient() -> None:
    x = torch.linspace(-4, 4, FAST_TANH_MIN + 41, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fast_tanh, (x,), fast_mode=True)
    (g,) = torch.autograd.grad(fast_tanh(x).sum(), x)
    torch.testing.assert_close(g, 1 - torch.tanh(x.detach()) ** 2)


def test_elementwise_semantics() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    un, bi = OpType("u/4", "u", ((4,),), (4,)), OpType("b/4", "b", ((4,), (4,)), (4,))
    torch.testing.assert_close(call("tanh", un, [x]), torch.tanh(x))
    torch.testing.assert_close(call("sigmoid", un, [x]), torch.sigmoid(x))
    torch.testing.assert_close(call("one_minus", un, [x]), 1 - x)
    torch.testing.assert_close(call("half", un, [x]), x / 2)
    torch.testing.assert_close(call("add", bi, [x, y]), x + y)
    torch.testing.assert_close(call("cmult", bi, [x, y]), x * y)
    cat = OpType("concat/4+4", "concat", ((4,), (4,)), (8,))
    torch.testing.assert_close(call("concat", cat, [x, y]), torch.cat([x, y], 1))
    zero = OpType("zero/4", "zero", (), (4,))
    assert torch.equal(call("zero", zero, [], attrs=[-1, -1]), torch.zeros(2, 4))


def test_lookup_affine_matvec_affine_rows() -> None:
    table, w, b = torch.randn(6, 3), torch.randn(5, 3), torch.randn(5)
    look = OpType("lookup.E", "lookup", (), (3,), ("E",))
    torch.testing.assert_close(call("lookup", look, [], {"E": table}, [4, 0]), table[[4, 0]])
    aff = OpType("affine.W", "affine", ((3,),), (5,), ("W", "W.b"))
    x = torch.randn(2, 3)
    torch.testing.assert_close(call("affine", aff, [x], {"W": w, "W.b": b}), x @ w.T + b)
    m, v = torch.randn(2, 3, 4), torch.randn(2, 4)
    mv = OpType("matvec/3x4", "matvec", ((12,), (4,)), (3,))
    torch.testing.assert_close(call("matvec", mv, [m.reshape(2, 12), v]),
                               torch.stack([m[i] @ v[i] for i in range(2)]))
    h = 3
    wm, bm, stack = torch.randn(h, 2 * h), torch.randn(h), torch.randn(2, 2 * h, h)
    rows = OpType("affine_rows.W_M", "affine_rows", ((2 * h * h,),), (h * h,), ("W_M", "W_M.b"))
    got = call("affine_rows", rows, [stack.reshape(2, -1)], {"W_M": wm, "W_M.b": bm})
    want = torch.stack([(wm @ stack[i] + bm[:, None]).reshape(-1) for i in range(2)])
    torch.testing.assert_close(got, want)


def test_pick_nll_picks_the_label() -> None:
    op = OpType("pick_nll/3", "pick_nll", ((3,),), (1,))
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    got = call("pick_nll", op, [logits], attrs=[0, 2])
    want = -F.log_softmax(logits, dim=1)[[0, 1], [0, 2]].unsqueeze(1)
    assert got.shape == (2, 1)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match=r"row 0 of the batch has label -1, outside 0\.\.2 "
                       r"\(3 classes\); its attr must be a class index"):
        call("pick_nll", op, [logits], attrs=[-1, 0])  # an unused (-1) label is not a class
    with pytest.raises(ValueError, match="row 1 of the batch has label 3, outside 0..2"):
        call("pick_nll", op, [logits], attrs=[0, 3])


def test_sum_variadic_and_k_ary() -> None:
    loss_sum = OpType("loss_sum", "sum", None, (1,), batchable=False)
    parts = [torch.tensor([[1.0]]), torch.tensor([[2.5]]), torch.tensor([[-0.5]])]
    torch.testing.assert_close(call("sum", loss_sum, parts), torch.tensor([[3.0]]))
    assert torch.equal(KERNELS["sum"](loss_sum, [], {}, torch.tensor([-1])), torch.zeros(1, 1))
    sum3 = OpType("s.sum3", "sum", ((2,),) * 3, (2,))
    xs = [torch.randn(4, 2) for _ in range(3)]
    torch.testing.assert_close(call("sum", sum3, xs), xs[0] + xs[1] + xs[2])


def test_slice_bounds() -> None:
    op = OpType("slice/1:3/4", "slice", ((4,),), (2,))
    assert parse_slice(op) == (1, 3)
    x = torch.arange(8.0).view(2, 4)
    assert torch.equal(call("slice", op, [x]), x[:, 1:3])
    for bad in (OpType("slice.gate", "slice", ((4,),), (2,)),  # no bounds in the name
                OpType("slice/1:3/4", "slice", ((4,),), (3,)),  # width disagrees
                OpType("slice/3:1/4", "slice", ((4,),), (2,)),  # empty range
                OpType("slice/0:2/5", "slice", ((4,),), (2,))):  # dim disagrees
        with pytest.raises(GraphError, match="slice"):
            parse_slice(bad)


def test_unknown_kind_has_hint_and_explains_dumps() -> None:
    op = OpType("type3", "abstract", None, ())
    with pytest.raises(UnknownNameError, match="'type3' has no kernel") as info:
        kernel_for(op)
    assert "scheduled, not executed" in str(info.value)
    with pytest.raises(UnknownNameError, match="Did you mean 'tanh'") as info:
        KERNELS.get("tanhh")
    assert "sigmoid" in str(info.value)  # the known kinds are listed
    assert kernel_for(OpType("tanh/4", "tanh", ((4,),), (4,))) is KERNELS.get("tanh")


def test_op_params_errors() -> None:
    op = OpType("affine.W", "affine", ((3,),), (5,), ("W", "W.b"))
    with pytest.raises(UnknownNameError, match="'W.b' of op type 'affine.W' is missing"):
        op_params(op, {"W": torch.zeros(5, 3)}, 2)
    with pytest.raises(GraphError, match="reads 3"):
        op_params(op, {"W": torch.zeros(5, 3), "W.b": torch.zeros(5)}, 3)


def test_registry_contract() -> None:
    reg: Registry[int] = Registry("widget", hint="Register it first.")
    assert reg.register("a")(1) == 1
    reg.register("a")(1)  # the same object again: no-op
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(2)
    reg.register("b")(2)
    assert reg.names() == ("a", "b") and "a" in reg and "c" not in reg and len(reg) == 2
    assert reg["b"] == 2 and list(reg) == ["a", "b"]
    with pytest.raises(UnknownNameError, match=r"unknown widget 'bb'.*'b'.*a, b.*first"):
        reg.get("bb")
    with pytest.raises(KeyError):  # UnknownNameError is a KeyError
        reg.get("zzz")


def test_slot_nodes_sync_free_form_equals_nonzero() -> None:
    """The sort form (CUDA's: capturable) picks the same nodes as ``nonzero`` (the CPU's)."""
    from edbatch.executor.kernels import slot_nodes
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        counts = torch.randint(0, 5, (int(torch.randint(1, 40, (1,), generator=gen)),),
                               generator=gen)
        sizes = [int((counts > k).sum()) for k in range(int(counts.max()))]
        want = slot_nodes(counts, sizes, sync_free=False)
        got = slot_nodes(counts, sizes, sync_free=True)
        assert [t.tolist() for t in got] == [t.tolist() for t in want]
        assert all(t.tolist() == torch.nonzero(counts > k).reshape(-1).tolist()
                   for k, t in enumerate(want))
