"""Helpers shared by the executor tests."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from edbatch.executor import _fast_chain, _fast_lstm, init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload

#: Workloads with hoisted LSTM cell kinds that chain (the char tagger's two LSTMs have two widths).
CHAINED = ("bilstm_tagger", "bilstm_char_tagger", "lattice_lstm", "seq2seq", "transition_parser")
#: Marks a module whose chains call torch's BLAS from numba.
needs_blas = pytest.mark.skipif(not _fast_chain.AVAILABLE,
                                reason="torch's sgemm_/dgemm_ not reachable from numba")


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[int]:
    """Patch ``cls.__call__`` to count its calls (a short path's batches); ``[count]``."""
    count = [0]
    real = cls.__call__

    def counted(self: object, *args: object) -> None:
        count[0] += 1
        real(self, *args)
    monkeypatch.setattr(cls, "__call__", counted)
    return count


def short_outputs(name: str, dtype: torch.dtype, short: bool, *, fused: bool | None = None,
                  grad: bool = False, strategy: str = "naive",
                  scheduler: str = "critical_path", params: dict[str, Tensor] | None = None,
                  instances: int = 6, chains: bool = True, hidden: int = 5
                  ) -> dict[int, Tensor]:
    """Every output of a test mini-batch of ``instances`` of workload ``name`` (cell
    granularity, ``hidden`` units), with the executor's short paths on or off (``short``)
    and, with them, hoisted LSTM runs chained or one batch a call (``chains``)."""
    wl = make_workload(name, granularity="cell",
                       **WORKLOADS[name].test_kwargs(dim=6, hidden=hidden, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(instances))
    schedule = make_scheduler(scheduler)(graph)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    if params is None:
        params = init_params(wl, torch.Generator().manual_seed(3), dtype=dtype)
    old, _fast_lstm.ENABLED[0] = _fast_lstm.ENABLED[0], short
    chained, _fast_chain.ENABLED[0] = _fast_chain.ENABLED[0], chains
    try:
        result = TorchExecutor(dtype=dtype, fused=fused).run(graph, schedule, plan, params,
                                                              grad=grad)
    finally:
        _fast_lstm.ENABLED[0], _fast_chain.ENABLED[0] = old, chained
    return {k: v.detach() for k, v in result.outputs.items()}


def check_short_path(name: str, dtype: torch.dtype, taken: list[int],
                     atol: float | None = None, **kwargs: object) -> None:
    """Run :func:`short_outputs` with the short path and without: it ran only when on (its
    batches counted in ``taken``), and every output equals the kernels' (``atol`` ``None``:
    bit for bit, else within ``atol``)."""
    short = short_outputs(name, dtype, True, **kwargs)  # type: ignore[arg-type]
    assert taken[0] > 0  # the short path ran
    used = taken[0]
    general = short_outputs(name, dtype, False, **kwargs)  # type: ignore[arg-type]
    assert taken[0] == used  # switched off: the kernels only
    assert short.keys() == general.keys()
    for k in short:
        if atol is None:
            assert torch.equal(short[k], general[k]), f"output of node {k} differs"
        else:
            torch.testing.assert_close(short[k], general[k], rtol=0, atol=atol,
                                       msg=f"output of node {k} differs")



def read_key(read: object) -> tuple[object, ...]:
    """A program read as comparable values (its class and every field)."""
    fields = [getattr(read, n) for n in ("b", "lo", "hi", "cols") if hasattr(read, n)]
    idx = getattr(read, "idx", None)
    return (type(read).__name__, *fields, None if idx is None else idx.tolist(),
            getattr(read, "pieces", None))


def assert_same_steps(got: object, want: object) -> None:
    """Two programs' ``steps`` equal step by step: fields, attrs and reads."""
    got, want = list(got), list(want)  # type: ignore[call-overload]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.op, a.kernel, a.size, a.width, a.out_arena, a.out_start, a.split,
                a.stacked, a.writes_out) == (b.op, b.kernel, b.size, b.width, b.out_arena,
                                             b.out_start, b.split, b.stacked, b.writes_out)
        assert torch.equal(a.attrs, b.attrs)
        assert [read_key(r) for r in a.reads] == [read_key(r) for r in b.reads]
