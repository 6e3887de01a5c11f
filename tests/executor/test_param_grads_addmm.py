"""``ParamGrads.addmm``: weight gradients added in place by column block (the GGNN update's
weights over its rounds), equal to the products summed; shapes that do not fit are named."""

from __future__ import annotations

import pytest
import torch

from edbatch.executor.param_grads import ParamGrads


def test_addmm_sums_column_blocks_in_place_and_meets_other_contributions() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.zeros(3, 5, dtype=torch.float64)
    terms = [(torch.randn(3, 7, generator=g, dtype=torch.float64),
              torch.randn(7, n, generator=g, dtype=torch.float64), start)
             for n, start in ((2, 0), (3, 2), (2, 0), (5, 0))]
    acc = ParamGrads()
    expected = torch.zeros_like(w)
    for a, b, start in terms:
        acc.addmm("w", a, b, w, start)
        expected[:, start:start + b.shape[1]] += a @ b
    dense = torch.randn(3, 5, generator=g, dtype=torch.float64)
    acc.add("w", dense)  # a whole gradient recorded the other way: summed with the buffer
    out = acc.result({"w": w})
    torch.testing.assert_close(out["w"], expected + dense, atol=1e-12, rtol=1e-12)
    assert set(out) == {"w"}


def test_addmm_with_no_rows_gives_a_zero_gradient() -> None:
    w = torch.ones(2, 3)
    acc = ParamGrads()
    acc.addmm("w", torch.zeros(2, 0), torch.zeros(0, 3), w)
    assert torch.equal(acc.result({"w": w})["w"], torch.zeros(2, 3))


@pytest.mark.parametrize(("a", "b", "start"), [((2, 4), (4, 2), 2),  # past the last column
                                               ((3, 4), (4, 1), 0),  # wrong row count
                                               ((2, 4), (4, 1), -1)])
def test_addmm_that_does_not_fit_is_named(a: tuple[int, int], b: tuple[int, int],
                                          start: int) -> None:
    acc = ParamGrads()
    with pytest.raises(ValueError, match=r"'w' \(2, 3\).*does not fit"):
        acc.addmm("w", torch.zeros(a), torch.zeros(b), torch.zeros(2, 3), start)
