"""Segments of the same structure run on one schedule, memory plan and compiled program.

:meth:`DynamicBatch.run_programs <edbatch.api.DynamicBatch.run_programs>` runs a segment per
synchronisation point, and most of them repeat one structure: every greedy decoding step of
a mini-batch, every early-exit step, records the same op types with the same operand pattern
and differs only in its attrs (token ids) and the rows its ``value/`` and input nodes read.
Their schedule, memory plan and compiled program are then the same, so they are made once:
a :class:`SegmentCache` keys them on the segment's structure (its op ids, operand counts,
operands and outputs, the vocabulary and the scheduler, in bytes made once per round
structure by :mod:`edbatch.api._rounds`); a hit binds this segment's attrs (rows: never cached)
to the program (:func:`~edbatch.api._rebind.rebind`: a fresh tensor, as a training backward may
still read the last one's; one buffer per typed segment at CPU inference, ``InPlaceAttrs``).

The cache lives with the batch (:func:`segment_state`; registering a kernel starts a new
one) and serves later mini-batches too; it keeps :data:`CACHE_SIZE` structures (LRU). A
miss whose op types read each other without cycles (a MoE layer, a decoding round) is
planned as one batch per op type (:mod:`~edbatch.api._typed`), not through the scheduler,
memory planner and read compilation.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.api import _typed
from edbatch.api._rebind import InPlaceAttrs, projects, rebind, rebind_typed
from edbatch.api._rounds import Lru, RoundPlan, Rounds, value_groups, whole_batch
from edbatch.api._typed import run_typed, typed_program
from edbatch.api._values import Capture, Values
from edbatch.errors import ExecutionError
from edbatch.executor._fast_chain import chain_short
from edbatch.executor._hoist import HoistedProgram, compile_hoisted, head_reads
from edbatch.executor._program import Program, Step
from edbatch.executor._reads import SelectRead
from edbatch.executor.cells_hoist import HOISTS
from edbatch.executor.kernels import KERNELS, stacked_sum
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, Strategy, plan_memory
from edbatch.schedule import Schedule, Scheduler
from edbatch.schedule.compiled import CompiledScheduler
from edbatch.schedule.zoo import NamedScheduler

__all__ = ["CACHE_SIZE", "Entry", "SegmentCache", "SegmentExecutor", "SegmentState",
           "add_values", "rebind", "run_segment", "segment_state", "value_groups"]

#: Segment structures kept per batch.
CACHE_SIZE = 256


@dataclass
class Entry:
    """One segment structure: its graph (of the first segment), schedule, memory plan,
    compiled program (after its first run) and where each batch's rows go in
    :class:`~edbatch.api._values.Values` (``nodes``, ``batch``, ``row``)."""

    source: Graph | Callable[[], Graph]  # (a typed segment's: made when first read)
    schedule: Schedule
    plan: MemoryPlan | None  # None: a typed segment (:mod:`~edbatch.api._typed`)
    program: Program | None = None
    nodes: NDArray[np.int64] | None = None
    batch: NDArray[np.int64] | None = None
    row: NDArray[np.int64] | None = None
    span: bool = False  # ``nodes`` is ``0..len(nodes)-1`` in order (a typed segment's)
    whole: int = -1  # the batch made of exactly the new nodes, in order (-1: none)
    inplace: InPlaceAttrs | None = None  # the program's CPU inference copy
    vocab: Any = None  # the graph's vocabulary

    @property
    def graph(self) -> Graph:
        if not isinstance(self.source, Graph):
            self.source = self.source()
        return self.source


class SegmentExecutor(TorchExecutor):
    """A :class:`TorchExecutor` that runs a given compiled program (a cached segment's,
    bound to this segment's attrs) instead of compiling one, and keeps the last compiled."""

    def __init__(self, device: torch.device, dtype: torch.dtype, capture: Capture) -> None:
        super().__init__(device, dtype, kernels=capture.kernels, hoist=False, cache_size=1)
        self.given: Program | None = None
        self.compiled: Program | None = None
        self.capture = capture
        self._joined: tuple[tuple[Step, ...], tuple[Step, ...]] | None = None
        # the wrapped registry ``sum`` kernel (the loss sum's): its variadic node is reduced
        # on the stacked read, as the plain executor does, not split into ``[1, d]`` rows
        sum_kernel = capture.kernels.get("sum")
        self.stacked_sum = sum_kernel if sum_kernel is not None and \
            capture.originals.get("sum") is KERNELS.get("sum") else None

    def _apply(self, i: int, step: Step, operands: list[Tensor], params: Any,
               out: Tensor | None, save: list[Tensor] | None = None) -> Tensor:
        if step.split and step.kernel is self.stacked_sum and save is None:
            total = stacked_sum(operands[0])  # one reduction, one captured output
            total = total if out is None else out.copy_(total)
            self.capture.outputs.append(total)
            return total
        return super()._apply(i, step, operands, params, out, save)

    def _program(self, graph: Graph, schedule: Schedule, plan: MemoryPlan
                 ) -> tuple[Program, bool]:
        given, self.given = self.given, None
        if given is not None:
            return given, False
        # hoisted by the registry's kernels, not their capturing wrappers
        program = compile_hoisted(graph, schedule, plan, self.device, self.kernels,
                                  hoist_kinds_of(graph, schedule), self.capture.originals)
        program = chain_short(head_reads(program), self.device)
        self.compiled = program
        return program, True

    def _run_grad(self, program: Program, params: Any) -> dict[int, Tensor]:
        """:meth:`TorchExecutor._run_grad` with reads of rows scattered over several batches
        joined first (:class:`JoinedSelect`)."""
        steps = program.grad_steps()
        if self._joined is None or self._joined[0] is not steps:
            self._joined = (steps, tuple(_joined_step(s) for s in steps))
        outs: list[Tensor] = []
        for i, step in enumerate(self._joined[1]):
            outs.append(self._call(i, step, outs, params))
        return {v: outs[b][r:r + 1]
                for (v, _, _, r), b in zip(program.outputs, program.output_batch, strict=True)}

    def _run_inplace(self, program: Program, params: Any,
                     saves: list[list[Tensor]] | None = None) -> list[Tensor]:
        arenas = super()._run_inplace(program, params, saves)
        if isinstance(program, HoistedProgram):  # its hoisted cells are not captured
            self.capture.outputs[:] = [arenas[s.out_arena].narrow(0, s.out_start, s.size)
                                       for s in program.steps if not projects(s)]
        return arenas


def hoist_kinds_of(graph: Graph, schedule: Schedule) -> frozenset[str]:
    """The kinds whose input projections a segment hoists (one GEMM for all their batches'
    inputs, :mod:`~edbatch.executor._hoist`): hoistable, with several batches here."""
    seen: dict[int, int] = {}
    for batch in schedule.batches:
        seen[batch.op_id] = seen.get(batch.op_id, 0) + 1
    return frozenset(graph.vocab[o].kind for o, k in seen.items()
                     if k > 1 and graph.vocab[o].kind in HOISTS)


class JoinedSelect:
    """A training read of rows scattered over several batch outputs (a MoE combination's
    read of its tokens' expert outputs) as one ``cat`` of them and one ``index_select``:
    backward zero-fills one gradient, where a ``SelectRead`` makes an ``index_put`` and a
    gradient copy per batch. Only where the outputs hold <= :data:`~edbatch.api._typed.JOIN_AT`
    x the rows (the typed path's threshold, one knob for both)."""

    __slots__ = ("flat", "read")
    gather = True

    def __init__(self, read: SelectRead) -> None:
        self.read, self.flat = read, None  # flat: the rows' index in the joined outputs

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        groups = self.read.groups
        if self.flat is None:
            sizes = [int(outs[b].shape[0]) for b, _, _ in groups]
            if sum(sizes) > _typed.JOIN_AT * self.read.rows:
                self.flat = False
            else:
                flat = torch.empty(self.read.rows, dtype=torch.int64, device=groups[0][1].device)
                at = 0
                for (_, idx, pos), size in zip(groups, sizes, strict=True):
                    flat[pos] = idx + at
                    at += size
                self.flat = flat
        if self.flat is False:
            return self.read(outs)
        return torch.cat([outs[b] for b, _, _ in groups]).index_select(0, self.flat)

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        self.read.route(grad, bufs)



def _joined_step(step: Step) -> Step:
    if not any(type(r) is SelectRead and len(r.groups) > 1 for r in step.reads):
        return step
    new = object.__new__(Step)
    new.__dict__.update(step.__dict__)
    new.__dict__["reads"] = tuple(JoinedSelect(r) if type(r) is SelectRead and
                                  len(r.groups) > 1 else r for r in step.reads)
    return new


class SegmentCache(Lru[Entry]):
    """Schedules, memory plans and compiled programs by segment structure (LRU)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        super().__init__(size)

    @staticmethod
    def maker(make: Scheduler) -> Any:
        """``make`` as the cache keys it: a registry scheduler by its rule and name (a new
        instance of it hits too), any other by itself."""
        kind = type(make)
        return (make.rule, make.name) if kind is CompiledScheduler else \
            (make.fn, make.name) if kind is NamedScheduler else make

    @staticmethod
    def key(vocab: Any, make: Scheduler, strategy: Any, *arrays: NDArray[Any]
            ) -> tuple[Any, ...]:
        """The structure of a segment given as arrays (op ids, operand counts, operands,
        outputs, sizes) with its vocabulary, scheduler (:meth:`maker`) and strategy. Not
        the instances: the schedulers and the memory planner read op types and operands
        only."""
        return (id(vocab), SegmentCache.maker(make), strategy,
                *((a.dtype.str, len(a), a.tobytes()) for a in arrays))


@dataclass
class SegmentState:
    """A batch's capturing kernels, executor and segment cache (for one kernel set)."""

    capture: Capture
    executor: SegmentExecutor
    cache: SegmentCache
    kernels: dict[str, Any]  # the batch's kernels it was made for (a copy)
    keep: tuple[Any, ...]  # the objects whose ids key the cache (kept alive)
    rounds: Rounds  # round plans by signature (:mod:`~edbatch.api._rounds`)


_STATES: weakref.WeakKeyDictionary[Any, SegmentState] = weakref.WeakKeyDictionary()


def segment_state(batch: Any) -> SegmentState:
    """``batch``'s :class:`SegmentState`, a new one when its kernels changed since (cells
    and lookups register theirs on first use) or its device or dtype did."""
    state = _STATES.get(batch)
    kernels = batch.kernels
    if state is None or len(state.kernels) != len(kernels) or state.kernels != kernels or \
            state.executor.dtype != batch.dtype or state.keep[0] != batch.device:
        capture = Capture(kernels)
        state = SegmentState(capture, SegmentExecutor(batch.device, batch.dtype, capture),
                             SegmentCache(CACHE_SIZE), dict(kernels), (batch.device,),
                             Rounds(CACHE_SIZE))
        _STATES[batch] = state
    return state


def run_segment(state: SegmentState, plan: RoundPlan, make: Scheduler, memory: Strategy,
                attrs: NDArray[np.int64], instance: Callable[[], NDArray[np.int32]],
                params: dict[str, Tensor], grad: bool
                ) -> tuple[Graph | Callable[[], Graph], Schedule, Entry, Any]:
    """Build (or take from the cache) the segment's graph, schedule, memory plan (made
    with ``memory``) and program and run it: ``plan`` gives its structure (arrays, cache
    key), ``attrs`` its attrs, ``instance()`` its instances. Returns the graph, or for a
    typed segment of a structure seen before a function making it (the instances are only
    worked out when it is read), the schedule, the cache entry and the executor result."""
    vocab, cache, executor = plan.vocab, state.cache, state.executor
    key = plan.key  # (None: not looked up, not kept)
    entry = None if key is None else cache.get(key)
    if entry is not None and entry.vocab is not vocab:  # an id reused
        entry = None
    state.keep = (state.keep[0], vocab, make)
    if entry is not None and entry.plan is None:  # typed: rebind the attrs and run
        assert entry.program is not None
        if grad or executor.device.type != "cpu":
            program = rebind_typed(entry.program, attrs, executor.device)
        else:
            if entry.inplace is None:
                entry.inplace = InPlaceAttrs(entry.program)
            program = entry.inplace.bind(attrs)
        base = entry.graph
        return (lambda: dataclasses.replace(base, attrs=_frozen(attrs, np.int64),
                                            instance=_frozen(instance(), np.int32)),
                entry.schedule, entry, run_typed(executor, program, params, grad))
    arrays = plan.arrays
    if entry is None:
        op_ids, counts = arrays["op_ids"], arrays["counts"]
        ptr = np.zeros(len(op_ids) + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        typed = typed_program(SegmentArrays(vocab, op_ids, ptr, arrays["operands"], attrs,
                                            arrays["outputs"]),
                              state.capture.kernels, executor.device) if _typed.TYPED else None

        made = _graph_maker(vocab, op_ids, ptr, arrays, attrs, instance)  # (checked when read)
        if typed is not None:
            program = typed.program
            # (the entry's maker without instance(), which would keep this mini-batch's runner,
            # values and autograd graph alive with the entry: ~3.5 MB per MoE layer entry)
            zeros = np.zeros(len(op_ids), np.int32)
            entry = Entry(_graph_maker(vocab, op_ids, ptr, arrays, attrs, lambda: zeros),
                          typed.schedule, None, program, vocab=vocab)
            c, m = (int(x) for x in arrays["sizes"])
            entry.nodes, entry.span = np.arange(m, dtype=np.int64), True
            entry.batch, entry.row = typed.batch_of[c:c + m], typed.row_of[c:c + m]
            entry.whole = whole_batch(typed.batch_of, typed.row_of, c, m)
            _keep(cache, key, entry)
            return made, entry.schedule, entry, run_typed(executor, program, params, grad)
        graph = made()
        schedule = make(graph)
        # (this cache is the plan's memo: no second hash of the structure per miss)
        entry = Entry(graph, schedule, plan_memory(graph, schedule, memory, cache=False),
                      vocab=vocab)
        executor.given = None
    else:
        inst = instance()
        graph = dataclasses.replace(entry.graph, attrs=_frozen(attrs, np.int64),
                                    instance=_frozen(inst, np.int32))
        assert entry.program is not None
        if grad or executor.device.type != "cpu":
            executor.given = rebind(entry.program, graph.attrs, executor.device)
        else:
            if entry.inplace is None:
                entry.inplace = InPlaceAttrs(entry.program)
            executor.given = entry.inplace.bind(attrs)
    state.capture.outputs.clear()
    result = executor.run(graph, entry.schedule, entry.plan, params, grad=grad)
    if entry.program is None:
        entry.program = executor.compiled
        _keep(cache, key, entry)
    return graph, entry.schedule, entry, result


def _graph_maker(vocab: Any, op_ids: NDArray[Any], ptr: NDArray[np.int64],
                 arrays: dict[str, NDArray[Any]], attrs: NDArray[np.int64],
                 instance: Callable[[], NDArray[Any]]) -> Callable[[], Graph]:
    """A segment's graph, made (and checked) only when called, its instances from
    ``instance``."""
    return lambda: Graph.from_arrays(vocab, op_ids, ptr, arrays["operands"], attrs=attrs,
                                     instance=instance(), outputs=arrays["outputs"])


def _keep(cache: SegmentCache, key: tuple[Any, ...] | None, entry: Entry) -> None:
    if key is not None:  # (None: a round planned while lookups are cold)
        cache.put(key, entry)


class SegmentArrays:
    """A segment's arrays as :func:`~edbatch.api._typed.typed_program` reads them (the
    :class:`Graph` fields it uses), before any graph is made."""

    __slots__ = ("attrs", "operand_ids", "operand_ptr", "op_ids", "outputs", "vocab")

    def __init__(self, vocab: Any, op_ids: NDArray[Any], ptr: NDArray[np.int64],
                 operands: NDArray[Any], attrs: NDArray[np.int64], outputs: NDArray[Any]
                 ) -> None:
        self.vocab, self.op_ids, self.operand_ptr = vocab, op_ids, ptr
        self.operand_ids, self.attrs, self.outputs = operands, attrs, outputs


def _frozen(a: NDArray[Any], dtype: Any) -> NDArray[Any]:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.flags.writeable = False
    return a


def add_values(values: Values, entry: Entry, outputs: list[Tensor], first: int, count: int,
               offset: int) -> None:
    """:meth:`Values.add` with the plan's row bookkeeping made once per cache entry.

    Raises:
        ExecutionError: the executor did not make one kernel call per batch.
    """
    plan = entry.plan
    batches = len(entry.schedule.batches)
    if entry.nodes is None:
        assert plan is not None
        sizes = plan.row_counts()
        nodes = plan.flat_order().astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        row = np.arange(len(nodes), dtype=np.int64) - np.repeat(starts, sizes)
        keep = (nodes >= first) & (nodes < first + count)
        entry.nodes = nodes[keep] - first
        entry.batch = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)[keep]
        entry.row = row[keep]
    if len(outputs) != batches:
        raise ExecutionError(
            f"run_programs: the executor made {len(outputs)} kernel calls for "
            f"{batches} batches; values are read from one kernel call per batch")
    base = len(values.outputs)
    values.outputs.extend(outputs)
    assert entry.nodes is not None and entry.batch is not None and entry.row is not None
    if entry.span:  # nodes offset.. in order: slices, not index arrays
        end = offset + len(entry.nodes)
        values.grow(end)
        values.batch[offset:end] = entry.batch
        values.batch[offset:end] += base
        values.row[offset:end] = entry.row
        return
    ids = entry.nodes + offset
    if len(ids):
        values.grow(int(ids.max()) + 1)
        values.batch[ids] = entry.batch + base
        values.row[ids] = entry.row
