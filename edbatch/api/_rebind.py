"""A cached segment's compiled program bound to a new segment's attrs.

Segments of one structure (:mod:`~edbatch.api._segments`) share their schedule, memory plan
and compiled program; only their attrs (token ids, expert choices) differ. :func:`rebind`
makes the copy of the cached program that reads this segment's attrs, from a fresh tensor
(a training run's backward may still read the earlier segment's), for the inference steps,
the training steps and, in a hoisted program, the projection steps that read the attrs of
the batches whose rows they compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.executor._hoist import HoistedProgram
from edbatch.executor._program import Program, Step
from edbatch.executor._reads import SliceRead, to_device

__all__ = ["InPlaceAttrs", "projects", "rebind", "rebind_typed"]


def projects(step: Step) -> bool:
    """Whether ``step`` is a hoisted projection (its kind ends in ``.projection``)."""
    return step.op.kind.endswith(".projection")


def rebind(program: Program, attrs: NDArray[np.int64], device: torch.device) -> Program:
    """A copy of ``program`` whose steps (inference and training) read ``attrs`` (a graph's
    attrs array, node order) from a new tensor; ``program`` itself is left as it is. A
    hoisted program's projection steps read their batches' new attrs, joined."""
    if isinstance(program, HoistedProgram) and program.base is not None:
        return _rebind_hoisted(program, rebind(program.base, attrs, device))
    flat, views, steps = _bound_steps(program, attrs, device)
    compiled: list[tuple[Step, ...]] = []
    base = program.grad_steps

    def grad_steps() -> tuple[Step, ...]:
        if not compiled:
            compiled.append(tuple(_with_attrs(s, v)
                                  for s, v in zip(base(), views, strict=True)))
            copy.outputs, copy.output_batch = program.outputs, program.output_batch
        return compiled[0]

    copy = dataclasses.replace(program, steps=steps, grad_steps=grad_steps, attrs=flat)
    return copy


def _sources(program: HoistedProgram) -> list[list[int]]:
    """Per step of ``program`` (hoisted) the indices of its base's steps whose attrs it
    reads: a cell step its own batch's, a projection step those of the batches whose input
    rows it computes, in row order."""
    cells = [s for s in program.steps if not projects(s)]
    out, at = [], 0
    for step in program.steps:
        if not projects(step):
            out.append([at])
            at += 1
            continue
        lo, hi = step.out_start, step.out_start + step.size
        out.append([k for _, k in sorted((r.lo, k) for k, s in enumerate(cells)
                                         for r in s.reads[1:2] if type(r) is SliceRead and
                                         r.b == step.out_arena and lo <= r.lo < hi)])
    return out


def _rebind_hoisted(program: HoistedProgram, base: Program) -> Program:
    """``program`` (hoisted) with the attrs of ``base`` (its base, rebound): every cell step
    takes its batch's, every projection step those of the batches reading its rows."""
    steps = [_with_attrs(step, base.steps[ks[0]].attrs if not projects(step) else
                         torch.cat([base.steps[k].attrs for k in ks]))
             for step, ks in zip(program.steps, _sources(program), strict=True)]
    return dataclasses.replace(program, steps=tuple(steps), base=base,
                               grad_steps=base.grad_steps, attrs=base.attrs)


def _bound_steps(program: Program, attrs: NDArray[np.int64], device: torch.device
                 ) -> tuple[Tensor, Sequence[Tensor], tuple[Step, ...]]:
    """``(flat, views, steps)``: ``program``'s attrs taken from ``attrs`` into a new tensor,
    its per-step views, and copies of the inference steps reading them."""
    flat = to_device(attrs[program.attr_nodes], device)
    sizes = [step.size for step in program.steps]
    views = flat.split_with_sizes(sizes) if sizes else ()
    return flat, views, tuple(_with_attrs(s, v)
                              for s, v in zip(program.steps, views, strict=True))


def _with_attrs(step: Step, attrs: Tensor) -> Step:
    new = object.__new__(Step)
    new.__dict__.update(step.__dict__)
    new.__dict__["attrs"] = attrs
    return new


def rebind_typed(program: Program, attrs: NDArray[np.int64], device: torch.device
                 ) -> Program:
    """:func:`rebind` for a typed segment's program (:mod:`~edbatch.api._typed`), whose
    inference and training steps are the same: the steps made once, no lazy second set,
    and the copy made field by field (no dataclass ``replace``: this runs every round)."""
    flat = attrs[program.attr_nodes]  # (a fresh array: the tensor may own it)
    host = torch.from_numpy(flat)
    flat_t = host if device.type == "cpu" else to_device(flat, device)
    views = flat_t.split_with_sizes([s.size for s in program.steps]) if program.steps else ()
    steps = tuple(_with_attrs(s, v) for s, v in zip(program.steps, views, strict=True))
    copy = object.__new__(Program)
    copy.__dict__.update(program.__dict__)
    copy.__dict__.update(steps=steps, grad_steps=lambda: steps, attrs=flat_t)
    return copy


class InPlaceAttrs:
    """A cached program for inference on the CPU whose steps read their attrs from one
    buffer, overwritten for each run (:meth:`bind`: one ``np.take``): no new tensor or
    steps per run. A hoisted program's projection steps read the attrs of the batches whose
    rows they compute (as :func:`rebind` joins them). Inference only: a training run's
    backward reads the attrs of its segment after later segments ran, so training runs
    rebind (:func:`rebind`, :func:`rebind_typed`)."""

    __slots__ = ("buffer", "nodes", "program")

    def __init__(self, program: Program) -> None:
        per_step = _step_nodes(program)
        self.nodes = np.concatenate(per_step) if per_step else np.zeros(0, np.int64)
        self.buffer = np.zeros(len(self.nodes), np.int64)
        flat = torch.from_numpy(self.buffer)
        views = flat.split_with_sizes([len(n) for n in per_step]) if per_step else ()
        steps = tuple(_with_attrs(s, v) for s, v in zip(program.steps, views, strict=True))
        if isinstance(program, HoistedProgram):  # (its base is not read at inference)
            self.program = dataclasses.replace(program, steps=steps)
        else:
            self.program = dataclasses.replace(program, steps=steps, attrs=flat,
                                               grad_steps=lambda: steps)

    def bind(self, attrs: NDArray[np.int64]) -> Program:
        """The program, its steps now reading ``attrs`` (a graph's attrs, node order)."""
        np.take(attrs, self.nodes, out=self.buffer)
        return self.program


def _step_nodes(program: Program) -> list[NDArray[np.int64]]:
    """Per inference step of ``program`` the nodes whose attrs it reads, in row order."""
    if isinstance(program, HoistedProgram) and program.base is not None:
        base = _step_nodes(program.base)
        return [base[ks[0]] if len(ks) == 1 else np.concatenate([base[k] for k in ks])
                for ks in _sources(program)]
    nodes = np.asarray(program.attr_nodes, np.int64)
    return np.split(nodes, np.cumsum([s.size for s in program.steps])[:-1]) \
        if program.steps else []
