"""The in-place executor's short path for batches of ``k``-ary sums (inference).

A lattice mini-batch runs about a hundred batches of the ``sum`` kernel (a lattice node's
state: the sum of its incoming arcs' ``[h; c]`` rows). Through the kernel a batch gathers
each operand's rows (an ``index_select`` copy per operand), adds them into its output
region (``torch.add`` then ``add_``) and pays the kernel call's dispatch. Here, where a run
qualifies (:func:`~edbatch.executor._fast_lstm.qualifies`), a sum batch whose operands are
whole rows of the arenas (gathers or slices) runs as one compiled loop that reads each
operand row in place and writes the sum straight into the output rows: the same additions
in the same order (left to right, each rounded as torch rounds it: compiled without
``fastmath``), so bit-identical values (``tests/executor/test_fast_sum.py``), no copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numba import njit
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor._fast_lstm import install_short
from edbatch.executor._reads import RowsRead, SliceRead

__all__ = ["KIND", "SLOTS", "FastSumStep", "SumRow", "padded", "plan_sum_rows", "row_sum_step",
           "sum_row", "sum_rows", "sum_short"]

#: The op kind this short path serves.
KIND = "sum"
#: Distinct arenas one batch's operands and output may span (the kernel's fixed tuple
#: size: one compiled signature per dtype).
SLOTS = 4


def padded(items: Sequence[Any], slots: int) -> tuple[Any, ...]:
    """``items`` as a tuple of ``slots`` entries, the first repeated to fill it (a compiled
    kernel's fixed tuple size: one signature per dtype, whatever the count used)."""
    t = tuple(items)
    return t + t[:1] * (slots - len(t))


# no ``fastmath``: the additions must stay the left-to-right ones torch makes
@njit(error_model="numpy", cache=True, nogil=True)
def _sum_rows(arenas, which, idx, oa, os):  # type: ignore[no-untyped-def]  # numba
    out = arenas[oa]
    k, n = idx.shape
    for r in range(n):
        o = out[os + r]
        a, b = arenas[which[0]][idx[0, r]], arenas[which[1]][idx[1, r]]
        for j in range(o.shape[0]):
            o[j] = a[j] + b[j]
        for q in range(2, k):
            a = arenas[which[q]][idx[q, r]]
            for j in range(o.shape[0]):
                o[j] += a[j]


# a chain's sum batch (:mod:`~edbatch.executor._fast_chain`): operand ``q``'s arena slot is
# ``idx[at + q]``, its rows ``idx[at + k + q * n:][:n]``; the same additions as ``_sum_rows``
@njit(error_model="numpy", cache=True, nogil=True)
def sum_chained(arenas, idx, at, k, n, oa, os):  # type: ignore[no-untyped-def]  # numba
    out = arenas[oa]
    for r in range(n):
        o = out[os + r]
        a, b = arenas[idx[at]][idx[at + k + r]], arenas[idx[at + 1]][idx[at + k + n + r]]
        for j in range(o.shape[0]):
            o[j] = a[j] + b[j]
        for q in range(2, k):
            a = arenas[idx[at + q]][idx[at + k + q * n + r]]
            for j in range(o.shape[0]):
                o[j] += a[j]


def sum_rows(arenas: Sequence[np.ndarray], which: np.ndarray,  # type: ignore[type-arg]
             idx: np.ndarray, oa: int, os: int) -> None:  # type: ignore[type-arg]
    """Rows ``os:os+n`` of ``arenas[oa]`` = the sum over ``q`` (left to right) of rows
    ``idx[q]`` of ``arenas[which[q]]`` (``idx``: ``[k, n]`` ``int64``, ``k >= 2``; at most
    :data:`SLOTS` arenas, all 2-D, one dtype)."""
    _sum_rows(padded(arenas, SLOTS), which, idx, oa, os)


class FastSumStep:
    """One batch of ``n`` ``k``-ary sums: operand ``q`` is rows ``idx[q]`` of arena
    ``arenas[which[q]]``, the output rows ``os:os+n`` of arena ``arenas[oa]``
    (``arenas``: the program's arena indices this batch touches)."""

    __slots__ = ("arenas", "idx", "n", "name", "oa", "os", "which")

    def __init__(self, arenas: tuple[int, ...], which: np.ndarray,  # type: ignore[type-arg]
                 idx: np.ndarray, oa: int, os: int, name: str = "") -> None:  # type: ignore[type-arg]
        self.arenas, self.which, self.idx, self.oa, self.os = arenas, which, idx, oa, os
        self.n, self.name = idx.shape[1], name

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        """Nothing to bind: a sum reads no parameter."""

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w: Mapping[Any, Tensor]) -> None:
        try:
            _sum_rows(padded([views[a] for a in self.arenas], SLOTS), self.which, self.idx,
                      self.oa, self.os)
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(f"batch of op type {self.name!r} ({self.n} nodes, sum "
                                 f"short path) failed: {type(e).__name__}: {e}") from e


