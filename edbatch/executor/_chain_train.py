"""Chains of hoisted LSTM batches in training (:class:`~edbatch.executor._analytic.AnalyticRun`).

Inference runs a program's runs of hoisted LSTM batches (lattice state sums between them
included) as one compiled call each (:class:`~edbatch.executor._fast_chain.ChainStep`).
Training ran every such batch through its kernel, saving what its hand-written backward reads,
and its backward one batch at a time: a kernel call, seven ``Tensor.numpy()`` conversions, the
compiled element-wise backward, ``torch.mm`` and two gradient routes (``index_add_`` /
``add_``) per batch, and per sum batch a ``clone`` and one route per operand, tens of us of
Python and dispatch a batch beside its GEMM.

Here the same chains run in training as two compiled calls:

* **forward** (:func:`_forward`): as :func:`~edbatch.executor._fast_chain._chain`, except
  that a gathered state's whole ``[h; c]`` rows are kept (laid out as ``index_select`` lays
  them out: the same product) and every batch's ``tanh(c')`` rows are kept, in two tensors
  per chain (:class:`ChainSave`) instead of per-batch saves;
* **backward** (:func:`_backward`, batches in reverse): per LSTM batch the element-wise
  backward of :func:`~edbatch.executor._fused.lstm_backward` (the same row code), the
  ``?gemm`` that ``torch.mm(d_gates, W_h)`` calls (``beta = 0``, ``W_h`` read in place as a
  column block of ``W``), then the routes of ``d[h; c]`` into the state's producer rows
  (rows in order, as ``index_add_`` adds them) and of ``d_gates`` into the projection's;
  per sum batch its output gradient added into each operand's rows, operand by operand.
  The recurrent weight gradients go to :class:`~edbatch.executor.param_grads.ParamGrads` as
  before (views of the chain's ``d_gates`` and kept ``h`` rows, in the same order).

Same operations on the same operands in the same order: bit-identical outputs and gradients
(``tests/executor/test_chain_train.py``, fp32 and fp64). Only where every LSTM batch of the
chain has the same ``H`` and contiguous weights, and where the BLAS call agrees with
``torch.mm`` (:func:`agrees`); else the batches run one by one as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numba import njit, types
from numba.extending import overload
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fast_chain
from edbatch.executor._fast_blas import _DGEMM, _SGEMM, _addr, _gemm, _ints
from edbatch.executor._fast_chain import ChainStep
from edbatch.executor._fast_lstm import qualifies
from edbatch.executor._fast_sum import padded, sum_chained
from edbatch.executor._fused import _jit, _lstm_bwd_row, _lstm_row, _sig_, _tanh_

__all__ = ["ENABLED", "ChainSave", "agrees", "train_chains"]

#: Whether training runs chains (``[False]``: every batch through its kernel, the reference
#: the tests compare with; :data:`~edbatch.executor._fast_chain.ENABLED` off turns it off too).
ENABLED = [True]


def _gemm_w(c, c0, ldc, b, b0, ldb, w, w0, ldw, ints, one, zero):  # type: ignore[no-untyped-def]
    """``c[c0:] = b[b0:] @ w[w0:]`` (row-major; ``w`` a ``[K, N]`` block of row stride
    ``ldw``, ``K``, ``N`` and the rows in ``ints``): the ``?gemm`` call ``torch.mm`` makes."""


@overload(_gemm_w, inline="always")
def _gemm_w_impl(c, c0, ldc, b, b0, ldb, w, w0, ldw, ints, one, zero):  # type: ignore[no-untyped-def]
    fn = _SGEMM if c.dtype == types.float32 else _DGEMM

    def impl(c, c0, ldc, b, b0, ldb, w, w0, ldw, ints, one, zero):  # type: ignore[no-untyped-def]
        ints[3], ints[4], ints[5] = ldw, ldb, ldc  # ints: [N, M rows, K, ldw, ldb, ldc, 'N'*8]
        fn(_addr(ints.view(np.uint8), 48), _addr(ints.view(np.uint8), 48), _addr(ints, 0),
           _addr(ints, 1), _addr(ints, 2), _addr(one, 0), _addr(w, w0), _addr(ints, 3),
           _addr(b, b0), _addr(ints, 4), _addr(zero, 0), _addr(c, c0), _addr(ints, 5))
    return impl


@_jit
def _offsets(meta, base, rw):  # type: ignore[no-untyped-def]
    """Per batch: its first kept gathered row, ``tanh(c')`` row, and its first row in the
    per-weight blocks (``base``: each weight slot's block start, ``rw``: its rows), where
    a weight's batches lie in reverse order (the order the weight gradients take them)."""
    m = meta.shape[0]
    g_off, t_off, p_off = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64)
    wat = np.zeros(base.shape[0], np.int64)
    g_at = t_at = 0
    for j in range(m):
        g_off[j], t_off[j], p_off[j] = g_at, t_at, 0
        kind, n = meta[j, 0], meta[j, 3]
        if kind == 1:
            g_at += n
        if kind != 2:
            wi = meta[j, 8]
            wat[wi] += n
            t_at += n
            p_off[j] = base[wi] + rw[wi] - wat[wi]
    return g_off, t_off, p_off


@_jit
def _forward(meta, idx, arenas, weights, xs, tb, xh, base, rw, ints, one):  # type: ignore[no-untyped-def]
    g_off, t_off, p_off = _offsets(meta, base, rw)
    for j in range(meta.shape[0]):
        kind, sb, s0, n, pa, lo = meta[j, 0], meta[j, 1], meta[j, 2], meta[j, 3], \
            meta[j, 4], meta[j, 5]
        if kind == 2:
            sum_chained(arenas, idx, s0, sb, n, meta[j, 6], meta[j, 7])
            continue
        oa, o0, wi, h = meta[j, 6], meta[j, 7], meta[j, 8], meta[j, 9]
        state, proj, out, w = arenas[sb], arenas[pa], arenas[oa], weights[wi]
        ints[1], g_at, t_at, p = n, g_off[j], t_off[j], p_off[j]
        for r in range(n):  # h of the states, as the weight gradient reads them
            src, dst = (state[s0 + r] if kind == 0 else state[idx[s0 + r]]), xh[p + r]
            for k in range(h):
                dst[k] = src[k]
        if kind == 0:  # as _fast_chain._chain: the ?gemm call addmm_ makes
            _gemm(proj, lo * proj.shape[1], proj.shape[1], state, s0 * state.shape[1],
                  state.shape[1], w, ints, one)
        else:  # the gathered [h; c] rows, as index_select lays them out
            for r in range(n):
                src, dst = state[idx[s0 + r]], xs[g_at + r]
                for k in range(2 * h):
                    dst[k] = src[k]
            _gemm(proj, lo * proj.shape[1], proj.shape[1], xs, g_at * xs.shape[1],
                  xs.shape[1], w, ints, one)
        for r in range(n):
            gr, orow = proj[lo + r], out[o0 + r]
            src = state[s0 + r] if kind == 0 else xs[g_at + r]
            _sig_(gr[:3 * h])
            _tanh_(gr[3 * h:4 * h])
            _lstm_row(gr[:h], gr[h:2 * h], gr[2 * h:3 * h], gr[3 * h:4 * h], src[h:2 * h],
                      orow[:h], orow[h:2 * h], tb[t_at + r])


@_jit
def _backward(meta, idx, arenas, grads, weights, starts, xs, tb, dg, din, base, rw, ints,  # type: ignore[no-untyped-def]
              one, zero):
    g_off, t_off, p_off = _offsets(meta, base, rw)
    for j in range(meta.shape[0] - 1, -1, -1):
        kind, sb, s0, n, pa, lo = meta[j, 0], meta[j, 1], meta[j, 2], meta[j, 3], \
            meta[j, 4], meta[j, 5]
        oa, o0 = meta[j, 6], meta[j, 7]
        go = grads[oa]
        if kind == 2:  # a sum: its output gradient into each operand's rows, in turn
            for q in range(sb):
                dst = grads[idx[s0 + q]]
                for r in range(n):
                    d, s = dst[idx[s0 + sb + q * n + r]], go[o0 + r]
                    for k in range(s.shape[0]):
                        d[k] += s[k]
            continue
        wi, h = meta[j, 8], meta[j, 9]
        state, proj, t0, p = arenas[sb], arenas[pa], t_off[j], p_off[j]
        for r in range(n):
            grow, gr, drow = go[o0 + r], proj[lo + r], dg[p + r]
            src = state[s0 + r] if kind == 0 else xs[g_off[j] + r]
            _lstm_bwd_row(grow[:h], grow[h:2 * h], gr[:h], gr[h:2 * h], gr[2 * h:3 * h],
                          gr[3 * h:4 * h], src[h:2 * h], tb[t0 + r], drow[:h],
                          drow[h:2 * h], drow[2 * h:3 * h], drow[3 * h:4 * h],
                          din[r, h:2 * h])
        w = weights[wi]
        ints[0], ints[1], ints[2] = h, n, 4 * h
        _gemm_w(din, 0, din.shape[1], dg, p * dg.shape[1], dg.shape[1], w, starts[wi],
                w.shape[1], ints, one, zero)
        dst = grads[sb]
        for r in range(n):  # d[h; c] into the state's rows (a gather's: in order)
            d, s = (dst[s0 + r] if kind == 0 else dst[idx[s0 + r]]), din[r]
            for k in range(2 * h):
                d[k] += s[k]
        dst = grads[pa]
        for r in range(n):  # d_gates into the projection rows
            d, s = dst[lo + r], dg[p + r]
            for k in range(4 * h):
                d[k] += s[k]


class ChainSave:
    """What a chain's forward kept for its backward (one object for all its batches):
    gathered states ``xs``, ``tanh(c')`` rows ``tb``, the ``h`` rows ``xh`` of each weight's
    batches (block ``base[w]:base[w] + rw[w]``, batches in reverse order)."""

    __slots__ = ("arenas", "base", "chain", "first", "hidden", "rw", "tb", "xh", "xs")

    def __init__(self, chain: ChainStep, first: int, hidden: int, arenas: Sequence[Tensor],
                 blocks: tuple[Any, Any], kept: tuple[Tensor, Tensor, Tensor]) -> None:
        self.chain, self.first, self.hidden, self.arenas = chain, first, hidden, arenas
        self.base, self.rw = blocks
        self.xs, self.tb, self.xh = kept

    def backward(self, bufs: Sequence[Tensor], params: Mapping[str, Tensor], acc: Any) -> None:
        """Route the chain's gradients (batches in reverse) and record its recurrent weight
        gradients in ``acc`` (a :class:`~edbatch.executor.param_grads.ParamGrads`): per
        weight one ``(d_gates, h)`` block, the rows its batches would have given in turn."""
        chain, h, arenas = self.chain, self.hidden, self.arenas
        ws = [params[w] for w in chain.weights]
        dg = torch.empty((self.xh.shape[0], 4 * h), dtype=self.tb.dtype)
        din = torch.empty((max(chain.rows, 1), 2 * h), dtype=self.tb.dtype)
        dtype = dg.numpy().dtype
        try:
            pad = _fast_chain.SLOTS
            _backward(chain.meta, chain.idx, padded([arenas[a].numpy() for a in chain.arenas], pad),
                      padded([bufs[a].numpy() for a in chain.arenas], pad),
                      padded([w.numpy() for w in ws], pad),
                      np.array([w.shape[1] - h for w in ws] + [0] * (pad - len(ws)),
                               np.int64),
                      self.xs.numpy(), self.tb.numpy(), dg.numpy(), din.numpy(), self.base,
                      self.rw, _ints(), np.ones(1, dtype), np.zeros(1, dtype))
        except Exception as e:
            raise ExecutionError(
                f"{chain.count} batches of op types {chain.name!r} (hoisted LSTM chain "
                f"backward) failed: {type(e).__name__}: {e}") from e
        for wi in self.order:
            lo, n = int(self.base[wi]), int(self.rw[wi])
            acc.linear((chain.weights[wi],), dg.narrow(0, lo, n), self.xh.narrow(0, lo, n),
                       ws[wi].shape[1] - h)

    @property
    def order(self) -> list[int]:
        """The weight slots in the order their first gradient rows would have come (the
        slot of the chain's last LSTM batch first)."""
        meta = self.chain.meta
        slots = meta[meta[:, 0] != 2, 8][::-1]
        return list(dict.fromkeys(slots.tolist()))


class _Chain:
    """A training chain's forward entry (at its first batch): runs it, saves for all."""

    __slots__ = ("chain", "first", "hidden", "saves")

    def __init__(self, chain: ChainStep, first: int, hidden: int,
                 saves: list[Any]) -> None:
        self.chain, self.first, self.hidden, self.saves = chain, first, hidden, saves

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w_ht: Mapping[Any, Tensor]) -> None:
        chain, h = self.chain, self.hidden
        meta = chain.meta
        lstm = meta[:, 0] != 2
        rw = np.bincount(meta[lstm, 8], weights=meta[lstm, 3],
                         minlength=_fast_chain.SLOTS).astype(np.int64)
        base = np.concatenate(([0], np.cumsum(rw)[:-1])).astype(np.int64)
        dtype, rows = arenas[0].dtype, int(rw.sum())
        xs = torch.empty((int(meta[meta[:, 0] == 1, 3].sum()), 2 * h), dtype=dtype)
        tb = torch.empty((rows, h), dtype=dtype)
        xh = torch.empty((rows, h), dtype=dtype)
        try:
            pad = _fast_chain.SLOTS
            _forward(meta, chain.idx, padded([views[a] for a in chain.arenas], pad),
                     padded([w_ht[w].numpy() for w in chain.weights], pad), xs.numpy(),
                     tb.numpy(), xh.numpy(), base, rw, _ints(), np.ones(1, views[0].dtype))
        except Exception as e:
            raise ExecutionError(
                f"{chain.count} batches of op types {chain.name!r} (hoisted LSTM chain, "
                f"training) failed: {type(e).__name__}: {e}") from e
        self.saves += [ChainSave(chain, self.first, h, arenas, (base, rw),
                                 (xs, tb, xh))] * chain.count


