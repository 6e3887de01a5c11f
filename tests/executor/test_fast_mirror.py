"""Projection operands written by the chains that make them (``edbatch.executor._fast_mirror``):
every arena of a run bit-identical to the gathering projections' (the oracle: mirrors off),
fp32 and fp64, both memory strategies, tiny and realistic widths; taken exactly where it
applies, falling back to the gather where it does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _chain_train, _fast_chain, _fast_lstm, _fast_mirror, init_params
from edbatch.executor._fast_mirror import MirroredProjection
from edbatch.executor._head_reads import HeadPairRead
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload
from tests.executor.conftest import CHAINED, count_calls, needs_blas

pytestmark = needs_blas


@pytest.fixture
def mirrored(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the mirrored projections run."""
    return count_calls(monkeypatch, MirroredProjection)


def _setup(name: str, dtype: torch.dtype, strategy: str = "naive", hidden: int = 5,
           instances: int = 6) -> tuple[TorchExecutor, object, dict[str, Tensor]]:
    wl = make_workload(name, granularity="cell",
                       **WORKLOADS[name].test_kwargs(dim=6, hidden=hidden, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(instances))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    executor = TorchExecutor(dtype=dtype)
    program, _ = executor._program(graph, schedule, plan)
    return executor, program, init_params(wl, torch.Generator().manual_seed(3), dtype=dtype)


def _arenas(executor: TorchExecutor, program: object, params: dict[str, Tensor],
            mirrors: bool, chains: bool = True) -> list[Tensor]:
    old = _fast_chain.ENABLED[0]
    _fast_chain.ENABLED[0] = chains
    try:
        with torch.no_grad():
            return executor._run_inplace(program, params)  # type: ignore[arg-type]
    finally:
        _fast_chain.ENABLED[0] = old


def _program(name: str, dtype: torch.dtype, mirrors: bool, **kwargs: object
             ) -> tuple[TorchExecutor, object, dict[str, Tensor]]:
    old, _fast_mirror.ENABLED[0] = _fast_mirror.ENABLED[0], mirrors
    try:
        return _setup(name, dtype, **kwargs)  # type: ignore[arg-type]
    finally:
        _fast_mirror.ENABLED[0] = old


def _equal(got: list[Tensor], want: list[Tensor]) -> None:
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"arena {k} differs"


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hidden", [5, 40])
def test_mirrored_projections_are_bit_identical(dtype: torch.dtype, strategy: str,
                                                hidden: int, mirrored: list[int]) -> None:
    executor, program, params = _program("bilstm_tagger", dtype, True, strategy=strategy,
                                         hidden=hidden)
    got = _arenas(executor, program, params, True)
    assert mirrored[0] == 2  # both layer-2 projections read their mirror
    ex2, reference, params2 = _program("bilstm_tagger", dtype, False, strategy=strategy,
                                       hidden=hidden)
    assert not any(type(e) is MirroredProjection for e in reference.chained)  # type: ignore[attr-defined]
    _equal(got, _arenas(ex2, reference, params2, False))
    assert mirrored[0] == 2
    _equal(got, _arenas(executor, program, params, True, chains=False))  # its own steps
    assert mirrored[0] == 2  # chains off: the gathering projection steps, not the mirror


@pytest.mark.parametrize("name", CHAINED)
def test_every_chained_workload_is_unchanged(name: str) -> None:
    executor, program, params = _program(name, torch.float32, True)
    ex2, reference, params2 = _program(name, torch.float32, False)
    _equal(_arenas(executor, program, params, True), _arenas(ex2, reference, params2, False))


def test_mirrors_stand_for_the_pair_gathers_rows() -> None:
    """Mirror row ``k`` is gathered row ``k``: the chain's copies plus the rows it does not
    make (the first forward batch runs alone, before the backward projection step)."""
    executor, program, params = _program("bilstm_tagger", torch.float64, True)
    entries = [(q, e) for q, e in enumerate(program.chained)  # type: ignore[attr-defined]
               if type(e) is MirroredProjection]
    assert len(entries) == 2
    arenas = _arenas(executor, program, params, True)
    for q, entry in entries:
        read = program.steps[q].reads[0]  # type: ignore[attr-defined]
        assert type(read) is HeadPairRead
        assert entry.rows == len(read.idx) and entry.width == 2 * entry.cols
        assert 0 < len(entry.src) < entry.rows // 4  # a few rows left to the entry
        assert np.array_equal(entry.src, read.idx.numpy()[entry.dst])
        chain = program.chained[5]  # type: ignore[attr-defined]
        slot = [m[0] for m in chain.mirrors].index(entry.key)
        copied = chain.copies[chain.copies[:, 1] == slot, 2]
        assert sorted([*copied.tolist(), *entry.dst.tolist()]) == list(range(entry.rows))
        assert torch.equal(read(arenas).reshape(-1, entry.cols),
                           arenas[read.b][read.idx, :entry.cols])


def test_a_chain_past_its_mirror_slots_leaves_the_projection_gathering(
        monkeypatch: pytest.MonkeyPatch, mirrored: list[int]) -> None:
    monkeypatch.setattr(_fast_mirror, "MIRRORS", 1)
    executor, program, params = _program("bilstm_tagger", torch.float32, True)
    kinds = [type(e).__name__ for e in program.chained  # type: ignore[attr-defined]
             if type(e) is MirroredProjection]
    assert kinds == ["MirroredProjection"]  # the first; the second gathers
    got = _arenas(executor, program, params, True)
    assert mirrored[0] == 1
    ex2, reference, params2 = _program("bilstm_tagger", torch.float32, False)
    _equal(got, _arenas(ex2, reference, params2, False))


def test_no_mirrors_without_chains(mirrored: list[int]) -> None:
    old, _fast_lstm.ENABLED[0] = _fast_lstm.ENABLED[0], False
    try:
        executor, program, params = _program("bilstm_tagger", torch.float32, True)
        _arenas(executor, program, params, True)
    finally:
        _fast_lstm.ENABLED[0] = old
    assert mirrored[0] == 0


def _train(dtype: torch.dtype, mirrors: bool, strategy: str = "naive", hidden: int = 5
           ) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss and parameter gradients of a training run (its program built with the
    mirrors on or off)."""
    old, _fast_mirror.ENABLED[0] = _fast_mirror.ENABLED[0], mirrors
    try:
        wl = make_workload("bilstm_tagger", granularity="cell", **WORKLOADS[
            "bilstm_tagger"].test_kwargs(dim=6, hidden=hidden, short=True))
        graph = wl.minibatch(wl.default_eval_split, range(6))
        schedule = make_scheduler("critical_path")(graph)
        plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
        params = {k: v.requires_grad_() for k, v in
                  init_params(wl, torch.Generator().manual_seed(3), dtype=dtype).items()}
        res = TorchExecutor(dtype=dtype).run(graph, schedule, plan, params, grad=True)
        assert res.loss is not None
        res.loss.backward()
    finally:
        _fast_mirror.ENABLED[0] = old
    return res.loss.detach(), {k: v.grad.to_dense() for k, v in params.items()
                               if v.grad is not None}


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_training_with_mirrors_is_bit_identical(dtype: torch.dtype, strategy: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    taken = count_calls(monkeypatch, _chain_train._Projection)
    loss, grads = _train(dtype, True, strategy)
    assert taken[0] == 2  # both layer-2 projections, saving the mirror as their input
    ref_loss, ref_grads = _train(dtype, False, strategy)
    assert taken[0] == 2
    assert torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys()
    for k in grads:
        assert torch.equal(grads[k], ref_grads[k]), f"gradient of {k} differs"


def test_training_gathers_where_a_feeding_chain_runs_batch_by_batch(
        monkeypatch: pytest.MonkeyPatch, mirrored: list[int]) -> None:
    """A chain that training leaves to its kernels writes no mirror: its projections
    gather (here every chain: their weights are not contiguous)."""
    monkeypatch.setattr(_chain_train, "_hidden", lambda *args: None)
    loss, grads = _train(torch.float64, True)
    assert mirrored[0] == 0
    ref_loss, ref_grads = _train(torch.float64, False)
    assert torch.equal(loss, ref_loss)
    for k in grads:
        assert torch.equal(grads[k], ref_grads[k])


def test_a_failing_mirrored_projection_raises_execution_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    executor, program, params = _program("bilstm_tagger", torch.float32, True)
    q = next(q for q, e in enumerate(program.chained)  # type: ignore[attr-defined]
             if type(e) is MirroredProjection)
    entry = program.chained[q]  # type: ignore[attr-defined]
    monkeypatch.setattr(entry, "src", np.array([10 ** 6]))  # past the arena's rows
    monkeypatch.setattr(entry, "dst", np.array([0]))
    with pytest.raises(ExecutionError, match="projection of mirrored rows.*IndexError"):
        _arenas(executor, program, params, True)


def test_off_by_default_the_projections_gather() -> None:
    _, program, _ = _setup("bilstm_tagger", torch.float32)
    assert not any(type(e) is MirroredProjection for e in program.chained)  # type: ignore[attr-defined]
    assert all(not c.mirrors for c in program.chained  # type: ignore[attr-defined]
               if type(c) is _fast_chain.ChainStep)
