"""Input-projection hoisting: one GEMM for the input part of many LSTM cell batches.

A cell-level LSTM node computes ``W [x; h] + b`` per batch (per time step), so a BiLSTM
runs one ``[B_t, E + H] x [E + H, 4H]`` GEMM per step where a hand-batched packed
``nn.LSTM`` runs the input projection ``W_x x`` of *all* time steps as one large GEMM and
only ``W_h h`` per step. :func:`hoist_program` rewrites a compiled
:class:`~edbatch.executor._program.Program` the same way, for every op type whose kind has a
:data:`~edbatch.executor.cells_hoist.HOISTS` entry:

* the type's batches are taken in schedule order; at the first batch ``b`` not projected
  yet, one **projection step** is inserted before it, covering every not yet projected batch
  of the type whose hoisted operands (the embedding, the lower layer's states; none for a
  lattice arc, which reads its token) are all produced by batches before ``b``: one GEMM over
  their rows. For the BiLSTM's first layer that is every batch of the type at once; a second
  layer's batches join as soon as the first layer of their sentences is done;
* the projections live in one extra arena per op type (``[nodes of the type, 4H]``), each
  batch's rows contiguous, so every cell batch reads its projection as a zero-copy slice and
  runs only ``addmm(projection, h, W_h^T)`` and the element-wise gates
  (:class:`~edbatch.executor.cells_hoist.LSTMRecurrent`);
* the hand-written backwards mirror it: a cell batch routes ``d gates`` into the projection
  arena's gradient (a slice addition), the projection step turns the group's gradient into
  its operands' gradients with one GEMM and records the weight's input column block.

Same nodes, same FLOPs, different batching of the input GEMM; the values equal the
unhoisted kernels' up to float summation order (``W_x x + b`` then ``+ W_h h`` instead of one
``W [x; h] + b``). Inference and the hand-written-backward training use the hoisted program;
the autograd training paths (``hand_backward=False``, custom kernels) run the original one.

The recurrent batches' :class:`~edbatch.executor._program.Step` and
:class:`~edbatch.executor._fast_lstm.FastStep` entries are deferred
(:class:`~edbatch.executor._program.LazySteps`, built on first use: training, profiling,
chains off); :func:`~edbatch.executor._fast_chain.chain_short` chains them from their rows
(``HoistedProgram.deferred``), so a chained inference run makes none of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edbatch.errors import ConfigError, UnknownNameError, did_you_mean
from edbatch.executor._fast_chain import Row
from edbatch.executor._fast_lstm import FastStep
from edbatch.executor._fast_sum import SumRow
from edbatch.executor._head_reads import (
    HeadPairRead,
    HeadRowsRead,
    HeadSliceRead,
    head_read,
    head_reads,
    pair_read,
)
from edbatch.executor._hoist_ready import groups as group_by
from edbatch.executor._hoist_ready import projection_operands, ready, ready_nodes
from edbatch.executor._hoist_sums import count_sums, deferred_sums, sum_entries, sums_kept
from edbatch.executor._program import (
    LazySteps,
    Program,
    Step,
    compile_program,
    new_step,
    split_alone,
)
from edbatch.executor._reads import (
    RowLocator,
    RowsRead,
    SliceRead,
    inplace_reads,
    to_device,
)
from edbatch.executor.cells_hoist import HOISTS, HoistSpec
from edbatch.executor.kernels import KERNELS, Kernel
from edbatch.graph import Graph, OpType
from edbatch.memory.plan import MemoryPlan, Operand
from edbatch.schedule.schedule import Schedule

_new, _set = object.__new__, object.__setattr__
_WHOLE_ROWS = (SliceRead, RowsRead)

__all__ = ["HeadPairRead", "HeadRowsRead", "HeadSliceRead", "HoistedProgram", "compile_hoisted",
           "head_reads", "hoist_kinds", "hoist_program", "hoisted_batches", "unhoisted"]


@dataclass
class HoistedProgram(Program):
    """A program with projection steps; ``base`` is the program it was rewritten from."""

    base: Program | None = None
    num_projections: int = 0
    short: Sequence[Any] = ()  # per step its FastStep (_fast_lstm) or None
    chained: tuple[Any, ...] = ()  # ``short`` with runs of FastSteps as one (_fast_chain)
    #: position -> chain row (``_fast_chain.Row``) of each hoisted batch: its ``steps`` and
    #: ``short`` entries are made on first use (:class:`~edbatch.executor._program.LazySteps`)
    deferred: Mapping[int, Row] = field(default_factory=dict)


def hoist_kinds(hoist: bool | str | Iterable[str]) -> frozenset[str]:
    """The op kinds to hoist for an executor's ``hoist`` argument.

    ``True``: every kind with a :data:`~edbatch.executor.cells_hoist.HOISTS` entry;
    ``False``: none; an iterable of kind names: those.

    Raises:
        ConfigError: ``hoist`` is neither a bool nor kind names.
        UnknownNameError: a named kind has no hoisted form (the message lists those that do).
    """
    if isinstance(hoist, bool):
        return frozenset(HOISTS) if hoist else frozenset()
    if isinstance(hoist, str):
        hoist = (hoist,)
    try:
        kinds = frozenset(hoist)
    except TypeError:
        raise ConfigError("hoist", hoist, "True, False or op kind names",
                          "pass e.g. hoist=True or hoist=['bilstm.l1_fwd']") from None
    for kind in sorted(kinds, key=str):
        if kind not in HOISTS:
            raise UnknownNameError(
                f"hoist: op kind {kind!r} has no hoisted input projection."
                f"{did_you_mean(str(kind), HOISTS)} Kinds that have one: {sorted(HOISTS)}; "
                f"or pass hoist=True for all of them")
    return kinds


def unhoisted(program: Program) -> Program:
    """The program ``program`` was rewritten from (itself if it was not)."""
    base = getattr(program, "base", None)
    return base if base is not None else program


def hoisted_batches(graph: Graph, schedule: Schedule, plan: MemoryPlan,
                    kinds: frozenset[str], overrides: Mapping[str, Kernel] | None = None
                    ) -> dict[int, list[int]]:
    """Op type -> its batches (schedule order) that :func:`hoist_program` rewrites: of
    ``kinds``, the registry's kernel (not ``overrides``'), not ``split``
    (:func:`~edbatch.executor._program.split_alone`). Their reads are
    :func:`compile_hoisted`'s ``skip`` (~60% of a BiLSTM program's reads)."""
    by_type: dict[int, list[int]] = {}
    hoisted: dict[int, int] = {}  # op type -> 0 not hoisted, 1 hoisted, 2 hoisted, variadic
    vocab = graph.vocab
    op_ids, bptr = schedule.flat()[:2]
    op_list = op_ids.tolist()
    if all(vocab[o].kind not in kinds for o in set(op_list)):  # (most programs: no batch)
        return by_type
    for b, op_id in enumerate(op_list):
        wanted = hoisted.get(op_id)
        if wanted is None:
            op: OpType = vocab[op_id]
            wanted = hoisted[op_id] = (1 + (op.arity is None)) * (op.kind in kinds and (
                overrides is None or overrides.get(op.kind) in (None, KERNELS.get(op.kind))))
        if wanted == 1 or (wanted == 2 and not split_alone(  # (a variadic batch may be split)
                int(bptr[b + 1] - bptr[b]), plan.operands[b])):
            by_type.setdefault(op_id, []).append(b)
    return by_type


def compile_hoisted(graph: Graph, schedule: Schedule, plan: MemoryPlan, device: torch.device,
                    kernels: Mapping[str, Kernel] | None, kinds: frozenset[str],
                    overrides: Mapping[str, Kernel] | None) -> Program:
    """``compile_program`` without the reads of :func:`hoisted_batches` (nor, on the CPU, of
    the sum batches whose short step :func:`deferred_sums` makes from the plan), then
    hoisted."""
    by_type = hoisted_batches(graph, schedule, plan, kinds, overrides) if kinds else {}
    sums = deferred_sums(graph, schedule, plan, device, kernels) if by_type else {}
    hoisted = [b for batches in by_type.values() for b in batches]
    program = compile_program(graph, schedule, plan, device, kernels, hoisted + list(sums))
    if sums and not sums_kept(program, schedule, sums):  # a program pass took one
        sums = {}
        program = compile_program(graph, schedule, plan, device, kernels, hoisted)
    return hoist_program(program, graph, schedule, plan, device, kinds, overrides, by_type,
                         sums) if by_type else program


def hoist_program(program: Program, graph: Graph, schedule: Schedule, plan: MemoryPlan,
                  device: torch.device, kinds: frozenset[str],
                  overrides: Mapping[str, Kernel] | None = None,
                  by_type: Mapping[int, list[int]] | None = None,
                  sums: Mapping[int, SumRow] | None = None) -> Program:
    """``program`` with the input projections of ``kinds`` hoisted (see the module doc);
    ``program`` itself when no batch has such a kind (or ``overrides`` replaces its kernel
    by another than the registry's, as a user's own cell does). ``by_type``:
    :func:`hoisted_batches`, if made; the rewritten batches' reads come from ``plan``
    (``program`` may skip them: :func:`compile_hoisted`). ``sums``:
    :func:`~edbatch.executor._hoist_sums.deferred_sums` whose steps ``program`` has without
    reads (:func:`~edbatch.executor._hoist_sums.sums_kept`): deferred as the recurrent
    batches' are."""
    if by_type is None:
        by_type = hoisted_batches(graph, schedule, plan, kinds, overrides)
    if not by_type:
        return program
    psteps = program.steps
    batch_of: list[np.ndarray] = []  # type: ignore[type-arg]  # (made if a variadic type needs it)
    step = np.empty(graph.num_nodes, np.int64)  # each node's batch
    _, bptr, nodes, _ = schedule.flat()
    step[nodes] = np.repeat(np.arange(len(bptr) - 1, dtype=np.int64), np.diff(bptr))
    base = np.arange(max(rows for rows, _ in plan.arenas), dtype=np.int64)
    before: dict[int, list[Step]] = {}
    arenas = list(program.arenas)
    ops = plan.operands
    out_arena, out_start = plan.output_rows()  # (lists: no Region object a batch)
    # the rewritten program's read counts: the reads compiled so far (none for the skipped
    # batches), these state reads, the projection steps' and one projection view a batch
    counted = list(program.counts[False])
    lazy = psteps if isinstance(psteps, LazySteps) else None  # (deferred: compiled skipped)
    sizes = np.diff(bptr).tolist()  # each batch's rows (its step's size)
    if any(not (lazy is not None and lazy.deferred(v[0])) and psteps[v[0]].reads
           for v in by_type.values()):  # compiled without skip (then all
        rewritten = {b for v in by_type.values() for b in v}  # have reads: a batch has operands)
        counted = _count(s for b, s in enumerate(psteps) if b not in rewritten)
    rows: dict[int, Row] = {}  # batch -> its chain row (_fast_chain.Row), in by_type's order
    states: list[Operand] = []  # their state operands, in that order
    for op_id, batches in by_type.items():
        op = graph.vocab[op_id]
        spec = HOISTS[op.kind]
        if op.arity is not None:  # every node has each hoisted slot: read the graph
            late = ready_nodes(graph, schedule, step, batches, spec.hoisted)
        else:
            batch_of = batch_of or RowLocator(plan).batch_of
            late = ready(plan, batch_of, batches, spec.hoisted, base)
        arena = len(arenas)
        groups = group_by(batches, late)
        order = [b for group in groups for b in group]
        offset = dict(zip(order, np.cumsum([0] + [sizes[b] for b in order])
                          .tolist(), strict=False))
        arenas.append((offset[order[-1]] + sizes[order[-1]], HoistSpec.gate_width(op)))
        for group in groups:
            before.setdefault(group[0], []).append(
                _projection_step(program, plan, device, op, spec, group, arena,
                                 offset[group[0]], base, counted, bptr, graph))
        counted[0] += len(batches)  # each batch's projection rows: a view
        weight, hidden, slot = op.params[spec.weight], HoistSpec.gate_width(op) // 4, spec.state
        mine = [ops[b][slot] for b in batches]  # the state operands
        states += mine
        views = [o.view for o in mine]
        gathers = [o.gather for o, v in zip(mine, views, strict=True) if v is None]
        counted[0] += len(views) - len(gathers)
        counted[1] += len(gathers)
        counted[2] += sum(map(len, gathers))
        name = op.name
        rows.update(zip(batches, [  # (one comprehension: no statement a batch)
            (0, o.arena, v.start, None, v.stop - v.start, arena, offset[b], out_arena[b],
             out_start[b], weight, hidden, name) if v is not None else
            (1, o.arena, 0, o.gather, len(o.gather), arena, offset[b], out_arena[b],
             out_start[b], weight, hidden, name)
            for b, o, v in zip(batches, mine, views, strict=True)], strict=True))
    at = np.arange(len(psteps))  # each batch's position once the projection steps are in
    for b, projections in before.items():
        at[b:] += len(projections)
    # the given steps as they are; a deferred one is a rewritten batch's (deferred again)
    # unless the program deferred others: then built
    out: list[Any] = lazy.entries() if lazy is not None and \
        rows.keys() | (sums or {}).keys() >= set(lazy.later()) else list(psteps)
    for b in sorted(before, reverse=True):  # the projection steps before their batches
        out[b:b] = before[b]
    at_list = at.tolist()
    deferred: dict[int, Any] = dict(zip(map(at_list.__getitem__, rows), rows.values(),
                                        strict=True))
    sums = sums or {}
    count_sums(plan, sums, counted)
    deferred.update((at_list[b], row) for b, row in sums.items())
    built = _Built(program, list(rows), states, rows, at, device,
                   {at_list[b]: (b, plan.operands[b], row) for b, row in sums.items()})
    counts = {**program.counts, False: counted}
    return HoistedProgram(LazySteps(out, deferred, built.steps),  # type: ignore[arg-type]
                          program.grad_steps, tuple(arenas), program.outputs,
                          program.output_batch, counts, program.attrs, program.attr_nodes,
                          base=program, num_projections=sum(len(v) for v in before.values()),
                          short=LazySteps([None] * len(out), deferred, built.short),
                          deferred=deferred)


