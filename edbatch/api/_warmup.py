"""``edbatch.api.warmup()``: load the compiled scheduling core before the first mini-batch.

The first :meth:`DynamicBatch.run <edbatch.api.DynamicBatch.run>` of a process loads the
numba-compiled functions it uses (graph validation, the scheduler, the memory planner) from
numba's on-disk cache: about 0.3 s on this project's machine, more in a fresh checkout,
where they are compiled once (about a minute) and cached. Later runs pay nothing. Call
:func:`warmup` at start-up (e.g. while data loads) to pay it there instead of in the first
timed mini-batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from edbatch.memory import Strategy

__all__ = ["warmup"]


def warmup(schedulers: Sequence[str] = ("typewise_greedy",),
           strategies: Sequence[Strategy] = ("planned",)) -> float:
    """Run a two-instance toy mini-batch through every scheduler x memory strategy given
    (training and inference), so their compiled code is loaded; return the seconds spent.

    Pass the schedulers you will run (``"auto"`` tries ``AUTO_SCHEDULERS`` x
    ``AUTO_STRATEGIES``: warm those with
    ``warmup(AUTO_SCHEDULERS, AUTO_STRATEGIES)`` from :mod:`edbatch.executor.auto`).

    Raises:
        UnknownNameError: an unknown scheduler or strategy name.
    """
    from edbatch.api._batch import DynamicBatch

    start = time.perf_counter()
    batch = DynamicBatch()
    step = batch.cell(nn.Linear(2, 2), "step", [2], 2)
    both = batch.cell(_Join(), "join", [2, 2], 2)
    loss = batch.cell(_Sum(), "sq", [2], ())
    for scheduler in schedulers:
        for strategy in strategies:
            for grad in (True, False):
                for width in (2, 3):
                    with batch.instance():
                        a = step(batch.input(torch.ones(2)))
                        for _ in range(width):
                            a = step(a)
                        batch.add_loss(loss(both(a, step(a))))
                batch.run(scheduler, strategy=strategy, grad=grad)
    return time.perf_counter() - start


class _Join(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class _Sum(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a.sum(1)
