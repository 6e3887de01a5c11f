"""What one run of the batched executor returns (:class:`RunResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["RunResult"]


@dataclass(frozen=True)
class RunResult:
    """What one batched run produced.

    Attributes:
        outputs: graph output node id -> value ``[1, d]`` (detached from the arenas).
        loss: the graph's single output as a scalar when it has exactly one output of one
            value, else ``None``.
        num_kernel_calls: kernel launches (one per batch).
        stats: ``exec/`` metrics: zero-copy reads, gathers, gathered rows, compile time,
            whether a captured CUDA graph was replayed and the seconds spent capturing.
        seconds: wall time of the run (compilation excluded; CUDA synchronised).
    """

    outputs: dict[int, Tensor]
    loss: Tensor | None
    num_kernel_calls: int
    stats: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