class _Built:
    """The hoisted batches' steps and :class:`FastStep` entries of a hoisted program, made
    on first use (a run that is not all short paths: training, profiling, chains off), as
    :func:`hoist_program` made them eagerly before: each batch's fields with the hoisted
    cell's kernel, its state read and its projection rows."""

    def __init__(self, program: Program, batches: list[int], states: list[Operand],
                 rows: Mapping[int, Row], at: np.ndarray,  # type: ignore[type-arg]
                 device: torch.device,
                 sums: Mapping[int, tuple[int, tuple[Operand, ...], SumRow]]) -> None:
        self.made: list[tuple[dict[int, Step], dict[int, Any]]] = []
        self.args = program, batches, states, rows, at, device, sums

    def _make(self) -> tuple[dict[int, Step], dict[int, Any]]:
        if not self.made:
            program, batches, states, rows, at, device, sums = self.args
            psteps = program.steps
            reads = inplace_reads([(o,) for o in states], device, [0, 0, 0])
            steps, short = {}, {}
            for b, (state,) in zip(batches, reads, strict=True):
                _, _, _, _, size, arena, lo, oa, os_, weight, hidden, name = rows[b]
                fields = psteps[b].__dict__.copy()  # (dataclasses.replace: ~10 us a batch)
                fields["kernel"], fields["writes_out"] = HOISTS[fields["op"].kind].cell, True
                fields["reads"] = (state, SliceRead(arena, lo, lo + size))
                new = _new(Step)
                _set(new, "__dict__", fields)
                i = int(at[b])
                steps[i] = new
                if type(state) in _WHOLE_ROWS:  # whole [h; c] rows: the short path
                    short[i] = FastStep(state, arena, lo, size, oa, os_, weight, hidden, name)
            sum_entries(psteps, sums, device, steps, short)
            self.made.append((steps, short))
            self.args = ()  # type: ignore[assignment]
        return self.made[0]

    def steps(self) -> dict[int, Step]:
        return self._make()[0]

    def short(self) -> dict[int, Any]:
        return self._make()[1]