#: A sum batch as a chain reads it: ``(2, operand arenas, rows [k, n] int64, n, output
#: arena, its start, op type name)``.
SumRow = tuple[int, tuple[int, ...], np.ndarray, int, int, int, str]  # type: ignore[type-arg]


def sum_row(f: FastSumStep) -> SumRow:
    """``f``'s :data:`SumRow`."""
    return (2, tuple(f.arenas[w] for w in f.which), f.idx, f.n, f.arenas[f.oa], f.os, f.name)


def sum_short(program: Any, device: torch.device) -> Any:
    """Give ``program``'s batches of fixed-arity sums (``k >= 2`` operands, each whole rows
    of an arena as wide as the output) a :class:`FastSumStep` in ``program.short`` (its
    other entries kept); returns ``program``. Nothing off the CPU."""
    return install_short(program, device, KIND, lambda step: _sum_step(step, program.arenas))


def _sum_step(step: Any, arenas: Sequence[tuple[int, int]]) -> FastSumStep | None:
    reads, n, width = step.reads, step.size, step.width
    if step.op.arity is None or len(reads) < 2 or arenas[step.out_arena][1] != width:
        return None
    idx = np.empty((len(reads), n), np.int64)
    srcs = []
    for q, read in enumerate(reads):  # (21.6 -> 8.3 us a batch against whole_rows + np.stack)
        kind = type(read)
        if kind is RowsRead:
            rows = read.idx.numpy()
            if len(rows) != n:
                return None
            idx[q] = rows
        elif kind is SliceRead and read.hi - read.lo == n:
            idx[q] = np.arange(read.lo, read.hi)
        else:
            return None
        if arenas[read.b][1] != width:
            return None
        srcs.append(read.b)
    if len({*srcs, step.out_arena}) > SLOTS:
        return None
    return row_sum_step((2, tuple(srcs), idx, n, step.out_arena, step.out_start, step.op.name))


def plan_sum_rows(plan: Any, batches: Sequence[int], sizes: Sequence[int], width: Sequence[int],
                  names: Sequence[str]) -> dict[int, SumRow]:
    """Batch -> :data:`SumRow` of those of ``batches`` (fixed-arity sums; ``sizes``,
    ``width``, ``names``: each one's nodes, output width and op type name) whose
    :class:`FastSumStep` :func:`_sum_step` would make from their compiled reads, made from
    ``plan``'s operands directly: no read, no step (a hoisted program defers the sums' steps:
    :func:`~edbatch.executor._hoist.hoist_program`). Every row index of every batch is one
    concatenation, each batch's ``[k, n]`` block a view of it."""
    arenas, ops = plan.arenas, plan.operands
    out_arena, out_start = plan.output_rows()  # (lists: no Region object a batch)
    base = np.arange(max(rows for rows, _ in arenas), dtype=np.int64)
    parts: list[np.ndarray] = []  # type: ignore[type-arg]
    kept: list[tuple[int, tuple[int, ...], int, int, str]] = []  # batch, arenas, n, at, name
    at = 0
    for b, n, w, name in zip(batches, sizes, width, names, strict=True):
        operands = ops[b]
        oa = out_arena[b]
        if len(operands) < 2 or arenas[oa][1] != w:
            continue
        mine = []
        srcs = []
        for o in operands:
            view = o.view
            rows = base[view.start:view.stop] if view is not None else o.gather
            if len(rows) != n or arenas[o.arena][1] != w:
                break
            mine.append(rows)
            srcs.append(o.arena)
        else:
            if len({*srcs, oa}) > SLOTS:
                continue
            parts += mine
            kept.append((b, tuple(srcs), n, at, name))
            at += n * len(srcs)
    if not kept:
        return {}
    flat = np.concatenate(parts)
    return {b: (2, srcs, flat[lo:lo + n * len(srcs)].reshape(len(srcs), n), n,
                out_arena[b], out_start[b], name)
            for b, srcs, n, lo, name in kept}


def row_sum_step(row: SumRow) -> FastSumStep:
    """The :class:`FastSumStep` of a :data:`SumRow` (at most :data:`SLOTS` arenas; the inverse
    of :func:`sum_row`)."""
    _, srcs, idx, _, oa, os, name = row
    used = sorted({*srcs, oa})
    slot = {a: k for k, a in enumerate(used)}
    return FastSumStep(tuple(used), np.array([slot[a] for a in srcs], np.int64), idx,
                       slot[oa], os, name)
