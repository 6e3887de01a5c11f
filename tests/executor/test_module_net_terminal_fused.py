"""The module network's compiled terminal bodies (:mod:`edbatch.executor.
cells_module_net_terminal_fused`: ``count`` / ``exist``, ``compare``, ``query`` and the
answer's loss) equal the torch bodies they replace (fp64), their backwards equal autograd,
their numba loops equal their own Python twins, and the cell kinds do take them; and
``objects``' compiled placement of its slots read as one block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.errors import ExecutionError
from edbatch.executor import KERNELS, _fused, init_params
from edbatch.executor import cells_module_net_terminal_fused as tf
from edbatch.executor._reads import ArenaRows
from edbatch.executor.param_grads import ParamGrads
from edbatch.graph import OpType
from edbatch.workloads.module_net import MAX_OBJECTS, ModuleNet

WL = ModuleNet(embed_dim=4, hidden_dim=6)
KINDS = ("count", "compare", "query", "answer")
B = 5


def _ops() -> list[OpType]:
    seen: dict[str, OpType] = {}
    for op in WL.vocab:
        if op.kind.removeprefix("module_net.") in KINDS or op.name == "module_net.exist":
            seen.setdefault(op.name if op.name == "module_net.exist" else op.kind, op)
    return list(seen.values())


def _case(op: OpType, dtype: torch.dtype, gen: torch.Generator
          ) -> tuple[list[torch.Tensor | ArenaRows], torch.Tensor, dict[str, torch.Tensor]]:
    """Operands of ``B`` nodes (a query's scene as rows of a larger arena, out of order),
    attrs and parameters of ``op`` (random biases: every term matters)."""
    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, dtype=dtype)

    params = init_params(WL, torch.Generator().manual_seed(3), dtype=dtype)
    params = {k: (v + 0.3 * torch.randn(v.shape, generator=gen, dtype=dtype)).detach()
              for k, v in params.items() if k in op.params}
    assert op.in_shapes is not None
    if op.kind == "module_net.answer":
        return [rand(B, op.in_shapes[0][0]) - 0.5], torch.tensor([0, 4, 27, 4, 9]), params
    inputs: list[torch.Tensor | ArenaRows] = [
        rand(B, *shape) * (3.0 if shape[0] == MAX_OBJECTS else 1.0) - 0.5
        for shape in op.in_shapes]
    if op.kind == "module_net.query":
        arena = rand(B + 3, op.in_shapes[1][0]) - 0.5
        inputs[1] = ArenaRows(arena, torch.tensor([6, 0, 3, 3, 7]))
    return inputs, torch.zeros(B, dtype=torch.int64), params


def _dense(g: object, operand: object) -> torch.Tensor:
    """An operand gradient as a tensor (a scene's, ``SceneGrad`` or rows, added into zero
    arena rows as its read routes it)."""
    if isinstance(operand, ArenaRows):
        buf = torch.zeros_like(operand.arena)
        if isinstance(g, torch.Tensor):
            return buf.index_add_(0, operand.idx, g)
        g.add_to(buf, operand.idx)  # type: ignore[attr-defined]
        return buf
    return g  # type: ignore[return-value]


def _run(op: OpType, inputs: list, attrs: torch.Tensor, params: dict[str, torch.Tensor],
         grad: torch.Tensor | None, fused: bool) -> tuple:
    kernel = KERNELS[op.kind]
    with _fused.use(fused), torch.no_grad():
        saves: list = []
        y = kernel(op, inputs, params, attrs, save=saves)
        if grad is None:
            return y, None, None
        acc = ParamGrads()
        got = kernel.backward(op, saves, grad, params, attrs, acc)
        return y, [_dense(g, x) for g, x in zip(got, inputs, strict=True)], acc.result(params)


@pytest.mark.parametrize("op", _ops(), ids=lambda op: op.name)
def test_compiled_terminal_bodies_equal_torch_and_autograd(op: OpType) -> None:
    """fp64: forward and operand / parameter gradients of the compiled bodies against the
    torch bodies (fused off) and against autograd through the torch forward."""
    gen = torch.Generator().manual_seed(7)
    inputs, attrs, params = _case(op, torch.float64, gen)
    y_ref, _, _ = _run(op, inputs, attrs, params, None, False)
    grad = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    y, got, total = _run(op, inputs, attrs, params, grad, True)
    y_t, got_t, total_t = _run(op, inputs, attrs, params, grad, False)
    torch.testing.assert_close(y, y_t, rtol=1e-12, atol=1e-14)
    dense = [x.arena.index_select(0, x.idx) if isinstance(x, ArenaRows) else x for x in inputs]
    leaves = [x.clone().requires_grad_() for x in dense]
    ps = {k: v.clone().requires_grad_() for k, v in params.items()}
    with _fused.use(False):
        y_a = KERNELS[op.kind](op, leaves, ps, attrs)
    want = torch.autograd.grad((y_a * grad).sum(), [*leaves, *ps.values()])
    for k, (x, g, g_t) in enumerate(zip(inputs, got, got_t, strict=True)):
        w = want[k]
        if isinstance(x, ArenaRows):  # autograd's rows added into the arena's
            w = torch.zeros_like(x.arena).index_add_(0, x.idx, w)
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"operand {k}")
        torch.testing.assert_close(g, g_t, rtol=1e-10, atol=1e-12, msg=f"operand {k}")
    for name, w in zip(ps, want[len(inputs):], strict=True):
        torch.testing.assert_close(total[name], w, rtol=1e-10, atol=1e-12, msg=name)
        torch.testing.assert_close(total[name], total_t[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", _ops(), ids=lambda op: op.name)
def test_the_cell_kinds_take_the_compiled_bodies(op: OpType) -> None:
    """float32 (the rational ``tanh`` of the compiled loops differs from ``torch.tanh`` in
    the last bits somewhere among these rows): the kind's output with fused kernels on is
    bitwise its compiled body's, and not the torch body's, whose it is with them off."""
    gen = torch.Generator().manual_seed(8)
    ops = [_case(op, torch.float32, gen) for _ in range(40)]  # 200 rows in all
    outs = {f: torch.cat([_run(op, i, a, p, None, f)[0].reshape(-1) for i, a, p in ops])
            for f in (True, False)}
    direct = []
    for inputs, attrs, p in ops:
        kind = op.kind.removeprefix("module_net.")
        if kind == "count":
            y = tf.count_forward(inputs[0], p[op.params[0]], p[op.params[1]], None)[0]
        elif kind == "compare":
            y = tf.compare_forward(*inputs, p[op.params[0]], p[op.params[1]], None)[0]
        elif kind == "query":
            y = tf.query_forward(inputs[0], inputs[1].arena, inputs[1].idx,
                                 p[op.params[0]], p[op.params[1]], None)[0]
        else:
            y = tf.answer_forward(inputs[0], p[op.params[0]], p[op.params[1]], attrs, None)[0]
        direct.append(y.reshape(-1))
    assert torch.equal(outs[True], torch.cat(direct))
    assert not torch.equal(outs[True], outs[False])
    torch.testing.assert_close(outs[True], outs[False], rtol=2e-5, atol=2e-6)


def _np(*shape: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(shape)


def test_numba_loops_equal_their_python_twins() -> None:
    """Each compiled loop against its own Python function (``py_func``) on the same arrays
    (fp64; the twin's ``tanh`` is ``np.tanh``, as the float64 loop's)."""
    rng = np.random.default_rng(0)
    b_, n, h, f, a_n = 4, MAX_OBJECTS, 6, 3, 7
    att, w11, bias = np.abs(_np(b_, n, rng=rng)), _np(h, n + 1, rng=rng), _np(h, rng=rng)
    bins = np.arange(n + 1, dtype=np.float64)
    x, y, w3, grad = _np(b_, h, rng=rng), _np(b_, h, rng=rng), _np(h, 3 * h, rng=rng), \
        _np(b_, h, rng=rng)
    arena, idx = _np(6, n * f, rng=rng), np.array([5, 0, 2, 2])
    wq = _np(h, f, rng=rng)
    gold, g1 = np.array([0, 6, 3, 3]), _np(b_, 1, rng=rng)
    y_c = np.tanh(_np(b_, h, rng=rng))
    cases = [
        (tf._count_fwd, (att, w11, bias, bins), [(b_, h), (b_, n + 1), (b_, n + 1)]),
        (tf._count_bwd, (grad, y_c, np.abs(_np(b_, n + 1, rng=rng)), _np(b_, n + 1, rng=rng),
                         w11), [(b_, h), (b_, n)]),
        (tf._compare_fwd, (x, y, w3, bias), [(b_, 3 * h), (b_, h)]),
        (tf._compare_bwd, (grad, y_c, x, y, w3), [(b_, h), (b_, h), (b_, h)]),
        (tf._query_fwd, (att, arena, idx, wq, bias), [(b_, f), (b_, h)]),
        (tf._query_bwd, (grad, y_c, arena, idx, wq), [(b_, h), (b_, f), (b_, n)]),
        (tf._answer_fwd, (_np(b_, h, rng=rng), _np(a_n, h, rng=rng), _np(a_n, rng=rng), gold),
         [(b_, a_n), (b_, 1), (b_, 1)]),
        (tf._answer_bwd, (g1, _np(b_, a_n, rng=rng), np.abs(_np(b_, 1, rng=rng)) + 2.0, gold,
                          _np(a_n, h, rng=rng)), [(b_, a_n), (b_, h)]),
    ]
    for fn, args, shapes in cases:
        got = [np.full(s, np.nan) for s in shapes]
        want = [np.full(s, np.nan) for s in shapes]
        fn(*args, *got)
        fn.py_func(*args, *want)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert not np.isnan(g).any(), (fn.__name__, k)
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13,
                                       err_msg=f"{fn.__name__} output {k}")


def _objects_case(gen: torch.Generator) -> tuple[OpType, torch.Tensor, list[torch.Tensor]]:
    op = next(o for o in WL.vocab if o.kind == "module_net.objects")
    counts = torch.tensor([3, 0, 10, 1, 4, 2])
    width = op.out_shape[0] // MAX_OBJECTS
    slots = [torch.randn(int((counts > k).sum()), width, generator=gen, dtype=torch.float64)
             for k in range(MAX_OBJECTS)]
    return op, counts, slots


def test_objects_merged_read_compiled_equals_the_slot_by_slot_torch_body() -> None:
    """``objects`` given its slots as one merged block (``merge_repeated``): the compiled
    placement (fused on; saves no rows) and the torch body on the block (fused off) equal
    the torch body on the ten slots, forward and backward (fp64)."""
    op, counts, slots = _objects_case(torch.Generator().manual_seed(9))
    kernel, block = KERNELS[op.kind], torch.cat(slots)
    grad = torch.randn(len(counts), op.out_shape[0], dtype=torch.float64)
    want_y, want_g, _ = _run(op, slots, counts, {}, grad, False)
    for fused in (True, False):
        with _fused.use(fused), torch.no_grad():
            saves: list = []
            y = kernel(op, [block], {}, counts, save=saves)
            assert (saves[0].rows is None) == fused  # the compiled path taken where on
            (g,) = kernel.backward(op, saves, grad, {}, counts, ParamGrads())
        assert torch.equal(y, want_y) and torch.equal(g, torch.cat(want_g))
        with _fused.use(not fused), torch.no_grad():  # a forward's saves, the other backward
            (g2,) = kernel.backward(op, saves, grad, {}, counts, ParamGrads())
        assert torch.equal(g2, g)


def test_objects_merged_read_of_the_wrong_rows_is_refused() -> None:
    op, counts, slots = _objects_case(torch.Generator().manual_seed(9))
    block = torch.cat(slots)
    for bad in (block[:-1], torch.cat([block, block[:1]])):
        with torch.no_grad(), pytest.raises(ExecutionError, match=f"has {len(bad)} object "
                                            f"rows, but .* sum to {len(block)}"):
            KERNELS[op.kind](op, [bad], {}, counts)
    over = counts.clone()
    over[0], over[2] = 11, 2  # the same sum, one count over MAX_OBJECTS
    with torch.no_grad(), pytest.raises(ExecutionError, match=r"attrs \[11, 0, 2, .* must "
                                        r"be 0\.\.10"):
        KERNELS[op.kind](op, [block], {}, over)


def test_objects_placement_equals_its_python_twin() -> None:
    from edbatch.executor.cells_module_net_scene import _objects_place
    rng = np.random.default_rng(1)
    counts, f = np.array([2, 0, 3, 1]), 3
    block = rng.standard_normal((6, f))
    for forward in (True, False):
        args = [block.copy(), counts, rng.standard_normal((4, MAX_OBJECTS * f))]
        twin = [a.copy() for a in args[::2]]
        t = _objects_place(*args, forward)
        t2 = _objects_place.py_func(twin[0], counts, twin[1], forward)
        assert t == t2 == 6
        np.testing.assert_array_equal(args[0], twin[0])
        np.testing.assert_array_equal(args[2], twin[1])
