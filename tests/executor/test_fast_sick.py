"""The in-place executor's short path for child-sum Tree-LSTM batches
(``edbatch.executor._fast_sick``): equal to the general kernel path on real SICK graphs
(float64 to 1e-10, float32 to a few 1e-7: ``f_k``'s pre-activation is summed in another
order), taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fast_sick, _fused_sick, init_params
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import check_short_path, count_calls, short_outputs

_NAME = "tree_lstm_sick"


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the short path's batches."""
    return count_calls(monkeypatch, _fast_sick.FastSickStep)


def _outputs(dtype: torch.dtype, short: bool, **kwargs: object) -> dict[int, Tensor]:
    return short_outputs(_NAME, dtype, short, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.float64, 1e-10)])
@pytest.mark.parametrize(("strategy", "scheduler"),
                         [("naive", "critical_path"), ("planned", "depth"),
                          ("naive", "dynet_agenda"), ("planned", "ed_batch_agenda")])
def test_short_path_equals_the_kernels(strategy: str, scheduler: str, dtype: torch.dtype,
                                       tol: float, taken: list[int]) -> None:
    check_short_path(_NAME, dtype, taken, atol=tol, strategy=strategy, scheduler=scheduler)


@pytest.mark.parametrize("kwargs", [{"fused": False}, {"grad": True}])
def test_short_path_only_where_it_applies(kwargs: dict[str, bool], taken: list[int]) -> None:
    """Unfused runs and training runs (which save for the backward) take the kernels."""
    _outputs(torch.float64, True, **kwargs)  # type: ignore[arg-type]
    assert taken[0] == 0


def _python_rows(gw: np.ndarray, f: np.ndarray, states: np.ndarray,  # type: ignore[type-arg]
                 kids: np.ndarray, seg: np.ndarray  # type: ignore[type-arg]
                 ) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    """The oracle of ``sick_forward_rows``: ``(out, tanh(c))`` in plain numpy."""
    h = f.shape[1]
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    fc = np.zeros((gw.shape[0], h))
    for n in range(len(kids)):
        fc[seg[n]] += sig(f[n] + gw[seg[n], 3 * h:]) * states[kids[n], h:]
    c = sig(gw[:, :h]) * np.tanh(gw[:, 2 * h:3 * h]) + fc
    return np.concatenate([sig(gw[:, h:2 * h]) * np.tanh(c), c], 1), np.tanh(c)


def test_fused_rows_kernel_reads_children_in_place() -> None:
    """``sick_forward_rows`` on arena rows equals its Python oracle and ``sick_forward`` on
    gathered copies with ``W_f x`` added beforehand (to rounding)."""
    rng = np.random.default_rng(0)
    hidden, n = 4, 3
    states = rng.standard_normal((7, 2 * hidden))
    kids, seg = np.array([0, 5, 2, 6, 1]), np.array([0, 1, 2, 0, 2])  # nodes 0, 2: 2 kids
    gw = rng.standard_normal((n, 4 * hidden))
    f = rng.standard_normal((len(kids), hidden))
    want_out, want_t = _python_rows(gw, f, states, kids, seg)
    out, t = np.empty((n, 2 * hidden)), np.empty((n, hidden))
    g_torch = torch.from_numpy(gw.copy())
    f_torch = torch.from_numpy(f + gw[seg, 3 * hidden:])
    f_before = f.copy()
    _fused_sick.sick_forward_rows(gw, f, states, kids, seg, out, t)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(f, f_before)  # f is read only
    out2, t2 = torch.empty(n, 2 * hidden, dtype=torch.float64), torch.empty(n, hidden,
                                                                             dtype=torch.float64)
    _fused_sick.sick_forward(g_torch, f_torch, torch.from_numpy(states[kids]),
                        torch.from_numpy(seg), out2, t2)
    np.testing.assert_allclose(out, out2.numpy(), rtol=0, atol=1e-14)  # (fastmath: FMAs)
    np.testing.assert_allclose(gw[:, :3 * hidden], g_torch.numpy()[:, :3 * hidden], rtol=0,
                               atol=1e-14)


def test_failing_batch_names_the_short_path() -> None:
    wl = make_workload(_NAME, granularity="cell",
                       **WORKLOADS[_NAME].test_kwargs(dim=6, hidden=5, short=True))
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    name = next(k for k in params if k.endswith("U_f"))
    params[name] = params[name][:, :3]  # a wrongly shaped weight
    with pytest.raises(ExecutionError, match="child-sum Tree-LSTM short path"):
        _outputs(torch.float64, True, params=params)
