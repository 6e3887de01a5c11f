"""Per-run split of execution time into operand reads, gathers and kernel calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Timer", "timed"]


class Timer:
    """Per-run split of execution time into operand reads and kernel calls (profiling)."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.reset()

    def reset(self) -> None:
        self.read_s = self.gather_s = self.kernel_s = 0.0  # gathers are part of reads

    def stats(self) -> dict[str, float]:
        return {"exec/read_seconds": self.read_s, "exec/gather_seconds": self.gather_s,
                "exec/kernel_seconds": self.kernel_s}

    def reads(self, step: Any, sources: Sequence[Tensor]) -> list[Tensor]:
        """The step's operand reads, timed (each copying read also into the gathers)."""
        clock = time.perf_counter
        self.sync()
        start = clock()
        out = []
        for read in step.reads:
            t0 = clock()
            out.append(read(sources))
            if getattr(read, "gather", False):
                self.sync()
                self.gather_s += clock() - t0
        self.sync()
        self.read_s += clock() - start
        return out

    def kernel(self, run: Callable[..., Tensor], *args: Any) -> Tensor:
        """``run(*args)`` (a kernel call), timed."""
        t0 = time.perf_counter()
        result = run(*args)
        self.sync()
        self.kernel_s += time.perf_counter() - t0
        return result


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and its seconds (on CUDA: between two events on the stream)."""
    if device.type != "cuda":
        start = time.perf_counter()
        return fn(), time.perf_counter() - start
    begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    begin.record()
    result = fn()
    end.record()
    end.synchronize()
    return result, begin.elapsed_time(end) / 1e3
