"""The in-place executor's short path for runs of hoisted LSTM batches (inference): one call.

A BiLSTM mini-batch runs its hoisted recurrent batches back to back (about 117 a layer at
300x150, the two directions alternating), each through its
:class:`~edbatch.executor._fast_lstm.FastStep`: a state read, ``addmm_`` into its projection
rows and the compiled element-wise kernel, about 50 us of Python and dispatch a batch beside
its GEMM, where packed ``nn.LSTM`` loops over time steps in C++. Here every run of two or
more consecutive such steps becomes one :class:`ChainStep`, and the whole run is **one**
compiled call (:func:`_chain`): per batch it gathers the ``h`` rows of a gathered state into
a scratch buffer laid out as the gather was (row stride ``2H``; a sliced state is read in
place), calls the BLAS ``?gemm`` that ``torch.addmm_`` calls on the CPU (``sgemm_`` /
``dgemm_`` exported by ``libtorch_cpu``, the same arguments: same floats;
:mod:`~edbatch.executor._fast_blas`) into the projection rows, and runs the element-wise
body of :func:`_fused._lstm_fwd <edbatch.executor._fused.lstm_forward>` on them, reading the
old cell state in place by row.
A lattice's ``k``-ary state sums between its arc batches
(:class:`~edbatch.executor._fast_sum.FastSumStep`) join the run as rows of their own
(:func:`~edbatch.executor._fast_sum.sum_chained`: their additions read in place), so a
lattice mini-batch's ~190 short calls become about two. Same operations on the same
operands as the per-batch short paths: bit-identical outputs
(``tests/executor/test_fast_chain.py``, ``test_fast_sum.py``, fp32 and fp64). Where that
BLAS symbol is not in the process (a torch build without it: :data:`AVAILABLE` is false)
or its product differs from ``addmm_``'s (:func:`agrees`, checked once), the steps run one
by one as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor._fast_blas import AVAILABLE, _gemm, _ints, agrees
from edbatch.executor._fast_lstm import FastStep, bind_weight
from edbatch.executor._fast_sum import FastSumStep, padded, row_sum_step, sum_chained, sum_row
from edbatch.executor._fused import _jit, _lstm_row, _sig_, _tanh_
from edbatch.executor._program import LazySteps
from edbatch.executor._reads import RowsRead, SliceRead, to_device

__all__ = ["AVAILABLE", "ENABLED", "ChainStep", "Row", "agrees", "chain_short", "row_step",
           "step_row"]

#: Whether qualifying runs of hoisted batches run as one compiled call (``[False]``: one
#: :class:`FastStep` per batch, the reference the tests compare with).
ENABLED = [True]
#: Arena and weight slots of one compiled call (a run touching more is cut in two).
SLOTS = 8
_WHOLE_ROWS = (SliceRead, RowsRead)
_META = 10  # per batch: kind, state arena, state start, n, projection arena, its start,
#             output arena, its start, weight slot, H (a sum, kind 2: k, its idx start, n;
#             output arena and start in the same columns)


@_jit
def _chain(meta, idx, arenas, weights, scratch, t, ints, one):  # type: ignore[no-untyped-def]
    for j in range(meta.shape[0]):
        kind, sb, s0, n, pa, lo = meta[j, 0], meta[j, 1], meta[j, 2], meta[j, 3], \
            meta[j, 4], meta[j, 5]
        if kind == 2:  # a k-ary sum batch between the LSTM ones (lattice states)
            sum_chained(arenas, idx, s0, sb, n, meta[j, 6], meta[j, 7])
            continue
        oa, o0, wi, h = meta[j, 6], meta[j, 7], meta[j, 8], meta[j, 9]
        state, proj, out, w = arenas[sb], arenas[pa], arenas[oa], weights[wi]
        ints[1] = n
        if kind == 0:  # a slice of the state arena: h read in place
            _gemm(proj, lo * proj.shape[1], proj.shape[1], state,
                  s0 * state.shape[1], state.shape[1], w, ints, one)
        else:  # gathered states: their h rows laid out as index_select lays out [h; c]
            for r in range(n):
                src = state[idx[s0 + r]]
                for k in range(h):
                    scratch[r * 2 * h + k] = src[k]
            _gemm(proj, lo * proj.shape[1], proj.shape[1], scratch, 0, 2 * h, w, ints,
                  one)
        for r in range(n):
            gr, orow = proj[lo + r], out[o0 + r]
            src = state[s0 + r] if kind == 0 else state[idx[s0 + r]]
            _sig_(gr[:3 * h])
            _tanh_(gr[3 * h:4 * h])
            _lstm_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], gr[3 * h:4 * h], src[h:2 * h],
                      orow[:h], orow[h:2 * h], t[:h])


#: One hoisted batch as a chain reads it: ``(gathered, state arena, state start (a slice),
#: state rows (gathered: int64) or None, n, projection arena, its start, output arena, its
#: start, weight name, H, op type name)``.
Row = tuple[int, int, int, Any, int, int, int, int, int, str, int, str]


def step_row(f: FastStep | FastSumStep) -> Any:
    """``f``'s :data:`Row` (its state a :class:`SliceRead` or :class:`RowsRead`), or a sum
    batch's :data:`~edbatch.executor._fast_sum.SumRow`."""
    if type(f) is FastSumStep:
        return sum_row(f)
    state: Any = f.state
    if type(state) is SliceRead:
        return (0, state.b, state.lo, None, f.n, f.pa, f.lo, f.oa, f.os, f.weight, f.hidden,
                f.name)
    return (1, state.b, 0, state.idx.numpy(), f.n, f.pa, f.lo, f.oa, f.os, f.weight,
            f.hidden, f.name)


