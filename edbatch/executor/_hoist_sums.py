"""A hoisted program's sum batches, deferred as its recurrent batches are (CPU).

A lattice mini-batch runs about 110 batches of ``k``-ary state sums between its hoisted arc
batches; a chained inference run reads them only as rows of its chains
(:data:`~edbatch.executor._fast_sum.SumRow`). :func:`deferred_sums` makes those rows from the
memory plan's operands directly (:func:`~edbatch.executor._fast_sum.plan_sum_rows`), so
:func:`~edbatch.executor._hoist.compile_hoisted` compiles no read for them and
:func:`~edbatch.executor._hoist.hoist_program` defers their steps and short steps
(:class:`~edbatch.executor._program.LazySteps`); :func:`sum_entries` builds both on first
use (training, chains off), the same as :func:`~edbatch.executor._program.compile_program`
and :func:`~edbatch.executor._fast_sum.sum_short` make them
(``tests/executor/test_hoist_sums.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from edbatch.executor._fast_sum import KIND, SumRow, plan_sum_rows, row_sum_step
from edbatch.executor._program import LazySteps, Program, Step
from edbatch.executor._reads import inplace_reads
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.graph import Graph, OpType
from edbatch.memory.plan import MemoryPlan
from edbatch.schedule.schedule import Schedule

__all__ = ["count_sums", "deferred_sums", "sum_entries", "sums_kept"]

_new, _set = object.__new__, object.__setattr__


def deferred_sums(graph: Graph, schedule: Schedule, plan: MemoryPlan, device: torch.device,
                  kernels: Mapping[str, Kernel] | None) -> dict[int, SumRow]:
    """Batch -> :data:`~edbatch.executor._fast_sum.SumRow` of the fixed-arity sum batches
    (the registry's ``sum`` kernel, not ``kernels``' own) whose short step the plan's
    operands give; none off the CPU."""
    kernel = KERNELS.get(KIND) if KIND in KERNELS else None
    if device.type != "cpu" or kernel is None or not getattr(kernel, "writes_out", False):
        return {}
    ops, bptr = schedule.flat()[:2]
    vocab = graph.vocab
    op_list = ops.tolist()
    wanted = {}
    for op_id in set(op_list):
        op: OpType = vocab[op_id]
        wanted[op_id] = op.kind == KIND and op.arity is not None and \
            kernel_for(op, kernels) is kernel
    picked = [b for b, op_id in enumerate(op_list) if wanted[op_id]]
    if not picked:
        return {}
    sizes = (bptr[1:] - bptr[:-1])[picked].tolist()
    types = [vocab[op_list[b]] for b in picked]
    return plan_sum_rows(plan, picked, sizes, [math.prod(op.out_shape) for op in types],
                         [op.name for op in types])


def sums_kept(program: Program, schedule: Schedule, sums: Mapping[int, SumRow]) -> bool:
    """Whether ``program`` (compiled with ``sums``' batches skipped) has one step per batch,
    each of ``sums``' a sum without reads (no program pass rewrote them)."""
    steps = program.steps
    lazy = steps if isinstance(steps, LazySteps) else None  # (a deferred step: as compiled)
    return len(steps) == schedule.num_batches and all(
        (lazy is not None and lazy.deferred(b)) or
        (not steps[b].reads and steps[b].op.kind == KIND) for b in sums)


def count_sums(plan: MemoryPlan, sums: Mapping[int, SumRow], counts: list[int]) -> None:
    """Add the reads ``compile_program`` would have compiled for ``sums``' batches to
    ``counts`` (``[views, gathers, gathered rows]``)."""
    for b in sums:
        for o in plan.operands[b]:
            if o.view is not None:
                counts[0] += 1
            else:
                counts[1] += 1
                counts[2] += len(o.gather)  # type: ignore[arg-type]


def sum_entries(steps: Sequence[Step], sums: Mapping[int, tuple[int, Any, SumRow]],
                device: torch.device, into_steps: dict[int, Step],
                into_short: dict[int, Any]) -> None:
    """Put the deferred sums' steps (``steps[b]`` with its reads compiled as
    ``compile_program`` compiles them) and :class:`~edbatch.executor._fast_sum.FastSumStep`
    entries into ``into_steps`` / ``into_short`` at their positions (``sums``: position ->
    ``(batch, its plan operands, its row)``)."""
    if not sums:
        return
    reads = inplace_reads([ops for _, ops, _ in sums.values()], device, [0, 0, 0])
    for (i, (b, _, row)), read in zip(sums.items(), reads, strict=True):
        fields = steps[b].__dict__.copy()  # (dataclasses.replace: ~10 us a batch)
        fields["reads"] = read
        new = _new(Step)
        _set(new, "__dict__", fields)
        into_steps[i], into_short[i] = new, row_sum_step(row)
