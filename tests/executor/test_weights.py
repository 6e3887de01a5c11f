"""The cell GEMMs' contiguous ``W^T`` (``executor/_weights.py``) and the scalar-free
``fast_tanh``: same values on the tracked and untracked paths, a cache that follows in-place
weight updates, gradients that reach every input."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edbatch.executor._weights import TRANSPOSED, Transposed, linear_t
from edbatch.executor.kernels import FAST_TANH_MIN, fast_tanh

torch.set_num_threads(1)


def _data(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 150, generator=gen, dtype=dtype)
    w = torch.randn(5, 150, generator=gen, dtype=dtype)  # a shape where the strided W^T
    b = torch.randn(5, generator=gen, dtype=dtype)  # gives other floats on this CPU
    return x, w, b


def test_untracked_and_tracked_paths_are_bit_identical() -> None:
    x, w, b = _data()
    with torch.no_grad():
        plain = linear_t(x, w, b)
    tracked = linear_t(x, w.clone().requires_grad_(), b.clone().requires_grad_())
    assert tracked.requires_grad
    assert torch.equal(plain, tracked.detach())
    torch.testing.assert_close(plain, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_tracked_path_gives_every_gradient() -> None:
    x, w, b = _data(torch.float64)
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    linear_t(*args).square().sum().backward()
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    F.linear(*ref).square().sum().backward()
    for got, want in zip(args, ref, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_cache_follows_in_place_updates_and_new_tensors() -> None:
    x, w, b = _data()
    with torch.no_grad():
        first = linear_t(x, w, b)
        assert TRANSPOSED(w) is TRANSPOSED(w)  # reused while the weight is unchanged
        w.mul_(2.0)  # an optimizer step: the version counter moves
        second = linear_t(x, w, b)
    torch.testing.assert_close(second - b, 2.0 * (first - b), rtol=1e-4, atol=1e-3)
    cache = Transposed(size=2)
    a, c = cache(w), cache(w, 5)
    assert torch.equal(a, w.t()) and torch.equal(c, w[:, 5:].t()) and c.is_contiguous()
    cache(w.clone())  # a third entry clears the full cache
    assert len(cache.entries) == 1


def test_fast_tanh_keeps_the_old_floats() -> None:
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(FAST_TANH_MIN // 100 + 3, 100, generator=gen, dtype=dtype) * 4
        old = torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)  # the formula before the change
        assert torch.equal(fast_tanh(x), old)
        assert torch.equal(fast_tanh(x.clone().requires_grad_()).detach(), old)
        torch.testing.assert_close(fast_tanh(x), torch.tanh(x), rtol=0, atol=1e-6)
