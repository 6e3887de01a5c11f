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
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.errors import ScheduleError
from edbatch.executor._attr_checks import check_operand_counts
from edbatch.executor._reads import Read, RowLocator, inplace_reads, merged, to_device
from edbatch.executor._reads import indexed_reads as _indexed
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.graph import Graph, OpType
from edbatch.memory.plan import MemoryPlan, Operand
from edbatch.schedule.schedule import Schedule

__all__ = ["PROGRAM_PASSES", "LazySteps", "Program", "ProgramPass", "Step", "check_matching",
           "compile_program", "given_steps", "new_step", "replace_steps", "split_alone"]


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
class ProgramPass(Protocol):
    """A rewrite of the inference steps at the end of :func:`compile_program` (a cells
    module appends its own to :data:`PROGRAM_PASSES`), e.g. several batches run as one step."""

    def claim(self, steps: list[Step], operands: list[tuple[Operand, ...]],
              device: torch.device) -> tuple[Collection[int], Any]:
        """``(batches, found)``: the batches :meth:`apply` will take over, asked before the
        inference reads are compiled (``steps`` have none yet; these keep ``reads=()``: the
        pass reads their operands itself), and what :meth:`apply` is handed."""
        ...

    def apply(self, program: Program, operands: list[tuple[Operand, ...]],
              device: torch.device, found: Any) -> Program:
        """``program`` rewritten (``found``: what :meth:`claim` returned)."""
        ...


#: The passes applied, in order, at the end of :func:`compile_program`.
PROGRAM_PASSES: list[ProgramPass] = []


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


_LATER = object()  # a LazySteps entry not built yet


class LazySteps(Sequence[Any]):
    """A program's per-step entries (its ``steps``, or its short steps) of which those at
    ``later`` are built on first access to any of them, all at once, by ``build`` (position
    -> entry); the others are given. An inference run that takes the short paths reads only
    the given ones (:meth:`get`), e.g. a hoisted program's projection and non-LSTM steps
    (:func:`~edbatch.executor._hoist.hoist_program`), never its recurrent batches' steps."""

    __slots__ = ("_build", "_items", "_later")

    def __init__(self, items: list[Any], later: Collection[int],
                 build: Callable[[], Mapping[int, Any]]) -> None:
        for i in later:
            items[i] = _LATER
        self._items, self._later, self._build = items, tuple(later), build

    def _all(self) -> list[Any]:
        if self._later:
            for i, entry in self._build().items():
                self._items[i] = entry
            self._later = ()
        return self._items

    @property
    def built(self) -> bool:
        """Whether every entry exists (the deferred ones were asked for)."""
        return not self._later

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._all()[i])
        entry = self._items[i]
        return self._all()[i] if entry is _LATER else entry

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    def deferred(self, i: int) -> bool:
        """Whether entry ``i`` is deferred (not built yet)."""
        return self._items[i] is _LATER

    def later(self) -> tuple[int, ...]:
        """The positions of the deferred entries (none once built)."""
        return self._later

    def entries(self) -> list[Any]:
        """A copy of the entries, the deferred ones as placeholders (none is built): for a
        new :class:`LazySteps` that defers at least the same positions."""
        return list(self._items)

    def given(self) -> Iterator[tuple[int, Any]]:
        """``(position, entry)`` of the entries that exist (none deferred is built)."""
        return ((i, e) for i, e in enumerate(self._items) if e is not _LATER)

    def replaced(self, new: Mapping[int, Any]) -> LazySteps:
        """A copy with the existing entries at ``new``'s positions replaced (the deferred
        ones come from the same ``build``)."""
        items = list(self._items)
        for i, entry in new.items():
            if items[i] is _LATER:
                raise ValueError(f"entry {i} is deferred; replace only given entries")
            items[i] = entry
        copy = _new(LazySteps)
        copy._items, copy._later, copy._build = items, self._later, self._build
        return copy


def replace_steps(steps: Sequence[Any], new: Mapping[int, Any]) -> Sequence[Any]:
    """``steps`` (a tuple or :class:`LazySteps`) with entries at ``new``'s positions
    replaced, deferred entries left deferred."""
    if isinstance(steps, LazySteps):
        return steps.replaced(new)
    out = list(steps)
    for i, entry in new.items():
        out[i] = entry
    return tuple(out)


