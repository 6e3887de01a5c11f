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

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["TRANSPOSED", "Transposed", "linear_t"]


class Transposed:
    """Contiguous ``W[:, start:]^T`` per weight, made once per executor run and reused by
    every batch of it (:meth:`run` opens that scope; :meth:`TorchExecutor._run_inplace
    <edbatch.executor.torch_executor.TorchExecutor._run_inplace>` enters it). Outside a run
    every call makes a fresh copy. The cache never outlives a run: version counters cannot
    tell whether a weight changed in between (torch's fused Adam and writes through
    ``.data`` update a parameter without moving its ``_version``), and within one run the
    weights do not change."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], tuple[Tensor, Tensor]] | None = None

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
        value = weight.detach()[:, start:].t().contiguous()
        self.entries[key] = (weight, value)  # held for the run: its id cannot be reused
        return value


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