def row_step(row: Row) -> FastStep:
    """The :class:`FastStep` of a :data:`Row` (its state read: a slice or a gather)."""
    kind, b, lo, idx, n, pa, plo, oa, os_, weight, hidden, name = row
    state = RowsRead(b, to_device(idx, torch.device("cpu"))) if kind else \
        SliceRead(b, lo, lo + n)
    return FastStep(state, pa, plo, n, oa, os_, weight, hidden, name)


class ChainStep:
    """Consecutive :class:`~edbatch.executor._fast_lstm.FastStep` batches ``steps`` run as
    one compiled call; ``arenas``/``weights``: the arena indices and weight names its
    slots stand for (:meth:`of_rows`: the same from the batches' :data:`Row`\\ s)."""

    __slots__ = ("arenas", "binders", "count", "idx", "meta", "name", "rows", "weights",
                 "width")

    def __init__(self, steps: Sequence[FastStep | FastSumStep], arenas: Sequence[int],
                 weights: Sequence[str]) -> None:
        self._setup([step_row(f) for f in steps], arenas, weights)

    @classmethod
    def of_rows(cls, rows: Sequence[Row], arenas: Sequence[int], weights: Sequence[str]
                ) -> ChainStep:
        """The chain of the batches ``rows`` (no :class:`FastStep` made)."""
        chain = object.__new__(cls)
        chain._setup(rows, arenas, weights)
        return chain

    def _setup(self, rows: Sequence[Row], arenas: Sequence[int], weights: Sequence[str]
               ) -> None:
        # column-wise (numpy over the rows' fields), as one loop over the rows would set
        # them (the loop: tests/executor/test_fast_chain.py's oracle)
        self.arenas, self.weights, self.count = tuple(arenas), tuple(weights), len(rows)
        slot = np.zeros(max(arenas) + 1, np.int64)
        slot[list(arenas)] = np.arange(len(arenas))
        kinds = np.fromiter([r[0] for r in rows], np.int64, len(rows))
        lstm = np.flatnonzero(kinds != 2)
        if not len(lstm):
            raise ValueError("a chain needs at least one hoisted LSTM batch; got only sums")
        meta = np.zeros((len(rows), _META), np.int64)
        used = np.zeros(len(rows), np.int64)  # each row's entries of ``idx``
        picked = [rows[j] for j in lstm.tolist()]
        _, sb, s0, _, n, pa, lo, oa, os_, weight, hidden, names = zip(*picked, strict=True)
        n_, hidden_ = np.array(n, np.int64), np.array(hidden, np.int64)
        wslot = {w: k for k, w in enumerate(weights)}
        meta[lstm] = np.stack([kinds[lstm], slot[np.array(sb, np.int64)],
                               np.array(s0, np.int64), n_, slot[np.array(pa, np.int64)],
                               np.array(lo, np.int64), slot[np.array(oa, np.int64)],
                               np.array(os_, np.int64),
                               np.array([wslot[w] for w in weight], np.int64), hidden_], 1)
        used[lstm] = np.where(kinds[lstm] == 1, n_, 0)
        all_names = set(names)
        sums = np.flatnonzero(kinds == 2)
        if len(sums):  # a sum: its operands' arena slots, then their rows [k, n]
            _, srcs, _, k_n, s_oa, s_os, s_names = zip(*[rows[j] for j in sums.tolist()])
            all_names.update(s_names)
            k = np.fromiter(map(len, srcs), np.int64, len(srcs))
            n_k = np.array(k_n, np.int64)
            meta[sums, 0], meta[sums, 1], meta[sums, 3] = 2, k, n_k
            meta[sums, 6], meta[sums, 7] = slot[np.array(s_oa, np.int64)], s_os
            used[sums] = k * (n_k + 1)
        at = np.cumsum(used) - used
        meta[kinds != 0, 2] = at[kinds != 0]
        # idx: per gathered batch its state rows, per sum its slots then its rows
        data = [r[3] if r[0] == 1 else r[2] for r in rows if r[0]]
        if len(sums):
            total = int(used.sum())
            heads = np.repeat(at[sums] - (np.cumsum(k) - k), k) + np.arange(int(k.sum()))
            self.idx = np.empty(total, np.int64)
            body = np.ones(total, bool)
            body[heads] = False
            self.idx[heads] = slot[np.fromiter(
                (a for src in srcs for a in src), np.int64, len(heads))]
            self.idx[body] = np.concatenate(data, axis=None)
        else:
            self.idx = np.concatenate(data).astype(np.int64, copy=False) if data \
                else np.zeros(1, np.int64)
        self.meta = meta
        self.rows, self.width = int(n_.max()), int(hidden_.max())
        self.name = ", ".join(sorted(all_names))
        last = dict(zip(weight, range(len(weight)), strict=True))  # weight -> its last batch
        first = dict(zip(reversed(weight), reversed(hidden), strict=True))  # -> first's H
        self.binders = tuple((w, first[w]) for w in sorted(last, key=last.__getitem__,
                                                             reverse=True))  # weight -> H

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        """As :meth:`FastStep.bind <edbatch.executor._fast_lstm.FastStep.bind>`, for
        every batch."""
        for weight, hidden in self.binders:
            bind_weight(params, into, weight, hidden)

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w_ht: Mapping[Any, Tensor]) -> None:
        dtype = views[0].dtype
        try:
            scratch = torch.empty(self.rows * 2 * self.width, dtype=arenas[0].dtype).numpy()
            _chain(self.meta, self.idx, padded([views[a] for a in self.arenas], SLOTS),
                   padded([w_ht[w].numpy() for w in self.weights], SLOTS), scratch,
                   np.empty(self.width, dtype), _ints(), np.ones(1, dtype))
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(
                f"{self.count} batches of op types {self.name!r} (hoisted LSTM chain "
                f"short path) failed: {type(e).__name__}: {e}") from e