class _Skip:
    """A batch its chain's entry ran (and saved for)."""

    __slots__ = ()

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w_ht: Mapping[Any, Tensor]) -> None:
        pass


_SKIP = _Skip()


def _hidden(chain: ChainStep, params: Mapping[str, Tensor],
            widths: Sequence[tuple[int, int]]) -> int | None:
    """The one ``H`` of the chain's LSTM batches, ``None`` if they differ, a weight is not
    contiguous or a state arena is not ``2H`` wide (``widths``: the program's arenas)."""
    hs = {h for _, h in chain.binders}
    if len(hs) != 1 or not all(params[w].is_contiguous() for w in chain.weights):
        return None
    h = hs.pop()
    meta = chain.meta
    states = {int(s) for s in meta[meta[:, 0] != 2, 1]}
    return h if all(widths[chain.arenas[s]][1] == 2 * h for s in states) else None


def train_chains(program: Any, params: Mapping[str, Tensor], arenas: Sequence[Tensor],
                 saves: list[Any]) -> tuple[Sequence[Any], dict[Any, Tensor], list[np.ndarray]]:  # type: ignore[type-arg]
    """As :func:`~edbatch.executor._fast_lstm.fast_steps` for a training run that collects
    ``saves``: the program's chains as training entries (their batches' saves one
    :class:`ChainSave`), every other step ``None`` (its kernel, saving as before)."""
    chained = getattr(program, "chained", None)
    if not (chained and ENABLED[0] and _fast_chain.ENABLED[0] and qualifies(arenas)
            and agrees()):
        return (None,) * len(program.steps), {}, []
    entries: list[Any] = [None] * len(chained)
    weights: dict[Any, Tensor] = {}
    for i, f in enumerate(chained):
        if type(f) is not ChainStep:
            continue
        hidden = _hidden(f, params, program.arenas)
        if hidden is None:
            continue
        f.bind(params, weights)
        entries[i] = _Chain(f, i, hidden, saves)
        for k in range(i + 1, i + f.count):
            entries[k] = _SKIP
    if not any(entries):
        return (None,) * len(program.steps), {}, []
    return entries, weights, [a.numpy() for a in arenas]


