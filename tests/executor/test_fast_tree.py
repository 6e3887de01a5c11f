"""The in-place executor's short path for Tree-LSTM internal batches
(``edbatch.executor._fast_tree``): bit-identical to the general kernel path on real Tree-LSTM
graphs (every output, fp32 and fp64), taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.errors import ExecutionError
from edbatch.executor import _fast_tree, _fused, init_params
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import check_short_path, count_calls, short_outputs


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the short path's batches."""
    return count_calls(monkeypatch, _fast_tree.FastTreeStep)


_outputs = short_outputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "strategy", "scheduler"),
                         [("tree_lstm", "naive", "critical_path"),
                          ("tree_lstm", "planned", "depth"),
                          ("tree_lstm", "naive", "dynet_agenda")])
def test_short_path_is_bit_identical(name: str, strategy: str, scheduler: str,
                                     dtype: torch.dtype, taken: list[int]) -> None:
    check_short_path(name, dtype, taken, strategy=strategy, scheduler=scheduler)


@pytest.mark.parametrize("kwargs", [{"fused": False}, {"grad": True}])
def test_short_path_only_where_it_applies(kwargs: dict[str, bool], taken: list[int]) -> None:
    """Unfused runs and training runs (which save for the backward) take the kernels."""
    _outputs("tree_lstm", torch.float64, True, **kwargs)  # type: ignore[arg-type]
    assert taken[0] == 0


def test_fused_rows_kernel_reads_children_in_place() -> None:
    """``tree_forward_rows`` on arena rows equals ``tree_forward`` on gathered copies."""
    rng = np.random.default_rng(0)
    hidden, n = 4, 3
    states = rng.standard_normal((7, 2 * hidden))
    left, right = np.array([0, 5, 2]), np.array([6, 1, 2])
    g = rng.standard_normal((n, 3 * hidden))
    f1, f2 = rng.standard_normal((n, hidden)), rng.standard_normal((n, hidden))
    out, t = np.empty((n, 2 * hidden)), np.empty((n, hidden))
    want_g = torch.from_numpy(g.copy())
    want_out = torch.empty(n, 2 * hidden, dtype=torch.float64)
    want_t = torch.empty(n, hidden, dtype=torch.float64)
    kids = (torch.from_numpy(f1.copy()), torch.from_numpy(states[left]),
            torch.from_numpy(f2.copy()), torch.from_numpy(states[right]))
    _fused.tree_forward(want_g, kids, want_out, want_t)
    _fused.tree_forward_rows(g, f1, f2, states, left, right, out, t)
    np.testing.assert_array_equal(out, want_out.numpy())
    np.testing.assert_array_equal(t, want_t.numpy())
    np.testing.assert_array_equal(g, want_g.numpy())


def test_failing_batch_names_the_short_path() -> None:
    wl = make_workload("tree_lstm", granularity="cell",
                       **WORKLOADS["tree_lstm"].test_kwargs(dim=6, hidden=5, short=True))
    params = init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64)
    name = next(k for k in params if k.endswith("U_f1"))
    params[name] = params[name][:, :3]  # a wrongly shaped weight
    with pytest.raises(ExecutionError, match="Tree-LSTM short path"):
        _outputs("tree_lstm", torch.float64, True, params=params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_pairs_equals_index_select_of_interleaved_rows(dtype: type) -> None:
    """``gather_pairs`` gives what the ``index_select`` of the children's rows interleaved
    (``left[0], right[0], left[1], ...``) from the arena's ``h`` columns, viewed as
    ``[n, 2H]``, gave before it (the oracle), bit for bit."""
    from edbatch.executor._fast_tree import gather_pairs

    rng = np.random.default_rng(0)
    hidden = 5
    states = rng.standard_normal((40, 2 * hidden)).astype(dtype)
    for n in (0, 1, 7, 64):
        left, right = rng.integers(0, 40, n), rng.integers(0, 40, n)
        pair = torch.from_numpy(np.stack([left, right], 1).reshape(-1))
        want = torch.from_numpy(states).narrow(1, 0, hidden).index_select(0, pair)
        out = np.full((n, 2 * hidden), np.nan, dtype)
        gather_pairs(states, left, right, hidden, out)
        np.testing.assert_array_equal(out, want.view(n, 2 * hidden).numpy())
