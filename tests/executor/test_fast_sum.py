"""The in-place executor's short path for ``k``-ary sum batches
(``edbatch.executor._fast_sum``): bit-identical to the ``sum`` kernel on real lattice graphs
(every output, fp32 and fp64), taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.executor import _fast_chain, _fast_sum
from edbatch.executor._fast_sum import sum_rows
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import check_short_path, count_calls, short_outputs


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the short path's batches."""
    return count_calls(monkeypatch, _fast_sum.FastSumStep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("strategy", "scheduler"),
                         [("naive", "critical_path"), ("planned", "depth"),
                          ("naive", "dynet_agenda")])
def test_short_path_is_bit_identical(strategy: str, scheduler: str, dtype: torch.dtype,
                                     taken: list[int]) -> None:
    """One call per sum batch (chains off)."""
    check_short_path("lattice_lstm", dtype, taken, strategy=strategy, scheduler=scheduler,
                     chains=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("strategy", "scheduler"),
                         [("naive", "critical_path"), ("planned", "depth")])
def test_chained_sums_are_bit_identical(strategy: str, scheduler: str, dtype: torch.dtype,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sum batches between hoisted LSTM batches run inside their chain (no sum batch
    left a call of its own where chains are on), with the kernels' outputs."""
    chains = count_calls(monkeypatch, _fast_chain.ChainStep)
    check_short_path("lattice_lstm", dtype, chains, strategy=strategy, scheduler=scheduler)
    wl = make_workload("lattice_lstm", granularity="cell",
                       **WORKLOADS["lattice_lstm"].test_kwargs(dim=6, hidden=5, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(6))
    schedule = make_scheduler(scheduler)(graph)
    program, _ = TorchExecutor()._program(graph, schedule,
                                          plan_memory(graph, schedule, strategy))  # type: ignore[arg-type]
    kinds = [int(k) for e in program.chained if type(e) is _fast_chain.ChainStep
             for k in e.meta[:, 0]]
    sums = sum(1 for s in program.steps if s.op.kind == "sum" and s.op.arity)
    assert kinds.count(2) > 0 and kinds.count(2) + sum(
        1 for e in program.chained if type(e) is _fast_sum.FastSumStep) == sums


@pytest.mark.parametrize("kwargs", [{"fused": False}, {"grad": True}])
def test_short_path_only_where_it_applies(kwargs: dict[str, bool], taken: list[int]) -> None:
    """Unfused runs and training runs take the kernel; so does a Tree-LSTM graph's
    variadic ``loss_sum`` (no fixed arity)."""
    short_outputs("lattice_lstm", torch.float64, True, **kwargs)  # type: ignore[arg-type]
    short_outputs("tree_lstm", torch.float64, True)
    assert taken[0] == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_sum_rows_adds_left_to_right_in_place(dtype: type, k: int) -> None:
    """``sum_rows`` over rows of several arenas equals torch's ``add`` then ``add_`` on
    gathered copies, bit for bit, and writes only its output rows."""
    rng = np.random.default_rng(k)
    arenas = [(rng.standard_normal((9, 6)) * 10.0 ** rng.integers(-3, 4, (9, 6))).astype(dtype)
              for _ in range(3)]
    n = 5
    which = rng.integers(0, 3, k).astype(np.int64)
    idx = rng.integers(0, 9, (k, n)).astype(np.int64)
    want = torch.from_numpy(arenas[which[0]][idx[0]]) + torch.from_numpy(arenas[which[1]][idx[1]])
    for q in range(2, k):
        want.add_(torch.from_numpy(arenas[which[q]][idx[q]]))
    out = rng.standard_normal((9, 6)).astype(dtype)
    before = out.copy()
    sum_rows([*arenas, out], which, idx, 3, 3)  # out: rows 3:8 of the fourth arena
    np.testing.assert_array_equal(out[3:8], want.numpy())
    np.testing.assert_array_equal(out[:3], before[:3])
    np.testing.assert_array_equal(out[8:], before[8:])
