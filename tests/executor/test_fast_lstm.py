"""The in-place executor's short path for hoisted LSTM batches
(``edbatch.executor._fast_lstm``): bit-identical to the general kernel path on real workload
graphs (every output, fp32 and fp64), taken exactly where it applies. Runs of batches as one
call (``_fast_chain``) are off here: ``test_fast_chain.py`` compares them with this path."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fast_lstm, _fused
from tests.executor.conftest import check_short_path, count_calls, short_outputs

#: Workloads with hoisted LSTM cell kinds (``cells_hoist.HOISTS``).
HOISTED = ("bilstm_tagger", "lattice_lstm", "seq2seq", "transition_parser")


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the short path's batches."""
    return count_calls(monkeypatch, _fast_lstm.FastStep)


def _outputs(name: str, dtype: torch.dtype, short: bool, **kwargs: object) -> dict[int, Tensor]:
    """4 instances, chains off: the per-batch short path against the kernels."""
    return short_outputs(name, dtype, short, instances=4, chains=False,  # type: ignore[arg-type]
                         **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", HOISTED)
def test_short_path_is_bit_identical(name: str, dtype: torch.dtype, taken: list[int]) -> None:
    strategy = "planned" if name == "lattice_lstm" else "naive"  # gathered states too
    check_short_path(name, dtype, taken, strategy=strategy, instances=4, chains=False)


@pytest.mark.parametrize("kwargs", [{"fused": False}, {"grad": True}])
def test_short_path_only_where_it_applies(kwargs: dict[str, bool], taken: list[int]) -> None:
    """Unfused runs and training runs (which save for the backward) take the kernels."""
    _outputs("bilstm_tagger", torch.float64, True, **kwargs)  # type: ignore[arg-type]
    assert taken[0] == 0


def test_qualifies_needs_cpu_float_arenas_without_autograd() -> None:
    arena = torch.zeros(3, 4)
    with torch.no_grad():
        assert _fast_lstm.qualifies([arena])
        assert not _fast_lstm.qualifies([arena.to(torch.float16)])
        assert not _fast_lstm.qualifies([])
    assert not _fast_lstm.qualifies([arena])  # grad mode on


@pytest.mark.parametrize("short", [True, False])
def test_a_failing_batch_raises_execution_error_on_both_paths(
        short: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The short path names a failing batch as the kernel path does."""

    def broken(*args: object) -> None:
        raise ValueError("boom")
    monkeypatch.setattr(_fused, "_lstm_fwd", broken)
    with pytest.raises(ExecutionError, match="boom"):
        _outputs("bilstm_tagger", torch.float32, short)
