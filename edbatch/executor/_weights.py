"""Gate weights as contiguous transposes: the right operand the small GEMMs of a run prefer.

``F.linear(x, W, b)`` multiplies by the strided transpose ``W^T``. On the CPU the batches'
small GEMMs run faster with a row-major right operand (measured with 1 thread on this
project's VM: ``[25, 450] x [450, 600]`` 244 -> 215 us, ``[37, 450] x [450, 600]``
317 -> 293 us, ``[8, 450] x [450, 600]`` 117 -> 98 us, ``[200, 300] x [300, 450]``
749 -> 717 us), so the cell kernels multiply by ``W^T`` made contiguous once per weight and
run (:data:`TRANSPOSED`, scoped to one executor run) when autograd does not record the
weight, and by a fresh
``W.t().contiguous()`` when it does: both paths use the same operand layout, so the same
GEMM and the same floats (the in-place and autograd paths stay bit-identical). On other
devices it multiplies by the strided ``W^T`` as ``F.linear`` does (a cached copy read by a
captured CUDA graph would not follow later in-place weight updates).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["TRANSPOSED", "Transposed", "linear_t"]


class Transposed:
    """Contiguous ``W[:, start:]^T`` per weight, made once per executor run and reused by
    every batch of it (:meth:`run` opens that scope; :meth:`TorchExecutor._run_inplace
    <edbatch.executor.torch_executor.TorchExecutor._run_inplace>` enters it). Outside a run
    every call makes a fresh copy. Within one run the weights do not change.

    Across runs a transpose is reused only where the weight's bits are those it was made
    from (:class:`Kept`): version counters alone cannot tell whether a weight changed in
    between (torch's fused Adam and writes through ``.data`` update a parameter without
    moving its ``_version``), so the weight is compared, bit for bit, with a copy kept
    beside its transpose (a compare of two contiguous buffers costs a fraction of a strided
    transposing copy into fresh memory: a Tree-LSTM inference run over 64 SST trees made
    four, and keeping them took 0.55-0.8 ms off the mini-batch's ~17 ms of CPU time in
    in-process A/B runs, more than the copies' warm cost of ~0.2 ms)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], tuple[Tensor, Tensor]] | None = None
        self.kept = Kept()

    @contextmanager
    def run(self) -> Iterator[None]:
        """Cache transposes until the outermost ``with`` ends (nested runs share it)."""
        outer = self.entries is not None
        if not outer:
            self.entries = {}
        try:
            yield
        finally:
            if not outer:
                self.entries = None

    def __call__(self, weight: Tensor, start: int = 0) -> Tensor:
        if self.entries is None:
            return weight.detach()[:, start:].t().contiguous()
        key = (id(weight), start)
        hit = self.entries.get(key)
        if hit is not None and hit[0] is weight:
            return hit[1]
        value = self.kept.get(weight, start) if KEEP[0] else None
        if value is None:
            value = weight.detach()[:, start:].t().contiguous()
            if KEEP[0]:
                self.kept.put(weight, start, value)
        self.entries[key] = (weight, value)  # held for the run: its id cannot be reused
        return value


#: Whether transposes are reused across runs (:class:`Kept`); ``[False]``: made afresh in
#: every run, as before (the A/B switch of ``benchmarks/runtime_phases.py``-style timings).
KEEP = [True]

_BITS = {torch.float32: np.int32, torch.float64: np.int64}


class Kept:
    """Transposes kept across executor runs, each with a copy of the weight it was made
    from; one is handed out again only if the weight is the same tensor (a weak reference:
    an entry goes with its weight), of the same shape, dtype and version, and equal to the
    copy bit for bit (its float bits compared as integers: ``-0.0`` is not ``0.0``, a NaN
    equals the same NaN). CPU float32/float64 contiguous weights only.

    A weight is kept once it was seen unchanged (same version) by two runs in a row, so
    training, whose weights move every step, pays no copy (only a version check)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], tuple[Any, int, Tensor, Tensor]] = {}
        self.seen: dict[tuple[int, int], tuple[Any, int]] = {}

    def get(self, weight: Tensor, start: int) -> Tensor | None:
        """The kept transpose of ``weight[:, start:]`` if ``weight`` is unchanged, else None."""
        hit = self.entries.get((id(weight), start))
        if hit is None or hit[0]() is not weight or hit[1] != weight._version:
            return None
        copy = hit[2]
        if copy.shape != weight.shape or copy.dtype != weight.dtype or \
                not weight.is_contiguous() or weight.device != copy.device:
            return None
        bits = _BITS[copy.dtype]  # (numpy's compare: a quarter of torch.equal's time)
        if not np.array_equal(weight.detach().numpy().view(bits), copy.numpy().view(bits)):
            return None
        return hit[3]

    def put(self, weight: Tensor, start: int, value: Tensor) -> None:
        """Keep ``value`` (``weight[:, start:]^T``) if ``weight`` qualifies and was seen with
        this version before."""
        if weight.device.type != "cpu" or weight.dtype not in _BITS or \
                not weight.is_contiguous():
            return
        key, version = (id(weight), start), weight._version
        seen = self.seen.get(key)
        if seen is None or seen[0]() is not weight or seen[1] != version:
            self.seen[key] = (self._ref(weight, key), version)
            return
        self.entries[key] = (seen[0], version, weight.detach().clone(), value)

    def _ref(self, weight: Tensor, key: tuple[int, int]) -> Any:
        entries, seen = self.entries, self.seen

        def drop(ref: Any) -> None:  # the weight is gone: so are its entries
            if key in seen and seen[key][0] is ref:
                del seen[key]
            if key in entries and entries[key][0] is ref:
                del entries[key]

        return weakref.ref(weight, drop)


#: The process-wide cache of transposed weights.
TRANSPOSED = Transposed()


def linear_t(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor | None = None) -> Tensor:
    """``x W^T + b`` (as ``F.linear``) with a contiguous ``W^T``: the cached one when autograd
    does not record ``weight`` (no grad mode, or it needs no gradient), else a differentiable
    copy made here."""
    if weight.device.type != "cpu":  # a CPU measurement; a cached copy would also go
        return torch.addmm(bias, x, weight.t(), out=out)  # stale in a captured CUDA graph
    if torch.is_grad_enabled() and weight.requires_grad:
        return torch.addmm(bias, x, weight.t().contiguous(), out=out)
    return torch.addmm(bias, x, TRANSPOSED(weight), out=out)
