"""The cell GEMMs' contiguous ``W^T`` (``executor/_weights.py``) and the scalar-free
``fast_tanh``: same values on the tracked and untracked paths, a cache that follows in-place
weight updates, gradients that reach every input."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edbatch.executor._weights import TRANSPOSED, linear_t
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


def test_cache_lives_for_one_run_only() -> None:
    x, w, b = _data()
    with torch.no_grad():
        assert TRANSPOSED(w) is not TRANSPOSED(w)  # outside a run: a fresh copy each call
        with TRANSPOSED.run():
            first = linear_t(x, w, b)
            assert TRANSPOSED(w) is TRANSPOSED(w)  # reused by every batch of the run
            with TRANSPOSED.run():  # a nested run shares the outer one's entries
                assert TRANSPOSED(w) is TRANSPOSED(w)
            c = TRANSPOSED(w, 5)
            assert torch.equal(c, w[:, 5:].t()) and c.is_contiguous()
        assert TRANSPOSED.entries is None
        w.mul_(2.0)
        with TRANSPOSED.run():
            second = linear_t(x, w, b)
    torch.testing.assert_close(second - b, 2.0 * (first - b), rtol=1e-4, atol=1e-3)


def test_inference_after_a_fused_adam_step_uses_the_new_weights() -> None:
    """torch's fused Adam updates parameters without moving their version counter, so a
    W^T cached across runs (keyed by ``_version``) would make the next inference run read
    the old weights (it did: the DDP test's evaluation loss drifted by 1.5e-4)."""
    from edbatch.executor import init_params
    from edbatch.executor.torch_executor import execute
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm", embed_dim=16, hidden_dim=8)
    graph = next(iter(wl.batches("dev", 4, limit=1)))
    params = dict(init_params(wl, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        execute(graph, params=params)
    opt = torch.optim.Adam(params.values(), lr=0.1, fused=True)
    for p in params.values():
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        after = execute(graph, params=params).loss
        fresh = execute(graph, params={k: v.detach().clone() for k, v in params.items()}).loss
    assert torch.equal(after, fresh)


def test_fast_tanh_keeps_the_old_floats() -> None:
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(FAST_TANH_MIN // 100 + 3, 100, generator=gen, dtype=dtype) * 4
        old = torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)  # the formula before the change
        assert torch.equal(fast_tanh(x), old)
        assert torch.equal(fast_tanh(x.clone().requires_grad_()).detach(), old)
        torch.testing.assert_close(fast_tanh(x), torch.tanh(x), rtol=0, atol=1e-6)


def test_parser_transition_scores_multiply_by_the_runs_cached_transposes() -> None:
    """The parser's decoding MLP (``cells_parser.transition_scores``) takes each weight's
    ``W^T`` from the run's cache (one copy per run, not per round), gives ``F.linear``'s
    values and, with weights that need gradients, every gradient."""
    from edbatch.executor.cells_parser import transition_scores
    gen = torch.Generator().manual_seed(1)
    feats = [torch.randn(9, 6, generator=gen, dtype=torch.float64) for _ in range(4)]
    w_h, b_h = torch.randn(5, 24, generator=gen, dtype=torch.float64), torch.zeros(5).double()
    w_o, b_o = torch.randn(7, 5, generator=gen, dtype=torch.float64), torch.ones(7).double()
    want = F.linear(torch.tanh(F.linear(torch.cat(feats, 1), w_h, b_h)), w_o, b_o)
    with torch.no_grad(), TRANSPOSED.run():
        got = transition_scores(feats, w_h, b_h, w_o, b_o)
        assert TRANSPOSED.entries is not None
        assert {k[0] for k in TRANSPOSED.entries} == {id(w_h), id(w_o)}
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    params = [t.clone().requires_grad_() for t in (w_h, b_h, w_o, b_o)]
    transition_scores(feats, *params).square().sum().backward()
    ref = [t.clone().requires_grad_() for t in (w_h, b_h, w_o, b_o)]
    F.linear(torch.tanh(F.linear(torch.cat(feats, 1), ref[0], ref[1])), ref[2],
             ref[3]).square().sum().backward()
    for a, b in zip(params, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10)
