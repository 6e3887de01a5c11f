"""Runs of hoisted LSTM batches as one compiled call (``edbatch.executor._fast_chain``):
bit-identical to the per-batch short path (``_fast_lstm``, itself bit-identical to the
kernels) on real workload graphs, fp32 and fp64, sliced and gathered states; taken exactly
where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fast_blas, _fast_chain, _fast_lstm
from edbatch.executor._reads import RowsRead, SliceRead
from tests.executor.conftest import CHAINED, count_calls, needs_blas, short_outputs

HOISTED = CHAINED
pytestmark = needs_blas


@pytest.fixture
def chains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the chained runs."""
    return count_calls(monkeypatch, _fast_chain.ChainStep)


@pytest.fixture
def single(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the per-batch short path's batches."""
    return count_calls(monkeypatch, _fast_lstm.FastStep)


def _outputs(name: str, dtype: torch.dtype, chained: bool, *, strategy: str = "naive",
             grad: bool = False, hidden: int = 5) -> dict[int, Tensor]:
    return short_outputs(name, dtype, True, chains=chained, strategy=strategy, grad=grad,
                         hidden=hidden)


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", HOISTED)
def test_chains_are_bit_identical(name: str, dtype: torch.dtype, strategy: str,
                                  chains: list[int], single: list[int]) -> None:
    chained = _outputs(name, dtype, True, strategy=strategy)
    ran = chains[0]
    if name in ("bilstm_tagger", "bilstm_char_tagger", "transition_parser"):
        assert ran > 0  # whole layers of time steps back to back
    alone = single[0]
    reference = _outputs(name, dtype, False, strategy=strategy)
    assert chains[0] == ran  # switched off: one short step per batch
    assert single[0] > alone
    assert chained.keys() == reference.keys()
    for k in chained:
        assert torch.equal(chained[k], reference[k]), f"output of node {k} differs"


def test_chains_at_realistic_width(chains: list[int]) -> None:
    """H = 40: the BLAS call's blocked code paths, not only its tiny-matrix ones."""
    chained = _outputs("bilstm_tagger", torch.float32, True, hidden=40)
    assert chains[0] > 0
    reference = _outputs("bilstm_tagger", torch.float32, False, hidden=40)
    for k in chained:
        assert torch.equal(chained[k], reference[k])


def test_training_takes_no_chain(chains: list[int]) -> None:
    _outputs("bilstm_tagger", torch.float64, True, grad=True)
    assert chains[0] == 0


def test_a_failing_chain_raises_execution_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise ValueError("boom")
    monkeypatch.setattr(_fast_chain, "_chain", broken)
    with pytest.raises(ExecutionError, match="hoisted LSTM chain.*boom"):
        _outputs("bilstm_tagger", torch.float32, True)


def _step(arena: int, state: int, weight: str, gathered: bool = False) -> _fast_lstm.FastStep:
    read = RowsRead(state, torch.zeros(2, dtype=torch.int64)) if gathered else \
        SliceRead(state, 0, 2)
    return _fast_lstm.FastStep(read, arena, 0, 2, state, 2, weight, 3)


def test_runs_are_cut_at_other_steps_and_at_the_slot_limit() -> None:
    steps = [_step(1, 0, "w"), _step(1, 0, "w", True), None, _step(1, 0, "w"),
             _step(2, 0, "v"), _step(3, 0, "v")]
    assert _fast_chain._runs(steps) == [[0, 1], [3, 4, 5]]
    many = [_step(k, 0, "w") for k in range(1, _fast_chain.SLOTS + 2)]
    assert _fast_chain._runs(many) == [list(range(_fast_chain.SLOTS - 1)),
                                       list(range(_fast_chain.SLOTS - 1, len(many)))]
    weights = [_step(1, 0, f"w{k}") for k in range(_fast_chain.SLOTS + 1)]
    assert [len(r) for r in _fast_chain._runs(weights)] == [_fast_chain.SLOTS]  # a lone one


def test_chain_step_layout() -> None:
    steps = [_step(4, 1, "w"), _step(4, 1, "w", True)]
    chain = _fast_chain.ChainStep(steps, [1, 4], ["w"])
    assert chain.meta.tolist() == [[0, 0, 0, 2, 1, 0, 0, 2, 0, 3],
                                   [1, 0, 0, 2, 1, 0, 0, 2, 0, 3]]
    assert np.array_equal(chain.idx, [0, 0])
    assert (chain.rows, chain.width) == (2, 3)


def test_the_blas_call_agrees_with_addmm() -> None:
    """The bound ``?gemm`` (LP64 or ILP64 alike: int64 slots) equals ``addmm_`` bit for bit."""
    assert _fast_chain.agrees()
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(1)
        state, w, proj = (torch.randn(*s, generator=gen, dtype=dtype)
                          for s in ((7, 18), (9, 36), (7, 36)))
        ref, mine = proj.clone().addmm_(state.narrow(1, 0, 9), w), proj.clone()
        _fast_blas._gemm_once(mine.numpy(), state.numpy(), w.numpy(), _fast_blas._ints(),
                              np.ones(1, mine.numpy().dtype))
        assert torch.equal(ref, mine)


def test_no_chains_where_the_blas_call_disagrees(monkeypatch: pytest.MonkeyPatch,
                                                 chains: list[int]) -> None:
    monkeypatch.setattr(_fast_blas, "_AGREES", [False])
    _outputs("bilstm_tagger", torch.float32, True)
    assert chains[0] == 0


def _setup_loop(rows: list, arenas: list[int], weights: list[str]) -> dict:  # type: ignore[type-arg]
    """The loop over the rows that :meth:`ChainStep._setup` replaced (its column-wise form's
    oracle): meta, idx, rows, width, name, binders."""
    slot = {a: k for k, a in enumerate(arenas)}
    wslot = {w: k for k, w in enumerate(weights)}
    meta, gathered = [], []
    at = most = width = 0
    names: set[str] = set()
    binders: dict[str, int] = {}
    for row in rows:
        names.add(row[-1])
        if row[0] == 2:
            _, srcs, rows_, n, oa, os_, _ = row
            meta.append((2, len(srcs), at, n, 0, 0, slot[oa], os_, 0, 0))
            gathered += [np.array([slot[a] for a in srcs], np.int64), rows_.reshape(-1)]
            at += len(srcs) * (n + 1)
            continue
        kind, sb, s0, idx, n, pa, lo, oa, os_, weight, hidden, _ = row
        most, width = max(most, n), max(width, hidden)
        binders[weight] = binders.pop(weight, hidden)
        meta.append((kind, slot[sb], at if kind else s0, n, slot[pa], lo, slot[oa], os_,
                     wslot[weight], hidden))
        if kind:
            gathered.append(idx)
            at += n
    return {"meta": np.array(meta, np.int64).reshape(len(rows), _fast_chain._META),
            "idx": np.concatenate(gathered) if gathered else np.zeros(1, np.int64),
            "rows": most, "width": width, "name": ", ".join(sorted(names)),
            "binders": tuple(reversed(binders.items()))}


@pytest.mark.parametrize("strategy", ["naive", "planned"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "transition_parser"])
def test_column_wise_setup_equals_the_loop(name: str, strategy: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chain of real programs (sliced and gathered states, lattice sums between
    them) laid out column-wise as the per-row loop lays it out."""
    made: list[tuple[_fast_chain.ChainStep, tuple]] = []  # type: ignore[type-arg]
    real = _fast_chain.ChainStep.of_rows.__func__  # type: ignore[attr-defined]

    def recorded(cls: type, rows: list, arenas: list[int], weights: list[str]) -> object:  # type: ignore[type-arg]
        chain = real(cls, rows, arenas, weights)
        made.append((chain, (list(rows), list(arenas), list(weights))))
        return chain
    monkeypatch.setattr(_fast_chain.ChainStep, "of_rows", classmethod(recorded))
    _outputs(name, torch.float64, True, strategy=strategy)
    assert made
    kinds = set()
    for chain, args in made:
        want = _setup_loop(*args)
        kinds.update(int(k) for k in want["meta"][:, 0])
        assert np.array_equal(chain.meta, want["meta"])
        assert np.array_equal(chain.idx, want["idx"])
        assert (chain.rows, chain.width, chain.name, chain.binders) == \
            (want["rows"], want["width"], want["name"], want["binders"])
    if name == "lattice_lstm":
        assert 2 in kinds  # sums between the arc batches


def _key_runs_loop(keys: list) -> list[list[int]]:  # type: ignore[type-arg]
    """:func:`_fast_chain._key_runs` without its repeated-key shortcut (the oracle)."""
    out: list[list[int]] = []
    run: list[int] = []
    arenas: set[int] = set()
    weights: set[str] = set()
    for i, key in enumerate(keys):
        if key is None:
            if run:
                out.append(run)
            run = []
            continue
        if not run:
            arenas, weights = set(), set()
        used, weight = key
        arenas.update(used)
        if len(arenas) > _fast_chain.SLOTS or (weight is not None and weight not in weights
                                               and len(weights) == _fast_chain.SLOTS):
            out.append(run)
            run, arenas, weights = [], set(used), set()
        run.append(i)
        if weight is not None:
            weights.add(weight)
    if run:
        out.append(run)
    return [r for r in out if len(r) > 1 and any(keys[i][1] is not None for i in r)]


def test_key_runs_equal_the_plain_loop() -> None:
    """Random keys with long repeats, sums (weight None), gaps and too many arenas."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        keys: list = []  # type: ignore[type-arg]
        while len(keys) < 60:
            pick = rng.integers(5)
            key = None if pick == 0 else (
                tuple(int(a) for a in rng.integers(0, 12, rng.integers(1, 11))),
                None if pick == 1 else f"w{rng.integers(10)}")
            keys += [key] * int(rng.integers(1, 6))
        assert _fast_chain._key_runs(keys) == _key_runs_loop(keys)