@njit(cache=True)
def _mm_once(c, b, w, w0, ldw, n, k, ints, one, zero):  # type: ignore[no-untyped-def]
    ints[0], ints[1], ints[2] = n, b.shape[0], k
    _gemm_w(c, 0, c.shape[1], b, 0, b.shape[1], w, w0, ldw, ints, one, zero)


_AGREES: list[bool] = []


def agrees() -> bool:
    """Whether the bound ``?gemm`` with ``beta = 0`` gives what ``torch.mm`` gives, bit for
    bit, for a column block of a weight into a column block of the output (one row and
    several, float32 and float64; checked once per process)."""
    if not _AGREES:
        gen, ok = torch.Generator().manual_seed(0), _fast_chain.agrees()
        for dtype in (torch.float32, torch.float64):
            for rows in (1, 7):
                w = torch.randn(12, 9, generator=gen, dtype=dtype)  # 4H = 12, H = 3, D = 6
                b = torch.randn(rows, 12, generator=gen, dtype=dtype)
                ref = torch.full((rows, 6), 7.0, dtype=dtype)
                mine = ref.clone()
                torch.mm(b, w[:, 6:], out=ref[:, :3])
                _mm_once(mine.numpy(), b.numpy(), w.numpy(), 6, 9, 3, 12, _ints(),
                         np.ones(1, mine.numpy().dtype), np.zeros(1, mine.numpy().dtype))
                ok = ok and torch.equal(ref, mine)
        _AGREES.append(ok)
    return _AGREES[0]
