"""Values while recording: per-instance programs that read computed values and branch on them.

A program is a generator, one per data instance. It records nodes as usual and *yields* a
handle (or a list of handles) whose value it needs; the yield suspends it and evaluates to
the value (a detached tensor of the handle's shape, or ``[k, *shape]`` for a list), or
yields ``argmax(handle)`` / ``topk(handles, k)`` for indices computed for the whole round
at once (:mod:`edbatch.api._requests`)::

    def program(batch, tokens):
        for t in tokens:
            x = batch.lookup(embed, t)
            probs = gate(x)
            [(a, b)] = yield topk([probs], 2)       # suspends until the value is computed
            batch.add_loss(loss(combine(probs, expert[a](x), expert[b](x), attr=a * 8 + b)))

    out = batch.run_programs([program(batch, s) for s in sentences])
    out.loss.backward()

:meth:`DynamicBatch.run_programs <edbatch.api.DynamicBatch.run_programs>` advances every
program to its next yield, then runs everything recorded so far and not run yet as one
graph (a *segment*) with the scheduler and memory strategy given, hands every program its
value and resumes them all. So the mini-batch synchronises once per round of value reads:
as often as the longest chain of reads of any instance, not once per instance, and every
segment batches across all instances.

Values and gradients: a later segment reads the values of earlier nodes it uses as inputs
(``value/<shape>`` nodes, lookups of rows gathered from the earlier batches' outputs, one
``index_select`` per source batch: see :mod:`edbatch.api._values`), so the autograd graph
runs through every segment and one ``loss.backward()`` reaches every parameter. The values
handed to programs are detached (for branching); use the handle in cells to differentiate
through a value.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from edbatch.api import DynamicBatch
    >>> _ = torch.manual_seed(0)
    >>> batch = DynamicBatch()
    >>> step = batch.cell(nn.Linear(2, 2), "step", [2], 2)
    >>> def program(x, reads):      # one step or two, by the sign of a value read
    ...     h, signs = step(batch.input(x)), []
    ...     for _ in range(reads):
    ...         v = yield h
    ...         signs.append(bool(v[0] > 0))
    ...         h = step(h) if signs[-1] else step(step(h))
    ...     return signs
    >>> out = batch.run_programs([program(torch.ones(2), 1), program(-torch.ones(2), 3)])
    >>> out.syncs, [len(r) for r in out.returns]    # the longest chain of reads, not 1 + 3
    (3, [1, 3])
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.api import _typed
from edbatch.api._bulk import int_array, operand_array
from edbatch.api._bulk_scan import localise_reads
from edbatch.api._direct import DirectRounds
from edbatch.api._handles import Handle
from edbatch.api._requests import round_yields, values_of
from edbatch.api._rounds import (
    Follow,
    Instances,
    RoundPlan,
    extend,
    last_rows,
    op_array,
    shape_ops,
    slot_major,
)
from edbatch.api._schedulers import memory_strategy
from edbatch.api._segments import (
    SegmentCache,
    add_values,
    run_segment,
    segment_state,
    value_groups,
)
from edbatch.api._values import Values
from edbatch.errors import GraphError
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.torch_executor import RunResult
from edbatch.graph import Graph
from edbatch.memory import Strategy
from edbatch.schedule import Schedule, Scheduler

__all__ = ["Program", "ProgramsResult", "run_programs"]

#: Reads of earlier nodes per distinct node from which a segment makes one value node per
#: earlier node rather than one per read (:meth:`_Runner.run`).
SHARE_AT = 2

_NO_OUTPUTS = np.zeros(0, np.int32)
_NO_OUTPUTS.flags.writeable = False
_NO_LOSSES = np.zeros(0, np.int64)
_NO_LOSSES.flags.writeable = False

#: A per-instance program: yields handles (or lists of handles), gets their values.
Program = Generator[Any, Any, Any]


class Segment:
    """One synchronisation's graph, schedule and executor result. The graph of a segment
    whose structure ran before is made when first read (its attrs and instances)."""

    __slots__ = ("_graph", "run", "schedule")

    def __init__(self, graph: Graph | Callable[[], Graph], schedule: Schedule,
                 run: RunResult) -> None:
        self._graph, self.schedule, self.run = graph, schedule, run

    @property
    def graph(self) -> Graph:
        if not isinstance(self._graph, Graph):
            self._graph = self._graph()
        return self._graph

    def __repr__(self) -> str:
        return f"Segment({self.schedule.num_batches} batches)"


@dataclass
class ProgramsResult:
    """What :meth:`DynamicBatch.run_programs` returns.

    ``loss`` sums the :meth:`~DynamicBatch.add_loss` terms of every segment (``None`` if
    none); ``returns[i]`` is program ``i``'s return value; ``syncs`` the number of
    synchronisation points (segments run to hand values back); ``segments`` every graph run
    (the last one without a value read after it, if anything was left). ``result[handle]``
    reads any node's value (with its autograd graph), ``result.stack(handles)`` many as one
    ``[k, *shape]`` tensor (one ``index_select`` per source batch).
    """

    loss: Tensor | None
    returns: list[Any]
    syncs: int
    segments: list[Segment] = field(default_factory=list)
    values: Values = field(default_factory=Values, repr=False)
    generation: int = -1
    #: Seconds by phase: ``record`` (advancing the programs), ``graph`` (assembling each
    #: segment's arrays), ``segment`` (schedule, memory plan and program, reused when a
    #: segment's structure was seen before, and the executor's forward) and ``read``
    #: (values handed back).
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def num_batches(self) -> int:
        """Kernel launches over all segments."""
        return sum(s.schedule.num_batches for s in self.segments)

    def __getitem__(self, handle: Handle) -> Tensor:
        return self.stack([handle])[0]

    def stack(self, handles: Sequence[Handle]) -> Tensor:
        """The values of ``handles`` (all of one shape) as ``[len(handles), *shape]``."""
        if not handles:
            raise GraphError("stack() needs at least one handle")
        shape = handles[0].shape
        for h in handles:
            if not isinstance(h, Handle) or h.generation != self.generation:
                raise GraphError(f"{h!r} is not a node of the mini-batch of this result")
            if h.shape != shape:
                raise GraphError(f"stack(): {h!r} has shape {h.shape}, the first {shape}; "
                                 f"stack handles of one shape")
        nodes = np.fromiter((h.node_id for h in handles), np.int64, len(handles))
        return self.values.gather(nodes).reshape(len(handles), *shape)


class _Runner:
    """The segments of one mini-batch (see the module docstring)."""

    def __init__(self, batch: Any, make: Scheduler, strategy: Strategy, grad: bool,
                 marks: int) -> None:
        self.batch, self.make, self.strategy, self.grad = batch, make, strategy, grad
        self.memory = memory_strategy(make, strategy)
        self.maker = SegmentCache.maker(make)
        self.values = Values()
        self.start = self.op_start = self.count_start = self.loss_start = 0
        self.losses: list[Tensor] = []
        self.segments: list[Segment] = []
        # every node's op type so far (grown, not rebuilt) as the first of its output shape
        self.op_all = np.zeros(0, np.int32)  # (what its value node depends on: shape_ops)
        self.inst = Instances(batch, marks)  # the nodes' instances, from the marks
        self.follow = Follow()  # the last round, repeated shifted: its plan
        self.rows: dict[str, tuple[int, Tensor]] = {}  # input rows: (blocks, joined)
        self.arity = np.zeros(0, np.int64)  # operand count per op type (-1: variadic)
        self.shape_op = np.zeros(0, np.int32)  # per op type the first of its output shape
        self.seconds = dict.fromkeys(("record", "graph", "segment", "read"), 0.0)
        self.new: tuple[int, int, int, Tensor] | None = None  # (rounds.last_rows)
        self.direct = DirectRounds(self, SHARE_AT)  # repeated cell or chain rounds run directly

    def run(self) -> None:
        """Run every node recorded and not run yet as one segment. Every operand (and loss
        term) reading an earlier segment's node becomes its own ``value/<shape>`` node, in
        operand order: the structure then depends only on what was recorded since the last
        synchronisation, so the rounds of one pattern (a decoding step) repeat one
        :class:`~edbatch.api._rounds.RoundPlan` and segment-cache entry; but earlier nodes
        read :data:`SHARE_AT` times or more on average (a MoE layer's token rows) get one
        value node each (fewer rows to copy and zero-fill)."""
        batch, rec, start = self.batch, self.batch._rec, self.start
        t0 = time.perf_counter()
        n, k = len(rec.ops), len(rec.losses)
        losses = int_array(rec.losses, self.loss_start, k, "q") if k > self.loss_start \
            else _NO_LOSSES
        if n == start and not len(losses):
            return
        vocab_ops = batch._ops
        new_ops = op_array(rec.ops, start, n)
        if len(self.arity) != len(vocab_ops):  # op types are only ever added
            self.arity = np.array([-1 if o.arity is None else o.arity for o in vocab_ops],
                                  np.int64)
            self.shape_op = shape_ops(vocab_ops)
        self.op_all = op_all = extend(self.op_all, start, self.shape_op[new_ops])
        counts = None  # (variadic nodes record their operand count)
        if len(rec.counts) > self.count_start:
            counts = self.arity[new_ops]
            counts[counts < 0] = rec.counts[self.count_start:]
        flat = operand_array(rec, self.op_start, start)
        self.inst.read(rec.marks, start, n)
        tag = (self.maker, self.strategy, _typed.TYPED, len(vocab_ops))
        state = segment_state(batch)
        found = self.follow.match(tag, start, new_ops, counts, flat, losses, op_all) \
            if state.rounds.size else None
        if found is not None:  # the last round shifted (a decoding step after another)
            old, local, loss_local, plan = found
            state.rounds.hit()  # (a plan reused: a hit of the round plans)
        else:
            old, local, loss_local = localise_reads(flat, losses, start, SHARE_AT)
            plan = self._round_plan(state.rounds, tag, old, new_ops, counts, local,
                                    loss_local)
            self.follow.keep(None if counts is not None or plan.key is None else
                             (*tag[:3], len(batch._ops)), start, new_ops, flat, losses,
                             old, local, loss_local, plan, op_all)
            state = segment_state(batch)
        params = dict(batch.params)  # the earlier nodes read: rows of the value params
        for name, blocks in rec.rows.items():
            kept = self.rows.get(name)
            if kept is None or kept[0] != len(blocks):  # blocks are only ever appended
                kept = self.rows[name] = (len(blocks), (blocks[0] if len(blocks) == 1 else
                                          torch.cat(blocks)).to(batch.device, batch.dtype))
            params[f"api.{name}"] = kept[1]
        gather = self.values.gather
        for name, sel in plan.groups:
            params[name] = gather(old if sel is None else old[sel])
        attrs = plan.attrs(int_array(rec.attrs, start, n, "q"))
        c, m = len(old), n - start
        has_loss = len(losses) > 0
        t1 = time.perf_counter()
        inst = self.inst  # (not self: the graph maker would keep the runner in a cycle)
        graph, schedule, entry, result = run_segment(
            state, plan, self.make, self.memory, attrs,
            lambda: inst.of(old, start, n, has_loss), params, self.grad)
        add_values(self.values, entry, state.capture.outputs, c, m, start)
        whole = entry.whole  # (the new nodes' batch: rounds.last_rows)
        self.new = None if whole < 0 else (start, n, 1, state.capture.outputs[whole])
        sec = self.seconds
        sec["graph"] += t1 - t0
        sec["segment"] += time.perf_counter() - t1
        if has_loss:
            self.losses.append(result.outputs[c + m].reshape(()))
        self.segments.append(Segment(graph, schedule, result))
        self.start, self.op_start = n, len(rec.operands)
        self.count_start, self.loss_start = len(rec.counts), len(rec.losses)

    def _round_plan(self, rounds: Any, tag: tuple[Any, ...], old: NDArray[np.int64],
                    new_ops: NDArray[np.int32], counts: NDArray[np.int64] | None,
                    local: NDArray[np.int64], loss_local: NDArray[np.int64]) -> RoundPlan:
        """The round's plan: the one of its signature in ``rounds`` made before, else made
        now (neither signature nor segment-cache key made while lookups are cold)."""
        sig = None if rounds.cold() else (
            *tag, new_ops.tobytes(), b"" if counts is None else counts.tobytes(),
            local.tobytes(), loss_local.tobytes(), self.op_all[old].tobytes())
        plan = None if sig is None else rounds.get(sig)
        if plan is None:
            plan = self._plan(old, new_ops, self.arity[new_ops] if counts is None else counts,
                              local, loss_local, keyed=sig is not None)
            if sig is not None:  # (a new value/<shape> op type: the next rounds see it)
                segment_state(self.batch).rounds.put(
                    (*tag[:3], len(self.batch._ops), *sig[4:]), plan)
        return plan

    def _plan(self, old: NDArray[np.int64], new_ops: NDArray[np.int32],
              counts: NDArray[np.int64], local: NDArray[np.int64],
              loss_local: NDArray[np.int64], keyed: bool = True) -> RoundPlan:
        """A round's :class:`~edbatch.api._rounds.RoundPlan` (its first occurrence; without
        a segment-cache key unless ``keyed``)."""
        batch = self.batch
        c, m = len(old), len(new_ops)
        perm = None
        if int((local < c).sum()) + int((loss_local < c).sum()) == c:  # one per read
            perm, local, loss_local = slot_major(local, loss_local, c, new_ops, counts)
        old_ops = np.zeros(c, np.int32)
        old_attrs = np.zeros(c, np.int64)
        groups = []
        for shape, sel in value_groups(batch._ops, self.op_all[old if perm is None
                                                               else old[perm]]):
            op = batch._input_op(shape, "value")
            old_ops[sel] = batch._kinds[op.name].op_id
            old_attrs[sel] = np.arange(len(sel))
            pick = sel if perm is None else perm[sel]
            groups.append((f"api.{op.name}",
                           None if np.array_equal(pick, np.arange(c)) else pick))
        has_loss = len(loss_local) > 0
        vocab = batch._vocab_for(has_loss)
        op_ids = [old_ops, new_ops]
        cnt = [np.zeros(c, np.int64), counts]
        operands = [local, loss_local]
        outputs, tail = _NO_OUTPUTS, _NO_LOSSES
        if has_loss:
            op_ids.append(np.array([len(vocab) - 1], np.int32))
            cnt.append(np.array([len(loss_local)]))
            outputs, tail = np.array([c + m], np.int32), np.array([-1], np.int64)
        arrays = {"op_ids": np.concatenate(op_ids), "counts": np.concatenate(cnt),
                  "operands": np.concatenate(operands).astype(np.int32),
                  "outputs": outputs, "sizes": np.array([c, m], np.int64)}
        key = SegmentCache.key(vocab, self.make, (self.strategy, _typed.TYPED),
                               *(arrays[k] for k in ("op_ids", "counts", "operands",
                                                     "outputs", "sizes"))) if keyed else None
        return RoundPlan(vocab, key, arrays, tuple(groups), old_attrs, tail)


def run_programs(batch: Any, programs: Sequence[Program], make: Scheduler,
                 strategy: Strategy, grad: bool) -> ProgramsResult:
    """:meth:`DynamicBatch.run_programs` (see the module docstring). The weights must not
    change while it runs (each ``W^T`` made once). Python's cyclic garbage collector is
    paused meanwhile (recorded objects die by refcount) and the recording cleared before it
    resumes (its int lists freed, not traversed by the collection resuming sets off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with TRANSPOSED.run():  # each weight's W^T made once for all segments
            return _run_programs(batch, programs, make, strategy, grad)
    finally:
        batch._clear()
        if collecting:
            gc.enable()


def _run_programs(batch: Any, programs: Sequence[Program], make: Scheduler,
                  strategy: Strategy, grad: bool) -> ProgramsResult:
    rec = batch._rec
    if rec.ops:
        raise GraphError("run_programs: the mini-batch already has recorded nodes; run() or "
                         "discard() them first (the programs record the whole mini-batch)")
    bad = next((p for p in programs if not hasattr(p, "send")), None)
    if bad is not None:  # (was a raw AttributeError, after instance ids were taken)
        raise GraphError(f"run_programs takes generators (call the program: program(batch, "
                         f"x)), got {type(bad).__name__}")
    runner = _Runner(batch, make, strategy, grad, len(programs))
    returns: list[Any] = [None] * len(programs)
    ids = [batch.next_instance() for _ in programs]
    sends, live = [p.send for p in programs], list(range(len(programs)))
    sent: Sequence[Any] = [None] * len(programs)  # (what each live program is sent next)
    syncs, clock, marks = 0, time.perf_counter, rec.marks
    mark = marks.append
    while live:
        t0 = clock()
        ops = rec.ops
        asking: list[int] = []
        asked: list[Any] = []
        ask, keep = asked.append, asking.append  # (bound once per round)
        for i, value in zip(live, sent, strict=True):
            ident = ids[i]
            batch._instance = ident
            mark((len(ops), ident))
            try:
                ask(sends[i](value))
            except StopIteration as stop:
                returns[i] = stop.value
                continue
            keep(i)
        batch._instance = -1
        mark((len(ops), -1))
        runner.inst.marks += len(live) + 1  # (the marks of this loop: Instances.read)
        runner.seconds["record"] += clock() - t0
        if not asked:
            break
        live = asking
        nodes, lists, answer = round_yields(batch, asking, asked)
        runner.values.grow(len(rec.ops))
        if runner.values.batch[nodes].min() < 0:  # some value not computed yet
            if not runner.direct.run(runner):
                runner.run()
            syncs += 1
        t0 = clock()
        if lists is None:  # (``sent``: one value per program of ``live`` now)
            got = last_rows(runner.new, nodes)
            sent = answer(runner.values.gather(nodes) if got is None else got)
        else:
            sent = values_of(runner.values, asked, lists)
        runner.seconds["read"] += clock() - t0
    runner.run()
    loss = None
    if runner.losses:
        loss = runner.losses[0] if len(runner.losses) == 1 else torch.stack(runner.losses).sum()
    return ProgramsResult(loss, returns, syncs, runner.segments, runner.values,
                          batch._generation, runner.seconds)
