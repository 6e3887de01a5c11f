"""Chains of hoisted LSTM batches in training (``edbatch.executor._chain_train``): the loss
and every parameter gradient bit-identical to the per-batch kernels and backwards (the old
path, ``ENABLED`` off) on real workload graphs, fp32 and fp64, both memory strategies, sliced
and gathered states; taken exactly where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _chain_train, _fast_blas, _fast_chain, init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import CHAINED, count_calls, needs_blas

HOISTED = CHAINED
pytestmark = needs_blas


@pytest.fixture
def chains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the training chains' forward calls."""
    return count_calls(monkeypatch, _chain_train._Chain)


def _train(name: str, dtype: torch.dtype, chained: bool, *, strategy: str = "naive",
           hidden: int = 5, sparse: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss and the parameter gradients of one training run (chains on or off)."""
    wl = make_workload(name, granularity="cell",
                       **WORKLOADS[name].test_kwargs(dim=6, hidden=hidden, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(6))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    params = {k: v.requires_grad_() for k, v in
              init_params(wl, torch.Generator().manual_seed(3), dtype=dtype).items()}
    old, _chain_train.ENABLED[0] = _chain_train.ENABLED[0], chained
    try:
        res = TorchExecutor(dtype=dtype, sparse_grads=sparse).run(graph, schedule, plan,
                                                                  params, grad=True)
        assert res.loss is not None
        res.loss.backward()
    finally:
        _chain_train.ENABLED[0] = old
    return res.loss.detach(), {k: v.grad.to_dense() for k, v in params.items()
                               if v.grad is not None}


def _same(a: tuple[Tensor, dict[str, Tensor]], b: tuple[Tensor, dict[str, Tensor]]) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), f"gradient of {k} differs"


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", HOISTED)
def test_training_chains_are_bit_identical(name: str, dtype: torch.dtype, strategy: str,
                                           chains: list[int]) -> None:
    chained = _train(name, dtype, True, strategy=strategy)
    ran = chains[0]
    if name in ("bilstm_tagger", "lattice_lstm", "transition_parser"):
        assert ran > 0
    reference = _train(name, dtype, False, strategy=strategy)
    assert chains[0] == ran  # switched off: no chain
    _same(chained, reference)


def test_training_chains_at_realistic_width(chains: list[int]) -> None:
    """H = 40 (the BLAS calls' blocked code), a lattice (gathered states, sums), sparse
    embedding gradients."""
    chained = _train("lattice_lstm", torch.float32, True, hidden=40, sparse=True)
    assert chains[0] > 0
    _same(chained, _train("lattice_lstm", torch.float32, False, hidden=40, sparse=True))


def test_the_backward_blas_call_agrees_with_mm() -> None:
    """``beta = 0``, a column block of the weight in place, into a column block, one row
    and several: equal to ``torch.mm`` bit for bit (an output's other columns untouched)."""
    assert _chain_train.agrees()
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(1)
        for rows in (1, 5, 33):
            w = torch.randn(160, 70, generator=gen, dtype=dtype)  # 4H = 160, H = 40
            b = torch.randn(rows, 160, generator=gen, dtype=dtype)
            ref = torch.full((rows, 80), 3.0, dtype=dtype)
            mine = ref.clone()
            torch.mm(b, w[:, 30:], out=ref[:, :40])
            _chain_train._mm_once(mine.numpy(), b.numpy(), w.numpy(), 30, 70, 40, 160,
                                  _fast_blas._ints(), np.ones(1, mine.numpy().dtype),
                                  np.zeros(1, mine.numpy().dtype))
            assert torch.equal(ref, mine)
            assert torch.equal(mine[:, 40:], torch.full((rows, 40), 3.0, dtype=dtype))


def test_no_training_chains_where_the_blas_call_disagrees(monkeypatch: pytest.MonkeyPatch,
                                                          chains: list[int]) -> None:
    monkeypatch.setattr(_chain_train, "_AGREES", [False])
    got = _train("lattice_lstm", torch.float64, True)
    assert chains[0] == 0
    _same(got, _train("lattice_lstm", torch.float64, False))


def test_no_training_chains_with_the_inference_chains_off(chains: list[int]) -> None:
    old, _fast_chain.ENABLED[0] = _fast_chain.ENABLED[0], False
    try:
        _train("lattice_lstm", torch.float64, True)
    finally:
        _fast_chain.ENABLED[0] = old
    assert chains[0] == 0


def _chain(hiddens: tuple[int, ...]) -> _fast_chain.ChainStep:
    rows = [(0, 0, 0, None, 2, 1, 0, 0, 2 + 2 * k, f"w{k}", h, "cell")
            for k, h in enumerate(hiddens)]
    return _fast_chain.ChainStep.of_rows(rows, [0, 1], [f"w{k}" for k in range(len(hiddens))])


def test_one_hidden_size_contiguous_weights_and_2h_wide_states() -> None:
    params = {"w0": torch.zeros(12, 7), "w1": torch.zeros(12, 7)}
    assert _chain_train._hidden(_chain((3, 3)), params, [(8, 6), (8, 12)]) == 3
    assert _chain_train._hidden(_chain((3, 4)), params, [(8, 6), (8, 12)]) is None
    assert _chain_train._hidden(_chain((3, 3)), params, [(8, 7), (8, 12)]) is None
    params["w1"] = torch.zeros(7, 12).t()
    assert _chain_train._hidden(_chain((3, 3)), params, [(8, 6), (8, 12)]) is None


def test_a_failing_training_chain_raises_execution_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise ValueError("boom")
    monkeypatch.setattr(_chain_train, "_backward", broken)
    with pytest.raises(ExecutionError, match="hoisted LSTM chain backward.*boom"):
        _train("lattice_lstm", torch.float64, True)
    monkeypatch.setattr(_chain_train, "_forward", broken)
    with pytest.raises(ExecutionError, match="hoisted LSTM chain, training.*boom"):
        _train("lattice_lstm", torch.float64, True)
