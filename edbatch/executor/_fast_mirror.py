"""Projection operands written by the chains that make them (inference): no gather.

A hoisted projection that reads earlier states gathered (the BiLSTM's layer-2 projections:
``[h(f1_t); h(b1_t)]`` per token, :class:`~edbatch.executor._head_reads.HeadPairRead`, one
``index_select`` of ~2,500 rows a mini-batch each) cannot read them as a view: a token's
``b1`` row lies in a batch that depends on its sentence's length, so no schedule-order layout
of the state arena is the projection's order. Instead, where the rows it reads are made by
the program's chains (:class:`~edbatch.executor._fast_chain.ChainStep`), the chain kernel
writes each such ``h'`` row a second time, into a per-run **mirror** buffer laid out as the
gather lays its rows out (``[rows of the gather, H]``), right after computing it; the
projection step's short entry (:class:`MirroredProjection`) then calls the step's kernel on
a view of that buffer. Rows no chain makes (a lone batch's, the zero state's) are copied
into the buffer by that entry (numpy, a few rows). Same values in the same layout, a fresh
contiguous buffer as ``index_select``'s output is: bit-identical products
(``tests/executor/test_fast_mirror.py``, fp32 and fp64). A projection whose rows no chain
makes, or that would take a chain past :data:`MIRRORS` buffers, keeps its gather; with the
chains off (``_fast_chain.ENABLED``) the program's steps run as before. Off by default
(:data:`ENABLED`: no gain measured here). Training chains write the mirrors too
(:mod:`~edbatch.executor._chain_train`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor._head_reads import HeadPairRead, HeadRowsRead
from edbatch.executor._program import given_steps

__all__ = ["ENABLED", "MIRRORS", "MirroredProjection", "mirror_buffer", "mirror_projections"]

#: Whether chains write mirrors (read when a program is built; ``[False]``, the default: the
#: projections gather, the tests' reference). Off by default: on a 2-core EPYC at load 5-7 the
#: chain's copies cost what the gathers did (the rows move either way, and the projection's
#: GEMM then reads the mirror from memory, not the gather's output from cache): BiLSTM tagger
#: 300x150, executor CPU time a mini-batch unchanged within noise (paired on/off 0.99-1.00),
#: the parts alone +0.15-0.4 ms (chain +0.5, projections -0.2 to -0.35).
ENABLED = [False]
#: Mirror buffers one chain writes at most (a projection that would need more gathers).
MIRRORS = 4
_PARAMS = ("mirror", "params")  # the run's parameters in the bound dict (the kernel's call)


def mirror_buffer(bound: Mapping[Any, Tensor], key: Any, rows: int, cols: int,
                  dtype: torch.dtype) -> Tensor:
    """The run's mirror buffer ``key`` (``[rows, cols]``), made on first use in ``bound``
    (the run's dict of what its short steps read)."""
    buf = bound.get(key)
    if buf is None:
        buf = bound[key] = torch.empty((rows, cols), dtype=dtype)  # type: ignore[index]
    return buf


class MirroredProjection:
    """A projection ``step`` whose one gathered read its chains wrote into mirror ``key``
    (``[rows, cols]``, the gather's layout; the kernel reads it as ``[-1, width]``); rows
    ``src`` of arena ``arena`` no chain wrote are copied to mirror rows ``dst`` here."""

    __slots__ = ("arena", "cols", "dst", "key", "rows", "src", "step", "width")

    def __init__(self, step: Any, key: Any, rows: int, cols: int, width: int, arena: int,
                 src: np.ndarray, dst: np.ndarray) -> None:  # type: ignore[type-arg]
        self.step, self.key, self.rows, self.cols, self.width = step, key, rows, cols, width
        self.arena, self.src, self.dst = arena, src, dst

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Any]) -> None:
        """Keep the run's ``params`` for the kernel's call."""
        into[_PARAMS] = params

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 bound: Mapping[Any, Any], save: list[Tensor] | None = None) -> None:
        """Fill the mirror's rows no chain wrote and run the step's kernel on it (``save``:
        what its backward reads, in training)."""
        step = self.step
        try:
            buf = mirror_buffer(bound, self.key, self.rows, self.cols, arenas[0].dtype)
            if len(self.src):
                buf.numpy()[self.dst] = views[self.arena][self.src, :self.cols]
            out = arenas[step.out_arena].narrow(0, step.out_start, step.size)
            x = [buf.view(-1, self.width)]
            if save is None:
                step.kernel(step.op, x, bound[_PARAMS], step.attrs, out=out)
            else:
                step.kernel(step.op, x, bound[_PARAMS], step.attrs, out=out, save=save)
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(
                f"batch of op type {step.op.name!r} ({step.size} nodes, projection of "
                f"mirrored rows) failed: {type(e).__name__}: {e}") from e


def _gathered(step: Any) -> HeadRowsRead | None:
    """``step``'s one read if it is a gather of ``h`` columns the mirror can stand for."""
    if len(step.reads) != 1 or not step.writes_out or step.split:
        return None
    read = step.reads[0]
    if type(read) not in (HeadRowsRead, HeadPairRead) or read.idx.device.type != "cpu":
        return None
    return read  # type: ignore[no-any-return]