class _Done:
    """A batch an earlier :class:`ChainStep` of the program ran."""

    __slots__ = ()

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        pass

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w_ht: Mapping[Any, Tensor]) -> None:
        pass


DONE = _Done()


def _key(f: Any) -> tuple[tuple[int, ...], str | None] | None:
    """A short entry's chain key (:func:`_key_runs`): a :class:`FastStep` with a whole-row
    state, or a :class:`~edbatch.executor._fast_sum.FastSumStep`; else ``None``."""
    if type(f) is FastSumStep:
        return f.arenas, None
    if type(f) is FastStep and type(f.state) in _WHOLE_ROWS:
        return (f.state.b, f.pa, f.oa), f.weight  # type: ignore[attr-defined]
    return None


def _runs(short: Sequence[Any]) -> list[list[int]]:
    """Maximal runs of consecutive chainable entries (:func:`_key`), each within
    :data:`SLOTS` arenas and weights and with at least one LSTM batch."""
    return _key_runs([_key(f) for f in short])


def _key_runs(keys: Sequence[tuple[tuple[int, ...], str | None] | None]) -> list[list[int]]:
    """:func:`_runs` of the entries' ``(arenas, weight)`` (the arenas a batch reads and
    writes; weight ``None``: a sum batch; key ``None``: not a chainable batch)."""
    out: list[list[int]] = []
    run: list[int] = []
    arenas: set[int] = set()
    weights: set[str] = set()
    last = None  # the key of the run's last entry
    for i, key in enumerate(keys):
        if key is None:
            if run:
                out.append(run)
            run, last = [], None
            continue
        if key == last and len(arenas) <= SLOTS:  # (the same arenas and weight: no cut)
            run.append(i)
            continue
        last = key
        if not run:
            arenas, weights = set(), set()
        used, weight = key
        arenas.update(used)
        if len(arenas) > SLOTS or (weight is not None and weight not in weights and
                                   len(weights) == SLOTS):
            out.append(run)
            run, arenas, weights = [], set(used), set()
        run.append(i)
        if weight is not None:
            weights.add(weight)
    if run:
        out.append(run)
    return [r for r in out if len(r) > 1 and any(keys[i][1] is not None  # type: ignore[index]
                                                 for i in r)]


