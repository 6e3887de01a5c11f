"""Training mode of the batched executor: per-batch autograd with a gradient arena.

Letting autograd see the whole batched run costs, for every operand read, a backward that
allocates a zero tensor the size of each *producer* batch and scatters into it, and then one
full-size addition per consumer of that batch (the leaf batch of 64 trees has dozens of
consumers). :class:`BatchedRun` instead wraps the run in one :class:`torch.autograd.Function`:

* **forward**: batches run in schedule order; each batch's operands are read from the
  earlier batches' *detached* outputs and become fresh leaves, so every batch records its
  own small autograd graph (kernel + parameters, fused weights included);
* **backward**: one gradient buffer per batch output (zeros, allocated once); batches are
  visited in reverse, ``torch.autograd.grad`` gives the gradients of the batch's operand
  leaves and parameters from its buffer, the parameter gradients are summed, and each operand
  gradient is routed into its producers' buffers by the read's own ``route`` (a slice
  addition for a view, ``index_add_`` for a gather), i.e. in time proportional to the rows
  read.

The values are those of the node-by-node reference (the same kernels); gradients agree up to
float summation order. Only first-order gradients are supported (no ``create_graph``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from edbatch.executor._program import Program, Step
    from edbatch.executor._timer import Timer

__all__ = ["BatchedRun", "ExecutorHooks", "run_training"]


class ExecutorHooks(Protocol):
    """What the training paths need of their executor (:class:`~edbatch.executor.
    torch_executor.TorchExecutor` provides it). A protocol, so this module and
    :mod:`~edbatch.executor._analytic` never import the executor that imports them."""

    dtype: torch.dtype
    device: torch.device
    sparse_grads: bool
    _timer: Timer | None

    def _apply(self, i: int, step: Step, operands: list[Tensor],
               params: Mapping[str, Tensor], out: Tensor | None,
               save: list[Tensor] | None = None) -> Tensor: ...

    def _run_inplace(self, program: Program, params: Mapping[str, Tensor],
                     saves: list[list[Tensor]] | None = None) -> list[Tensor]: ...


class BatchedRun(torch.autograd.Function):
    """``apply(executor, program, names, *param_values) -> output rows`` (see module doc)."""

    @staticmethod
    def forward(ctx: Any, executor: ExecutorHooks, program: Program,  # type: ignore[override]
                names: tuple[str, ...], *values: Tensor) -> tuple[Tensor, ...]:
        leaves = {n: v.detach().requires_grad_(v.requires_grad)
                  for n, v in zip(names, values, strict=True)}
        params = leaves
        timer = executor._timer
        dets: list[Tensor] = []
        tape: list[tuple[Tensor, list[Tensor]]] = []
        with torch.enable_grad():
            for i, step in enumerate(program.grad_steps()):
                reads = timer.reads(step, dets) if timer is not None else \
                    [read(dets) for read in step.reads]
                operands = [x.detach().requires_grad_() for x in reads]
                args = (i, step, operands, params, None)
                out = executor._apply(*args) if timer is None else \
                    timer.kernel(executor._apply, *args)
                tape.append((out, operands))
                dets.append(out.detach())
        ctx.program, ctx.tape, ctx.names = program, tape, names
        ctx.params = leaves
        ctx.shapes = [d.shape for d in dets]
        return tuple(dets[b][r:r + 1].clone()
                     for (_, _, _, r), b in zip(program.outputs, program.output_batch,
                                                strict=True))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        program, tape, leaves = ctx.program, ctx.tape, ctx.params
        ref = tape[0][0] if tape else None
        bufs = [torch.zeros(shape, dtype=ref.dtype, device=ref.device)  # type: ignore[union-attr]
                for shape in ctx.shapes]
        for ((_, _, _, r), b), g in zip(zip(program.outputs, program.output_batch,
                                            strict=True), grads, strict=True):
            if g is not None:
                bufs[b][r:r + 1] += g
        wanted = {n for n in ctx.names if leaves[n].requires_grad}
        total: dict[str, Tensor] = {}
        steps = program.grad_steps()
        for i in range(len(tape) - 1, -1, -1):
            out, operands = tape[i]
            if not out.requires_grad:
                continue
            step = steps[i]
            names = [n for n in step.op.params if n in wanted]  # registered kernels read
            targets = operands + [leaves[n] for n in names]      # only the op's parameters
            got = torch.autograd.grad(out, targets, bufs[i], retain_graph=True,
                                      allow_unused=True)
            for read, g in zip(step.reads, got[:len(operands)], strict=True):
                if g is not None:
                    read.route(g, bufs)  # type: ignore[attr-defined]
            for n, g in zip(names, got[len(operands):], strict=True):
                if g is not None:
                    if n in total:
                        total[n].add_(g)
                    else:  # fresh from autograd (at most an alias of a buffer already used)
                        total[n] = g.contiguous()
        return (None, None, None, *(total.get(n) for n in ctx.names))


def run_training(executor: ExecutorHooks, program: Program, params: Mapping[str, Tensor],
                 function: type[torch.autograd.Function] = BatchedRun) -> dict[int, Tensor]:
    """Run ``program`` through ``function`` (:class:`BatchedRun`, or
    :class:`~edbatch.executor._analytic.AnalyticRun`); graph output id -> value row."""
    names = tuple(params)
    outputs: Sequence[Tensor] | Tensor = function.apply(executor, program, names,
                                                        *params.values())
    if isinstance(outputs, Tensor):
        outputs = (outputs,)
    return {v: t for (v, _, _, _), t in zip(program.outputs, outputs, strict=True)}
