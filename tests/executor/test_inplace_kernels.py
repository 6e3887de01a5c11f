"""The kernels' in-place paths (no autograd: inference and the hand-written-backward forward)
compute the same floats as their autograd paths, write only their ``out`` region, and the
gradient routes they feed give the same sums as the plain ``index_add_``."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from edbatch.executor import KERNELS, _fused
from edbatch.executor._reads import PAD_MIN_ROWS, RowsRead
from edbatch.executor.kernels import FAST_TANH_MIN, untracked
from tests.executor.test_kernels import catalogue, random_attrs, random_inputs

torch.set_num_threads(1)

OUT_KINDS = [k for k in KERNELS.names() if getattr(KERNELS.get(k), "writes_out", False)]


@pytest.fixture(autouse=True)
def _unfused() -> Iterator[None]:
    """Bit identity is the unfused torch path's (the fused kernels: ``test_fused.py``)."""
    with _fused.use(False):
        yield


def test_the_fused_kinds_write_out() -> None:
    assert {"tree_lstm.leaf", "tree_lstm.internal", "lattice_lstm.char_arc", "sum",
            "bilstm.l1_fwd", "seq2seq.enc"} <= set(OUT_KINDS)


@pytest.mark.parametrize("batch", [1, 5, FAST_TANH_MIN // 8 + 40])  # the last: sigmoid tanh
@pytest.mark.parametrize("kind", OUT_KINDS)
def test_inplace_path_is_bit_identical_to_autograd_path(kind: str, batch: int) -> None:
    gen = torch.Generator().manual_seed(2)
    kernel = KERNELS.get(kind)
    for op, params in catalogue()[kind]:
        if op.in_shapes is None:
            continue
        inputs = random_inputs(op, batch, gen)
        attrs = random_attrs(kind, op, params, batch, gen)
        width = math.prod(op.out_shape)
        tracked = {k: p.detach().clone().requires_grad_() for k, p in params.items()}
        with torch.enable_grad():
            assert not untracked(*(tracked[k] for k in op.params)) or not op.params
            reference = kernel(op, inputs, tracked, attrs).detach()
        arena = torch.full((batch + 3, width), 7.0)
        saved: list[torch.Tensor] = []
        with torch.no_grad():
            plain = kernel(op, inputs, params, attrs)
            got = kernel(op, inputs, params, attrs,  # type: ignore[call-arg]
                         out=arena[2:2 + batch], save=saved)
        assert torch.equal(plain, reference), op.name
        assert torch.equal(arena[2:2 + batch], reference), op.name
        assert got.data_ptr() == arena[2:2 + batch].data_ptr()
        assert (arena[:2] == 7.0).all() and (arena[2 + batch:] == 7.0).all(), \
            f"{op.name} wrote outside its out region"


def test_sum_into_out_keeps_the_addition_order() -> None:
    (op, params), *_ = [(o, p) for o, p in catalogue()["sum"] if o.arity == 3]
    a, b, c = (torch.randn(6, math.prod(op.out_shape)) * 1e4 for _ in range(3))
    out = torch.empty_like(a)
    with torch.no_grad():
        KERNELS.get("sum")(op, [a, b, c], params, torch.full((6,), -1),
                           out=out)  # type: ignore[call-arg]
    assert torch.equal(out, (a + b) + c)


@pytest.mark.parametrize("rows", [5, PAD_MIN_ROWS + 3])  # narrow: sliced, then padded
@pytest.mark.parametrize("narrow", [False, True])
def test_rows_read_route_adds_like_index_add(narrow: bool, rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    idx = torch.tensor([5, 1, 5, 0, 7] * (rows // 5) + [8] * (rows % 5))  # repeated rows
    grad = torch.randn(rows, 3 if narrow else 8, generator=gen)  # must get every gradient
    bufs = [torch.randn(9, 8, generator=gen)]
    expected = bufs[0].clone()
    expected[:, :grad.shape[1]].index_add_(0, idx, grad)
    RowsRead(0, idx).route(grad, bufs)
    torch.testing.assert_close(bufs[0], expected, rtol=0, atol=1e-6)
