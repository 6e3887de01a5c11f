"""Training mode with hand-written backwards: in-place forward, one gradient arena per arena.

When every kernel of a program has a hand-written backward (:func:`~edbatch.executor.kernels.
with_backward`: the LSTM-family and Tree-LSTM cells, their losses, lookups, zero states and
sums), :class:`AnalyticRun` replaces :class:`~edbatch.executor._train.BatchedRun`:

* **forward**: exactly the inference run (outputs written in place into the planned arenas,
  operands read as the plan's views and gathers), except that each kernel also keeps the
  tensors its backward reads; no autograd graph is recorded;
* **backward**: one zero gradient arena per arena, same layout; batches are visited in
  reverse schedule order (so a batch's output gradient is complete when it is reached), the
  kernel's backward turns it into operand gradients, and each read routes its gradient back
  with the inverse of the read (a slice addition for a view, ``index_add_`` for a gather);
* **parameter gradients** are batched across batches (:class:`~edbatch.executor.kernels.
  ParamGrads`): one ``dY^T X`` matmul per weight for the whole run instead of one per batch,
  one ``index_add_`` per embedding table.

This is how DyNet trains (hand-written backward per node type); per batch it costs a few
element-wise kernels and one matmul, against an autograd graph walk. The values are the
kernels' own (the same functions as inference); gradients agree with autograd through the
node-by-node reference up to float summation order (``tests/executor/test_equivalence.py``;
gradcheck in fp64). First-order only (no ``create_graph``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._chain_train import ChainSave
from edbatch.executor._program import given_steps
from edbatch.executor.param_grads import ParamGrads

if TYPE_CHECKING:
    from edbatch.executor._program import Program
    from edbatch.executor._train import ExecutorHooks

__all__ = ["AnalyticRun", "analytic"]


def analytic(program: Program) -> bool:
    """Whether every step of ``program`` can run with hand-written backwards (a hoisted
    program's deferred steps, not built here, all can: hoisted LSTM cells and the registry's
    ``sum``, :func:`~edbatch.executor._hoist.hoist_program`)."""
    return all(step.stacked or hasattr(step.kernel, "backward")
               for _, step in given_steps(program.steps))


def _merged_grad(got: list[Tensor | None], rows: int, like: Tensor) -> Tensor:
    """The gradient of a split step's one merged read (``rows`` operands of one node) from
    its kernel's operand gradients (``[1, d]`` or narrower, the leading columns; missing or
    ``None``: zero)."""
    width = max((g.shape[1] for g in got if g is not None), default=like.shape[1])
    merged = like.new_zeros(rows, width)
    for j, g in enumerate(got):
        if g is not None:
            merged[j:j + 1, :g.shape[1]] += g
    return merged


class AnalyticRun(torch.autograd.Function):
    """``apply(executor, program, names, *param_values) -> output rows`` (see module doc)."""

    @staticmethod
    def forward(ctx: Any, executor: ExecutorHooks, program: Program,  # type: ignore[override]
                names: tuple[str, ...], *values: Tensor) -> tuple[Tensor, ...]:
        params = dict(zip(names, map(Tensor.detach, values), strict=True))  # (no generator)
        saves: list[list[Tensor]] = []
        arenas = executor._run_inplace(program, params, saves)
        ctx.program, ctx.saves, ctx.params, ctx.names = program, saves, params, names
        ctx.dtype, ctx.device, ctx.sparse = executor.dtype, executor.device, executor.sparse_grads
        ctx.fused = getattr(executor, "fused", None)  # the backward's kernels follow suit
        return tuple(arenas[a][r:r + 1].clone() for _, a, r, _ in program.outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        program, saves, params = ctx.program, ctx.saves, ctx.params
        bufs = [torch.zeros((rows, width), device=ctx.device, dtype=ctx.dtype)
                for rows, width in program.arenas]
        for (_, a, r, _), g in zip(program.outputs, grads, strict=True):
            if g is not None:
                bufs[a][r:r + 1] += g
        acc = ParamGrads(sparse_rows=ctx.sparse)
        with _fused.use(ctx.fused):
            _backward_steps(program.steps, saves, params, bufs, acc)
        total = acc.result(params)
        return (None, None, None, *(total.get(n) if ctx.needs_input_grad[3 + k] else None
                                    for k, n in enumerate(ctx.names)))


def _backward_steps(steps: Any, saves: list[list[Tensor]], params: dict[str, Tensor],
                    bufs: list[Tensor], acc: ParamGrads) -> None:
    """Visit the batches in reverse schedule order (see the module doc)."""
    i = len(steps)
    while i:
        i -= 1
        save = saves[i]
        if type(save) is ChainSave:  # a chain's batches (at the last of them): all at once
            save.backward(bufs, params, acc)
            i = save.first
            continue
        step = steps[i]
        out = bufs[step.out_arena].narrow(0, step.out_start, step.size)
        if step.stacked:
            (read,) = step.reads  # all operand rows of the variadic sum, merged
            read.route(out.clone().expand(len(read), out.shape[1]),  # type: ignore[arg-type]
                       bufs)  # type: ignore[attr-defined]
            continue
        got = step.kernel.backward(step.op, save, out,  # type: ignore[attr-defined]
                                   params, step.attrs, acc)
        if step.split:  # a variadic node alone: its operands are rows of one merged read
            got = [_merged_grad(got, len(step.reads[0]), out)]
        for read, g in zip(step.reads, got, strict=False):
            if g is not None:
                read.route(g, bufs)  # type: ignore[attr-defined]

