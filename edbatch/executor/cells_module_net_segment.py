"""The module network's attention segments: consecutive attention batches as one compiled call.

In a ``critical_path`` schedule of 64 CLEVR questions about 95 of the 119 batches are a run
of attention modules (``scene``, ``filter``, ``relate``, ``same``, ``unique``, ``union``,
``intersect``) between the scene batches and the terminal modules; each is tiny (``B x 10``
outputs), so per batch the executor's loop, the operand reads, the kernel adapter and the
torch calls cost far more than the arithmetic. :func:`attention_segments` (a program pass of
:mod:`edbatch.executor._program`, CPU) replaces each such run of the registered kernels (their
outputs one block of the attention arena, as the aligned and naive plans lay a run out) by
one :class:`Segment` step: one numba call (:mod:`.cells_module_net_segment_bodies`) runs
every batch of the run in schedule order on the arenas themselves (attention rows and scene
rows by index, parameters from one flat vector), and one call runs their backwards in
reverse order into the gradient arenas, with the parameter gradients summed in a flat vector
(the forward's intermediate values, ``sig(.)``, are recomputed there: nothing is saved). The
step's rows are the whole block and its attrs the run's (so the program's steps still tile
the attrs in plan row order); it is one kernel call, forward and backward.

Same equations as the cell kinds (:mod:`.cells_module_net`, :mod:`.cells_module_net_fused`);
with fused kernels off (``fused=False``), grad recording, or a dtype other than float32/64 a
segment runs its batches one by one through their own kernels (the reference path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._program import PROGRAM_PASSES, Program, Step, given_steps, new_step
from edbatch.executor._reads import indexed_reads, inplace_reads
from edbatch.executor.cells_module_net_fused import _param
from edbatch.executor.cells_module_net_segment_bodies import segment_backward, segment_forward
from edbatch.executor.kernels import KERNELS
from edbatch.memory.plan import Operand
from edbatch.workloads.module_net import MAX_OBJECTS

__all__ = ["CODES", "AttentionSegments", "Segment", "attention_segments"]

#: Kind -> its code in a segment's table (operands: attention slots, then the scene).
CODES = {"module_net.start": 0, "module_net.filter": 1, "module_net.relate": 2,
         "module_net.unique": 3, "module_net.union": 4, "module_net.intersect": 5,
         "module_net.same": 6}
_SCENE = {0: 0, 1: 1, 2: 1, 6: 1}  # code -> scene operand slot
_DTYPES = (torch.float32, torch.float64)
#: Fewest batches in a run worth a segment.
MIN_RUN = 2


# ---------------------------------------------------------------------- steps
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
                 att: int, scene: int, names: Sequence[str], offsets: Sequence[int],
                 operands: Sequence[tuple[Operand, ...]], device: torch.device) -> None:
        self.steps, self.table, self.rows = tuple(steps), table, rows
        self.att, self.scene, self.names, self.offsets = att, scene, tuple(names), offsets
        self.sizes = np.diff(offsets).tolist()
        self.operands, self.device = tuple(operands), device
        self._reads: list[tuple[Any, ...]] | None = None

    def reads(self) -> list[tuple[Any, ...]]:
        """Each batch's own operand reads (the reference path; compiled on first use: the
        program compiles none for a segment's batches: :meth:`AttentionSegments.claim`)."""
        if self._reads is None:
            self._reads = indexed_reads([s.kernel for s in self.steps], inplace_reads(
                self.operands, self.device, [0, 0, 0]), self.device)
        return self._reads

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
        for step, reads in zip(self.steps, self.reads(), strict=True):  # the reference path:
            region = arenas[step.out_arena].narrow(0, step.out_start, step.size)  # own kernels
            kept: list[Any] | None = [] if save is not None else None
            y = step.kernel(step.op, [read(arenas) for read in reads], params,
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
                if self.names:  # else the flat vector is a placeholder (no parameters)
                    parts = torch.from_numpy(pgrad).split_with_sizes(self.sizes)
                    for name, part in zip(self.names, parts, strict=True):
                        acc.add(name, part.view(params[name].shape))
                return
            for step, reads, kept in zip(reversed(self.steps), reversed(self.reads()),
                                         reversed(extra), strict=True):
                g_out = bufs[step.out_arena].narrow(0, step.out_start, step.size)
                got = step.kernel.backward(step.op, kept, g_out, params, step.attrs, acc)
                for read, g in zip(reads, got, strict=False):
                    if g is not None:
                        read.route(g, bufs)

        return [route]


_KIND = attrgetter("op.kind")  # a step's op kind (one C call a step)


def _codes(steps: Sequence[Step]) -> list[int | None]:
    """Each step's code in a segment's table if a segment can run it, else None (looked up
    once per op type: a program's steps of one op type share its kernel)."""
    known: dict[int, int | None] = {}
    out: list[int | None] = []
    for step in steps:
        key = id(step.op)
        if key not in known:
            code = CODES.get(step.op.kind)
            known[key] = code if code is not None and \
                step.kernel is KERNELS.get(step.op.kind) else None
        out.append(None if step.split else known[key])
    return out


def _fits(step: Step, ops: tuple[Operand, ...], code: int, att: int | None,
          scene: int | None, stop: int | None) -> bool:
    """Whether ``step`` (its ``code``, its operands ``ops``) continues a run writing
    attention arena ``att`` up to row ``stop`` and reading scene arena ``scene``."""
    if step.width != MAX_OBJECTS or (att is not None and (
            step.out_arena != att or step.out_start != stop)):
        return False
    slot = _SCENE.get(code)
    for k, o in enumerate(ops):
        if k == slot:
            if scene is not None and o.arena != scene:
                return False
        elif o.arena != step.out_arena:
            return False
    return True


def _runs(steps: Sequence[Step], operands: Sequence[tuple[Operand, ...]],
          codes: Sequence[int | None] | None = None
          ) -> list[tuple[int, int, int | None, int | None]]:
    """``(first, stop, attention arena, scene arena)`` of every run of ``steps`` a segment
    takes: at least :data:`MIN_RUN` consecutive batches of :data:`CODES` writing one block of
    one attention arena (see :func:`_fits`); ``codes``: :func:`_codes` of ``steps`` if known."""
    codes = _codes(steps) if codes is None else codes
    runs = []
    i = 0
    while i < len(steps):
        j, att, scene, stop = i, None, None, None
        while j < len(steps):
            code = codes[j]
            if code is None or not _fits(steps[j], operands[j], code, att, scene, stop):
                break
            att, stop = steps[j].out_arena, steps[j].out_start + steps[j].size
            slot = _SCENE.get(code)
            if slot is not None:
                scene = operands[j][slot].arena
            j += 1
        if j - i >= MIN_RUN:
            runs.append((i, j, att, scene))
        i = max(j, i + 1)
    return runs


class AttentionSegments:
    """The program pass (:class:`~edbatch.executor._program.ProgramPass`) of this module:
    claims the batches of every run :func:`_runs` finds (CPU; their per-batch reads are not
    compiled, a segment reads its operands by row itself) and makes each run one step."""

    def claim(self, steps: list[Step], operands: list[tuple[Operand, ...]],
              device: torch.device) -> tuple[list[int], Any]:
        if device.type != "cpu":
            return [], ([], None)
        # no attention batch (most workloads); a deferred step (LazySteps: a batch another
        # rewrite takes, a hoisted cell or a sum) is never one
        if CODES.keys().isdisjoint(map(_KIND, (s for _, s in given_steps(steps)))):
            return [], ([], None)
        codes = _codes(steps)  # the steps' kernels and ops are final: apply reuses them
        if codes.count(None) == len(codes):
            return [], ([], codes)
        runs = _runs(steps, operands, codes)
        return [b for i, j, _, _ in runs for b in range(i, j)], (runs, codes)

    def apply(self, program: Program, operands: list[tuple[Operand, ...]],
              device: torch.device, found: Any) -> Program:
        return attention_segments(program, operands, device, *found)


def attention_segments(program: Program, operands: list[tuple[Operand, ...]],
                       device: torch.device,
                       runs: list[tuple[int, int, Any, Any]] | None = None,
                       codes: Sequence[int | None] | None = None) -> Program:
    """Replace every run of at least :data:`MIN_RUN` consecutive attention batches (see the
    module doc) of ``program``'s steps, their outputs one block of the attention arena, by
    one segment step (CPU); ``runs`` and ``codes``: :func:`_runs` and :func:`_codes` of these
    steps if already found."""
    if device.type != "cpu" or (runs is not None and not runs):
        return program
    steps = program.steps
    codes = _codes(steps) if codes is None else codes
    if runs is None:
        runs = _runs(steps, operands, codes)
    out: list[Step] = []
    done, first_attr = 0, 0
    for i, j, att, scene in runs:
        out.extend(steps[done:i])
        first_attr += sum(s.size for s in steps[done:i])
        rows = sum(s.size for s in steps[i:j])
        out.append(_segment(steps[i:j], [(codes[k], operands[k]) for k in range(i, j)],
                            att, scene, program.attrs.narrow(0, first_attr, rows), device))
        first_attr += rows
        done = j
    out.extend(steps[done:])
    program.steps = tuple(out)
    return program


def _segment(steps: Sequence[Step], entries: list[Any], att: int, scene: int | None,
             attrs: Tensor, device: torch.device) -> Step:
    """One step running ``steps`` (rows ``attrs``), their outputs one block of ``att``."""
    names: list[str] = []
    offsets = [0]
    where: dict[str, int] = {}
    table: list[tuple[int, ...]] = []
    gathers: list[np.ndarray] = []
    at = 0
    for step, (code, ops) in zip(steps, entries, strict=True):
        params = step.op.params
        first = params[0] if params else None
        if first is not None and first not in where:
            where[first] = offsets[-1]
            for name in params:  # (w, b) / (u, c): consecutive in the flat vector
                names.append(name)
                offsets.append(offsets[-1] + _numel(step, name))
        operand = [0, 0]
        for k, o in enumerate(ops):  # a view as -(first row + 1), a gather by its offset
            if o.view is not None:
                operand[k] = -o.view.start - 1
            else:
                operand[k] = at
                gathers.append(o.gather)  # type: ignore[arg-type]
                at += len(o.gather)  # type: ignore[arg-type]
        if len(ops) < 2:
            operand[1] = operand[0]
        table.append((code, step.out_start, step.size, operand[0], operand[1],
                      where[first] if first is not None else 0))
    kernel = Segment(steps, np.array(table, dtype=np.int64),
                     np.concatenate(gathers) if gathers else np.zeros(0, np.int64),
                     att, att if scene is None else scene, names, offsets,
                     [ops for _, ops in entries], device)
    head = steps[0]
    return new_step(head.op, kernel, attrs, len(attrs), head.width, att, head.out_start,
                    (_Arenas(),), False, False, True)


def _numel(step: Step, name: str) -> int:
    """Elements of parameter ``name`` of a filter, relate or same op (``(F,)`` or
    ``(F, F)``, then ``(1,)``)."""
    assert step.op.in_shapes is not None
    width = step.op.in_shapes[-1][0] // MAX_OBJECTS
    if name != step.op.params[0]:
        return 1
    return width * width if step.op.kind == "module_net.same" else width

PROGRAM_PASSES.append(AttentionSegments())
