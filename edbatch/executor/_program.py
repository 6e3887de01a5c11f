"""Compiled programs of the batched executor: per batch its kernel, attrs and operand reads.

:func:`compile_program` turns (graph, schedule, memory plan) into a :class:`Program`: per
batch (:class:`Step`) its kernel, its ``int64`` attrs in row order (slices of one flat
tensor, so a captured CUDA graph takes new attrs in one copy), and how to read every operand
slot in inference (arena views and gathers); the training reads, which depend on which batch
produced each row, are compiled on the first training run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.executor._reads import Read, RowLocator, inplace_reads, merged, to_device
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.graph import Graph, OpType
from edbatch.memory.plan import MemoryPlan, Operand
from edbatch.schedule.schedule import Schedule

__all__ = ["Program", "Step", "compile_program", "new_step"]


@dataclass(frozen=True)
class Step:
    """One batch of the compiled program."""

    op: OpType
    kernel: Kernel
    attrs: Tensor
    size: int
    width: int
    out_arena: int
    out_start: int
    reads: tuple[Read, ...]
    split: bool  # a variadic op: one merged read, split into [1, d] rows
    stacked: bool  # a variadic sum: the merged read is reduced directly (no split)
    writes_out: bool  # the kernel fills the arena region itself (inference)


_new = object.__new__


def new_step(op: OpType, kernel: Kernel, attrs: Tensor, size: int, width: int,
             out_arena: int, out_start: int, reads: tuple[Read, ...], split: bool,
             stacked: bool, writes_out: bool) -> Step:
    """``Step(...)`` without the frozen dataclass's ``__init__`` (one ``object.__setattr__``
    per field: 0.94 against 0.41 us a step); the fields are set as ``__init__`` sets them."""
    step = _new(Step)
    step.__dict__.update(op=op, kernel=kernel, attrs=attrs, size=size, width=width,
                         out_arena=out_arena, out_start=out_start, reads=reads, split=split,
                         stacked=stacked, writes_out=writes_out)
    return step


@dataclass
class Program:
    """Compiled steps for both modes, plus the read counts of each mode."""

    steps: tuple[Step, ...]
    grad_steps: Callable[[], tuple[Step, ...]]  # compiled on first use (training only)
    arenas: tuple[tuple[int, int], ...]
    outputs: tuple[tuple[int, int, int, int], ...]  # node, arena, row, batch-local row
    output_batch: list[int]  # filled with the training reads
    counts: dict[bool, list[int]]  # grad -> [views, gathers, gathered rows]
    attrs: Tensor  # every batch's attrs in plan row order (the steps' attrs are slices)
    attr_nodes: NDArray[np.int64]  # the node of each entry of ``attrs``


def compile_program(graph: Graph, schedule: Schedule, plan: MemoryPlan, device: torch.device,
                    kernels: Mapping[str, Kernel] | None) -> Program:
    """Precompute kernels, attrs and the inference reads of every batch.

    The training reads (which depend on which batch produced each row) are compiled on the
    first training run of the program.
    """
    counts = {False: [0, 0, 0], True: [0, 0, 0]}
    attr_nodes = (np.concatenate(plan.row_order).astype(np.int64) if plan.row_order
                  else np.zeros(0, np.int64))
    flat = to_device(graph.attrs[attr_nodes], device)
    sum_kernel = KERNELS.get("sum")
    operand_lists: list[tuple[Operand, ...]] = []
    splits: list[bool] = []
    for b, batch in enumerate(schedule.batches):
        operands = plan.operands[b]
        split = graph.vocab[batch.op_id].arity is None and len(plan.row_order[b]) == 1 and \
            len(operands) > 0 and len({o.arena for o in operands}) == 1
        if split and len(operands) > 1:
            rows = np.concatenate([o.rows() for o in operands])
            operands = (merged(operands[0].arena, rows),)
        operand_lists.append(operands)
        splits.append(split)
    reads = inplace_reads(operand_lists, device, counts[False])
    steps: list[Step] = []
    sizes = [len(rows) for rows in plan.row_order]
    attrs = flat.split_with_sizes(sizes) if sizes else ()  # every batch's view in one call
    for b, batch in enumerate(schedule.batches):
        op: OpType = graph.vocab[batch.op_id]
        kernel = kernel_for(op, kernels)
        region = plan.outputs[b]
        steps.append(new_step(
            op, kernel, attrs[b], sizes[b], math.prod(op.out_shape),
            region.arena, region.start, reads[b], splits[b],
            splits[b] and kernel is sum_kernel, bool(getattr(kernel, "writes_out", False))))
    outputs = tuple((int(v), int(plan.node_arena[v]), int(plan.node_row[v]), -1)
                    for v in graph.outputs)
    grad: list[tuple[Step, ...]] = []
    output_batch: list[int] = []

    def grad_steps() -> tuple[Step, ...]:
        if not grad:
            locate = RowLocator(plan)
            grad.append(tuple(
                dataclasses.replace(step, reads=tuple(locate.read(o, device, counts[True])
                                                      for o in ops))
                for step, ops in zip(steps, operand_lists, strict=True)))
            output_batch.extend(locate.local(a, r)[0] for _, a, r, _ in outputs)
            program.outputs = tuple((v, a, r, locate.local(a, r)[1])
                                    for v, a, r, _ in outputs)
        return grad[0]

    program = Program(tuple(steps), grad_steps, plan.arenas, outputs, output_batch, counts,
                      flat, attr_nodes)
    return program