def _row_arenas(row: Any) -> tuple[int, ...]:
    """The arenas a :data:`Row` or :data:`~edbatch.executor._fast_sum.SumRow` touches."""
    return (*row[1], row[4]) if row[0] == 2 else (row[1], row[5], row[7])


def chain_short(program: Any, device: torch.device) -> Any:
    """Set ``program.chained``: ``program.short`` with every run of two or more consecutive
    hoisted batches (:class:`FastStep` entries) as one :class:`ChainStep` at its first batch
    and :data:`DONE` at the others (the executor runs it instead of ``short`` while
    :data:`ENABLED`); returns ``program``. A hoisted program whose batches' entries are
    deferred (``program.deferred``: their :data:`Row`\\ s) gets the same chains from the rows,
    its lone batches a :class:`FastStep` each, none of its deferred entries built. Nothing
    off the CPU, nothing without :data:`AVAILABLE` or where the BLAS call does not
    :func:`agree <agrees>` with torch's."""
    short = getattr(program, "short", None)
    if device.type != "cpu" or not AVAILABLE or not short or not agrees():
        return program
    rows: Mapping[int, Row] = getattr(program, "deferred", None) or {}
    if rows and isinstance(short, LazySteps) and not short.built:
        return _chain_rows(program, short, rows)
    runs = _runs(short)
    if not runs:
        return program
    new = list(short)
    for run in runs:
        picked = [step_row(short[i]) for i in run]
        new[run[0]] = ChainStep.of_rows(picked, sorted({a for r in picked for a in _row_arenas(r)}),
                                        sorted({r[9] for r in picked if r[0] != 2}))
        for i in run[1:]:
            new[i] = DONE
    program.chained = tuple(new)
    return program


def _chain_rows(program: Any, short: LazySteps, rows: Mapping[int, Row]) -> Any:
    """:func:`chain_short` of a program whose hoisted batches are deferred ``rows``."""
    keys: list[tuple[tuple[int, ...], str | None] | None] = [None] * len(short)
    for i, row in rows.items():  # (a deferred sum's row: its arenas, as _key gives them)
        keys[i] = ((*row[1], row[4]), None) if row[0] == 2 else \
            ((row[1], row[5], row[7]), row[9])
    new: list[Any] = [None] * len(short)
    for i, entry in short.given():  # (a given FastStep is no deferred batch's: not chained)
        new[i] = entry
        if type(entry) is FastSumStep:  # sums between them are
            keys[i] = _key(entry)
    chained: set[int] = set()
    for run in _key_runs(keys):  # (a run: consecutive positions, every one with a key)
        lo, hi = run[0], run[-1] + 1
        picked = [rows[i] if i in rows else step_row(new[i]) for i in run]
        ran: list[Any] = keys[lo:hi]
        used: set[int] = set().union(*[key[0] for key in ran])  # (_row_arenas of its rows)
        new[lo] = ChainStep.of_rows(picked, sorted(used),
                                    sorted({w for _, w in ran if w is not None}))
        new[lo + 1:hi] = [DONE] * (hi - lo - 1)
        chained.update(run)
    for i in rows.keys() - chained:
        row = rows[i]
        new[i] = row_sum_step(row) if row[0] == 2 else row_step(row)  # type: ignore[arg-type]
    program.chained = tuple(new)
    return program