def _projection_step(program: Program, plan: MemoryPlan, device: torch.device, op: OpType,
                     spec: HoistSpec, group: list[int], arena: int, start: int,
                     base: np.ndarray, counts: list[int],  # type: ignore[type-arg]
                     bptr: np.ndarray, graph: Graph) -> Step:  # type: ignore[type-arg]
    """The step projecting ``group``'s nodes (in batch order) into ``arena`` from ``start``
    (``base``: see :func:`~edbatch.executor._hoist_ready.row_parts`); its reads are added to
    ``counts``; ``bptr``: the schedule's batch pointers; ``graph``: read a fixed-arity op
    type's operand rows from it (:func:`~edbatch.executor._hoist_ready.projection_operands`)."""
    # the group's steps' attrs concatenated: their rows of the program's flat attrs
    first, sizes = bptr[group], bptr[np.asarray(group) + 1] - bptr[group]
    at = np.cumsum(sizes) - sizes
    pick = np.repeat(first - at, sizes) + np.arange(int(at[-1] + sizes[-1]))
    operands = projection_operands(plan, group, spec.hoisted, base, graph if
                                   op.arity is not None else None, program.attr_nodes[pick])
    shapes = tuple(op.in_shapes[k] for k in spec.hoisted) if op.in_shapes else ()
    pair = pair_read(operands, shapes, spec, device)
    if pair is not None:  # the two h operands side by side from one gather
        reads, shapes = (pair,), shapes[:1]
        counts[1] += 1
        counts[2] += len(pair)
    else:
        (reads,) = inplace_reads([operands], device, counts) if operands else [()]
    if spec.heads and pair is None:  # only the h columns of the [h; c] state rows
        reads = tuple(head_read(read, op.in_shapes[k][0] // 2 if op.in_shapes else 0)
                      for read, k in zip(reads, spec.hoisted, strict=True))
    attrs = program.attrs[to_device(pick, program.attrs.device)]
    proj_op = OpType(f"{op.name}/projection", f"{op.kind}.projection", shapes,
                     (HoistSpec.gate_width(op),), op.params)
    return new_step(proj_op, spec.project, attrs, len(attrs), HoistSpec.gate_width(op),
                    arena, start, tuple(reads), False, False, True)


def _count(steps: Iterable[Step]) -> list[int]:
    """``[views, gathers, gathered rows]`` over every read of ``steps``."""
    views = gathers = rows = 0
    kinds: dict[type, int] = {}  # read class -> 1 gather, 0 view, -1 neither
    for step in steps:
        for read in step.reads:
            kind = kinds.get(type(read))
            if kind is None:
                kind = kinds[type(read)] = 1 if isinstance(read, RowsRead) else \
                    0 if isinstance(read, SliceRead) else -1
            if kind == 1:
                gathers += 1
                rows += read.idx.shape[0]  # type: ignore[attr-defined]
            elif kind == 0:
                views += 1
    return [views, gathers, rows]
