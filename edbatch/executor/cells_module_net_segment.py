"""The module network's attention segments: consecutive attention batches as one compiled call.

In a ``critical_path`` schedule of 64 CLEVR questions about 95 of the 119 batches are a run
of attention modules (``scene``, ``filter``, ``relate``, ``same``, ``unique``, ``union``,
``intersect``) between the scene batches and the terminal modules; each is tiny (``B x 10``
outputs), so per batch the executor's loop, the operand reads, the kernel adapter and the
torch calls cost far more than the arithmetic. :func:`attention_segments` (a program pass of
:mod:`edbatch.executor._program`, CPU) replaces each such run of the registered kernels by
one :class:`Segment` step: one numba call (:mod:`.cells_module_net_segment_bodies`) runs
every batch of the run in schedule order on the arenas themselves (attention rows and scene
rows by index, parameters from one flat vector), and one call runs their backwards in
reverse order into the gradient arenas, with the parameter gradients summed in a flat vector
(the forward's intermediate values, ``sig(.)``, are recomputed there: nothing is saved). The
other batches of the run stay in the program as empty steps (:class:`Placeholder`), so the
program keeps one step per batch.

Same equations as the cell kinds (:mod:`.cells_module_net`, :mod:`.cells_module_net_fused`);
with fused kernels off (``fused=False``), grad recording, or a dtype other than float32/64 a
segment runs its batches one by one through their own kernels (the reference path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._program import PROGRAM_PASSES, Program, Step, new_step
from edbatch.executor.cells_module_net_fused import _param
from edbatch.executor.cells_module_net_segment_bodies import segment_backward, segment_forward
from edbatch.executor.kernels import KERNELS
from edbatch.memory.plan import Operand
from edbatch.workloads.module_net import MAX_OBJECTS

__all__ = ["CODES", "Placeholder", "Segment", "attention_segments"]

#: Kind -> its code in a segment's table (operands: attention slots, then the scene).
CODES = {"module_net.start": 0, "module_net.filter": 1, "module_net.relate": 2,
         "module_net.unique": 3, "module_net.union": 4, "module_net.intersect": 5,
         "module_net.same": 6}
_SCENE = {0: 0, 1: 1, 2: 1, 6: 1}  # code -> scene operand slot
_DTYPES = (torch.float32, torch.float64)
#: Fewest batches in a run worth a segment.
MIN_RUN = 2


# ---------------------------------------------------------------------- steps
class Placeholder:
    """The kernel of a batch that its segment runs: nothing to do, forward or backward."""

    writes_out = True

    def __call__(self, op: Any, inputs: Any, params: Any, attrs: Tensor,
                 out: Tensor | None = None, save: Any = None) -> Tensor:
        assert out is not None
        return out

    def backward(self, op: Any, saved: Any, grad: Tensor, params: Any, attrs: Tensor,
                 acc: Any) -> list[Tensor | None]:
        return []


PLACEHOLDER = Placeholder()


class _Arenas:
    """The one read of a segment step: every arena (its route: the segment's backward)."""

    __slots__ = ()
    gather = False

    def __call__(self, outs: Sequence[Tensor]) -> Any:
        return outs

    def route(self, grad: Any, bufs: Sequence[Tensor]) -> None:
        grad(bufs)


class Segment:
    """The kernel of a segment step (see the module doc): ``steps`` the batches it runs."""

    writes_out = True

    def __init__(self, steps: Sequence[Step], table: np.ndarray, rows: np.ndarray,
                 att: int, scene: int, names: Sequence[str], offsets: Sequence[int]) -> None:
        self.steps, self.table, self.rows = tuple(steps), table, rows
        self.att, self.scene, self.names, self.offsets = att, scene, tuple(names), offsets
        self.sizes = np.diff(offsets).tolist()

    def _compiled(self, arenas: Sequence[Tensor]) -> bool:
        a = arenas[self.att]
        return _fused.enabled() and not torch.is_grad_enabled() and a.is_cpu and \
            a.dtype in _DTYPES and not a.requires_grad

    def _flat(self, params: Mapping[str, Tensor], dtype: torch.dtype) -> np.ndarray:
        """The segment's parameters as one vector (numpy views of the tensors, cached)."""
        want = np.float64 if dtype is torch.float64 else np.float32
        if not self.names:
            return np.zeros(1, want)
        return np.concatenate([_param(params[n]) for n in self.names]).astype(want, copy=False)

    def __call__(self, op: Any, inputs: Sequence[Any], params: Mapping[str, Tensor],
                 attrs: Tensor, out: Tensor | None = None, save: list[Any] | None = None
                 ) -> Tensor:
        arenas = inputs[0]
        assert out is not None
        if self._compiled(arenas):
            flat = self._flat(params, arenas[self.att].dtype)
            segment_forward(self.table, self.rows, arenas[self.att].numpy(),
                     arenas[self.scene].numpy(), flat)
            if save is not None:
                save.append((True, arenas, flat))
            return out
        inner: list[list[Any]] = []
        for step in self.steps:  # the reference path: batch by batch, own kernels
            region = arenas[step.out_arena].narrow(0, step.out_start, step.size)
            kept: list[Any] | None = [] if save is not None else None
            y = step.kernel(step.op, [read(arenas) for read in step.reads], params,
                            step.attrs, out=region, save=kept)
            if y is not region:
                region.copy_(y)
            inner.append(kept)  # type: ignore[arg-type]
        if save is not None:
            save.append((False, arenas, inner))
        return out

    def backward(self, op: Any, saved: Sequence[Any], grad: Tensor,
                 params: Mapping[str, Tensor], attrs: Tensor, acc: Any) -> list[Any]:
        compiled, arenas, extra = saved[0]

        def route(bufs: Sequence[Tensor]) -> None:
            if compiled:
                pgrad = np.zeros_like(extra)
                segment_backward(self.table, self.rows, arenas[self.att].numpy(),
                          arenas[self.scene].numpy(), extra, bufs[self.att].numpy(),
                          bufs[self.scene].numpy(), pgrad)
                parts = torch.from_numpy(pgrad).split_with_sizes(self.sizes)
                for name, part in zip(self.names, parts, strict=True):
                    acc.add(name, part.view(params[name].shape))
                return
            for step, kept in zip(reversed(self.steps), reversed(extra), strict=True):
                g_out = bufs[step.out_arena].narrow(0, step.out_start, step.size)
                got = step.kernel.backward(step.op, kept, g_out, params, step.attrs, acc)
                for read, g in zip(step.reads, got, strict=False):
                    if g is not None:
                        read.route(g, bufs)

        return [route]


def _entry(step: Step, operands: tuple[Operand, ...]
           ) -> tuple[int, list[tuple[int, np.ndarray]]] | None:
    """``(code, [(arena, rows) per operand])`` of a step a segment can run, else None."""
    code = CODES.get(step.op.kind)
    if code is None or step.split or step.kernel is not KERNELS.get(step.op.kind):
        return None
    return code, [(o.arena, o.rows()) for o in operands]


def attention_segments(program: Program, operands: list[tuple[Operand, ...]],
                       device: torch.device) -> Program:
    """Replace every run of at least :data:`MIN_RUN` consecutive attention batches (see the
    module doc) of ``program``'s steps by a segment step and placeholders (CPU)."""
    if device.type != "cpu":
        return program
    steps = list(program.steps)
    entries = [_entry(s, o) for s, o in zip(steps, operands, strict=True)]
    i = 0
    while i < len(steps):
        j = i
        att = scene = None
        while j < len(steps) and entries[j] is not None:
            code, reads = entries[j]  # type: ignore[misc]
            slot = _SCENE.get(code)
            ok = steps[j].width == MAX_OBJECTS and (att is None or steps[j].out_arena == att)
            for k, (arena, _) in enumerate(reads):
                if k == slot:
                    ok = ok and (scene is None or arena == scene)
                else:
                    ok = ok and arena == steps[j].out_arena
            if not ok:
                break
            att = steps[j].out_arena
            if slot is not None:
                scene = reads[slot][0]
            j += 1
        if j - i >= MIN_RUN:
            steps[i:j] = _segment(steps[i:j], entries[i:j], att, scene)  # type: ignore[arg-type]
        i = max(j, i + 1)
    program.steps = tuple(steps)
    return program


def _segment(steps: list[Step], entries: list[Any], att: int, scene: int | None
             ) -> list[Step]:
    names: list[str] = []
    offsets = [0]
    where: dict[str, int] = {}
    table = np.zeros((len(steps), 6), dtype=np.int64)
    rows: list[np.ndarray] = []
    at = 0
    for s, (step, (code, reads)) in enumerate(zip(steps, entries, strict=True)):
        first = step.op.params[0] if step.op.params else None
        if first is not None and first not in where:
            where[first] = offsets[-1]
            for name in step.op.params:  # (w, b) / (u, c): consecutive in the flat vector
                names.append(name)
                offsets.append(offsets[-1] + _numel(step, name))
        operand = [at, at]
        for k, (_, r) in enumerate(reads):
            operand[k] = at
            rows.append(r)
            at += len(r)
        table[s] = (code, step.out_start, step.size, operand[0], operand[1],
                    where.get(first, 0) if first is not None else 0)
    kernel = Segment(steps, table, np.concatenate(rows) if rows else np.zeros(0, np.int64),
                     att, att if scene is None else scene, names, offsets)
    head = steps[0]
    first_step = new_step(head.op, kernel, head.attrs, head.size, head.width, head.out_arena,
                          head.out_start, (_Arenas(),), False, False, True)
    return [first_step, *(new_step(s.op, PLACEHOLDER, s.attrs, s.size, s.width, s.out_arena,
                                   s.out_start, (), False, False, True) for s in steps[1:])]


def _numel(step: Step, name: str) -> int:
    """Elements of parameter ``name`` of a filter, relate or same op (``(F,)`` or
    ``(F, F)``, then ``(1,)``)."""
    assert step.op.in_shapes is not None
    width = step.op.in_shapes[-1][0] // MAX_OBJECTS
    if name != step.op.params[0]:
        return 1
    return width * width if step.op.kind == "module_net.same" else width

PROGRAM_PASSES.append(attention_segments)