def _chain_writes(chain: Any, run: Sequence[int]) -> dict[int, tuple[np.ndarray, ...]]:  # type: ignore[type-arg]
    """Arena -> (rows written, their batch, row in batch, LSTM (not a sum), position,
    ``H``) over every batch of ``chain`` (positions ``run``), rows in batch order."""
    meta = chain.meta
    out: dict[int, tuple[np.ndarray, ...]] = {}  # type: ignore[type-arg]
    for slot in np.unique(meta[:, 6]).tolist():
        js = np.flatnonzero(meta[:, 6] == slot)
        n = meta[js, 3]
        first = np.cumsum(n) - n
        r = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first, n)
        j = np.repeat(js, n)
        out[chain.arenas[slot]] = (meta[j, 7] + r, j, r, meta[j, 0] != 2,
                                   np.asarray(run, np.int64)[j], meta[j, 9])
    return out


def _other_writes(program: Any, new: Sequence[Any], chained: set[int], arena: int,
                  counts: np.ndarray) -> None:  # type: ignore[type-arg]
    """Add into ``counts`` the rows of ``arena`` that batches outside chains write."""
    deferred: Mapping[int, Any] = getattr(program, "deferred", None) or {}
    for i, row in deferred.items():
        if i not in chained:
            oa, os_, n = (row[4], row[5], row[3]) if row[0] == 2 else (row[7], row[8], row[4])
            if oa == arena:
                counts[os_:os_ + n] += 1
    for i, step in given_steps(program.steps):
        if i not in chained and i not in deferred and step.out_arena == arena:
            counts[step.out_start:step.out_start + step.size] += 1


def mirror_projections(program: Any, new: list[Any], runs: Sequence[Sequence[int]]) -> None:
    """Where the chains in ``new`` (``program.chained`` to be; each run's
    :class:`~edbatch.executor._fast_chain.ChainStep` at its first position) make rows a
    later projection step gathers, have them write those rows into its mirror too and put
    a :class:`MirroredProjection` at the projection's position (see the module doc)."""
    if not (ENABLED[0] and runs):
        return
    writes: dict[int, list[tuple[int, tuple[np.ndarray, ...]]]] = {}  # type: ignore[type-arg]
    for run in runs:
        for arena, w in _chain_writes(new[run[0]], run).items():
            writes.setdefault(arena, []).append((run[0], w))
    chained = {i for run in runs for i in run}
    sizes = dict(enumerate(rows for rows, _ in program.arenas))
    per_chain: dict[int, list[np.ndarray]] = {}  # type: ignore[type-arg]  # its copies
    slots: dict[int, list[Any]] = {}  # chain position -> its mirrors (key, rows, cols)
    counted: dict[int, np.ndarray] = {}  # type: ignore[type-arg]
    for q, step in list(given_steps(program.steps)):
        read = _gathered(step)
        if read is None or new[q] is not None or read.b not in writes:
            continue
        a, cols = read.b, read.cols
        if a not in counted:  # how often each row of the arena is written
            counts = np.zeros(sizes[a], np.int64)
            for _, w in writes[a]:
                np.add.at(counts, w[0], 1)
            _other_writes(program, new, chained, a, counts)
            counted[a] = counts
        counts = counted[a]
        by = np.full(sizes[a], -1, np.int64)  # each row's one writing LSTM batch before q
        where = np.zeros((sizes[a], 2), np.int64)  # its batch and row there
        for c, (rows, j, r, lstm, pos, h) in writes[a]:
            ok = lstm & (pos < q) & (h == cols)
            by[rows[ok]], where[rows[ok], 0], where[rows[ok], 1] = c, j[ok], r[ok]
        idx = read.idx.numpy()
        chain_of = by[idx]
        mine = (chain_of >= 0) & (counts[idx] == 1)
        users = np.unique(chain_of[mine]).tolist()
        if not mine.any() or any(len(slots.get(c, ())) >= MIRRORS for c in users):
            continue
        key = ("mirror", q)
        for c in users:
            k = np.flatnonzero(mine & (chain_of == c))
            at = where[idx[k]]
            per_chain.setdefault(c, []).append(
                np.stack([at[:, 0], at[:, 1], np.full(len(k), len(slots.get(c, ()))), k], 1))
            slots.setdefault(c, []).append((key, len(idx), cols))
        rest = np.flatnonzero(~mine)
        per = 2 if type(read) is HeadPairRead else 1
        new[q] = MirroredProjection(step, key, len(idx), cols, per * cols, a, idx[rest], rest)
    for c, parts in per_chain.items():
        chain = new[c]
        copies = np.concatenate(parts)
        copies = copies[np.argsort(copies[:, 0], kind="stable")]
        chain.mirrors = tuple(slots[c])
        chain.cp = np.searchsorted(copies[:, 0], np.arange(chain.count + 1)).astype(np.int64)
        chain.copies = np.ascontiguousarray(copies[:, 1:])