def given_steps(steps: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """``(position, entry)`` of ``steps``' entries that exist (all of a tuple's; a
    :class:`LazySteps`' given ones, its deferred entries not built)."""
    return steps.given() if isinstance(steps, LazySteps) else enumerate(steps)


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


#: Vocabulary id -> (the vocabulary, its op types' :func:`_op_table` entries made so far):
#: the registry's kernels only (``kernels=None``; a caller's own mapping may change). The
#: vocabulary is held so its id stays its own while the entry lives.
_OP_TABLES: dict[int, tuple[Any, dict[int, tuple[OpType, Kernel, int, bool, bool, bool]]]] = {}


def _op_table(graph: Graph, op_ids: list[int], kernels: Mapping[str, Kernel] | None
              ) -> dict[int, tuple[OpType, Kernel, int, bool, bool, bool]]:
    """Per op type of ``op_ids`` (each batch's): ``(op, kernel, width, variadic, sum kernel,
    writes_out)`` (looked up once per op type, not once per batch; with the registry's
    kernels, once per vocabulary: a registered kind's kernel never changes). The mapping
    returned may hold further op types of the vocabulary."""
    vocab = graph.vocab
    if kernels is None:
        hit = _OP_TABLES.get(id(vocab))
        if hit is None:
            if len(_OP_TABLES) >= 16:
                _OP_TABLES.clear()
            hit = _OP_TABLES[id(vocab)] = (vocab, {})
        table = hit[1]
    else:
        table = {}
    sum_kernel = KERNELS.get("sum")
    for op_id in set(op_ids).difference(table):
        op: OpType = vocab[op_id]
        kernel = kernel_for(op, kernels)
        table[op_id] = (op, kernel, math.prod(op.out_shape), op.arity is None,
                        kernel is sum_kernel, bool(getattr(kernel, "writes_out", False)))
    return table


def _merge_repeated(kernel: Kernel, operands: tuple[Operand, ...]) -> tuple[Operand, ...]:
    """A variadic batch of a cell kind declaring ``merge_repeated = k`` (CPU): its repeated
    slots after the ``k`` fixed ones as one read of their rows, slot after slot (what the
    kernel would ``cat``; one gather and one gradient route, not one per slot)."""
    fixed = getattr(getattr(kernel, "cell", None), "merge_repeated", None)
    if fixed is None or len(operands) <= fixed + 1 or \
            len({o.arena for o in operands[fixed:]}) != 1:
        return operands
    rows = np.concatenate([o.rows() for o in operands[fixed:]])
    return (*operands[:fixed], merged(operands[fixed].arena, rows))


def check_matching(graph: Graph, schedule: Schedule, plan: MemoryPlan) -> None:
    """``ScheduleError`` unless ``plan`` is of ``schedule`` (as many batches) and of a graph
    of ``graph``'s size (a schedule and plan of another graph were an ``IndexError``)."""
    if plan.num_batches != schedule.num_batches:
        raise ScheduleError(f"the plan has {plan.num_batches} batches but the schedule has "
                            f"{schedule.num_batches}; plan the memory of this schedule")
    if len(plan.node_row) != graph.num_nodes:
        raise ScheduleError(f"the plan places {len(plan.node_row)} nodes but the graph has "
                            f"{graph.num_nodes}: the schedule and plan of another graph; make "
                            "both for this graph (scheduler(graph), plan_memory(graph, ...))")


def split_alone(size: int, operands: tuple[Operand, ...]) -> bool:
    """Whether a batch of a variadic op type is ``split`` (:class:`Step`): its node alone in
    the batch, its operands all in one arena (read as one merged read)."""
    return size == 1 and bool(operands) and len({o.arena for o in operands}) == 1


def _variadic(entries: list[tuple[OpType, Kernel, int, bool, bool, bool]], sizes: list[int],
              operand_lists: list[tuple[Operand, ...]], device: torch.device,
              rules: dict[str, tuple[int, int]]) -> list[bool]:
    """Each batch's ``split`` (:class:`Step`); a split batch's operands as one merged read
    and, on the CPU, a ``merge_repeated`` kind's repeated slots as one, in
    ``operand_lists``; into ``rules``, the ``counts_attr`` of each cell kind declaring one
    (:func:`~edbatch.executor._attr_checks.check_operand_counts`). Only variadic batches
    are visited."""
    splits = [False] * len(entries)
    for b in [b for b, entry in enumerate(entries) if entry[3]]:
        counted = getattr(getattr(entries[b][1], "cell", None), "counts_attr", None)
        if counted is not None:
            rules[entries[b][0].name] = counted
        operands = operand_lists[b]
        if split_alone(sizes[b], operands):  # its node alone in the batch: one merged read
            splits[b] = True
            if len(operands) > 1:
                rows = np.concatenate([o.rows() for o in operands])
                operand_lists[b] = (merged(operands[0].arena, rows),)
        elif device.type == "cpu":
            operand_lists[b] = _merge_repeated(entries[b][1], operands)
    return splits


def compile_program(graph: Graph, schedule: Schedule, plan: MemoryPlan, device: torch.device,
                    kernels: Mapping[str, Kernel] | None, skip: Collection[int] = ()
                    ) -> Program:
    """Precompute kernels, attrs and the inference reads of every batch.

    The training reads (which depend on which batch produced each row) are compiled on the
    first training run of the program. ``skip``: batches whose inference reads are left out
    (``reads=()``) because a rewrite compiles its own reads for them, as
    :func:`~edbatch.executor._hoist.hoist_program` does for the hoisted LSTM batches (their
    hoisted operands are read once by the projection step, not per batch).
    """
    counts = {False: [0, 0, 0], True: [0, 0, 0]}
    attr_nodes = plan.flat_order().astype(np.int64)
    flat = to_device(graph.attrs[attr_nodes], device)
    op_ids, bptr = schedule.flat()[:2]
    op_list = op_ids.tolist()
    table = _op_table(graph, op_list, kernels)
    entries = list(map(table.__getitem__, op_list))
    sizes = np.diff(bptr).tolist()  # (each batch's rows: its nodes)
    operand_lists: list[tuple[Operand, ...]] = list(plan.operands)
    rules: dict[str, tuple[int, int]] = {}
    splits = _variadic(entries, sizes, operand_lists, device, rules)
    if rules:
        check_operand_counts(graph, rules)
    out_arena, out_start = plan.output_rows()
    skipped = set(skip)
    starts = bptr.tolist()
    # each batch's attrs: a view of ``flat`` (every batch's in one split_with_sizes call,
    # unless most steps are deferred: then one narrow a given step, the split when built)
    attrs: list[Tensor] = list(flat.split_with_sizes(sizes)) \
        if sizes and 2 * len(skipped) < len(sizes) else []

    def make(b: int) -> Step:
        op, kernel, width, _, is_sum, writes_out = entries[b]
        view = attrs[b] if attrs else flat.narrow(0, starts[b], sizes[b])
        return new_step(op, kernel, view, sizes[b], width, out_arena[b], out_start[b], (),
                        splits[b], splits[b] and is_sum, writes_out)

    def build() -> dict[int, Step]:
        if not attrs:
            attrs.extend(flat.split_with_sizes(sizes))
        return {b: make(b) for b in later}

    # the skipped batches' steps (read by a rewrite only in training, profiling, chains off)
    # are deferred: made on first access (LazySteps), as made here before
    later = sorted(skipped)
    items: list[Any] = [None if b in skipped else make(b) for b in range(len(entries))]
    steps = LazySteps(items, later, build) if later else items
    claims = [rewrite.claim(steps, operand_lists, device) for rewrite in PROGRAM_PASSES]
    claimed = {b for batches, _ in claims for b in batches}
    claimed.update(skip)
    # reads of the batches no rewrite takes only (a hoisted program: most are taken)
    live = [b for b in range(len(entries)) if b not in claimed] if claimed \
        else range(len(entries))
    reads = _indexed([entries[b][1] for b in live],  # scene-like operands read by index (CPU)
                     inplace_reads([operand_lists[b] for b in live], device, counts[False]),
                     device)
    for b, step_reads in zip(live, reads):
        if step_reads:
            items[b].__dict__["reads"] = step_reads  # (set as new_step sets the fields)
    outputs = tuple((int(v), int(plan.node_arena[v]), int(plan.node_row[v]), -1)
                    for v in graph.outputs)
    grad: list[tuple[Step, ...]] = []
    output_batch: list[int] = []
    owner: list[weakref.ref[Program]] = []  # weak: no cycle, a dropped program is freed at once

    def grad_steps() -> tuple[Step, ...]:
        if not grad:
            program = owner[0]()
            locate = RowLocator(plan)
            grad.append(tuple(
                dataclasses.replace(step, reads=tuple(locate.read(o, device, counts[True])
                                                      for o in ops))
                for step, ops in zip(steps, operand_lists, strict=True)))
            output_batch.extend(locate.local(a, r)[0] for _, a, r, _ in outputs)
            if program is not None:
                program.outputs = tuple((v, a, r, locate.local(a, r)[1])
                                        for v, a, r, _ in outputs)
        return grad[0]

    program = Program(steps if later else tuple(steps), grad_steps,  # type: ignore[arg-type]
                      plan.arenas, outputs, output_batch, counts, flat, attr_nodes)
    for rewrite, (_, found) in zip(PROGRAM_PASSES, claims, strict=True):
        program = rewrite.apply(program, operand_lists, device, found)  # e.g. attention segments
    owner.append(weakref.ref(program))
    return program
