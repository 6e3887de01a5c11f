"""Segments whose op types form a chain without cycles run one batch per op type, planned
in a few array operations.

Most segments of :meth:`DynamicBatch.run_programs <edbatch.api.DynamicBatch.run_programs>`
are blocks recorded in bulk: a MoE layer's gates, its experts (``switch``), their
combination; a decoding round's cell and logits. No node reads a node of its own op type,
and the op types read each other along an acyclic pattern (``value -> expert -> combine ->
gate``). Then the schedule with the fewest batches is one batch per op type in a
topological order of the types (the lower bound: every type needs a batch, and each
batch's operands are all computed before it), whatever scheduler was asked for, and it
is found on the types, not the nodes. The training reads follow from each node's (batch,
row) in vectorised numpy: no scheduler, memory plan or per-operand read compilation,
whose cost (several ms per segment on the MoE model) is otherwise paid for every new
routing, which never repeats a segment's structure.

A segment qualifies (:func:`typed_program`) when no operand edge joins two nodes of one op
type, the type graph has no cycle, every variadic or unbatchable node is alone of its
type, and no kind has inference-only read rewrites
(:data:`~edbatch.executor.cells_hoist.HEAD_READS`). Both modes run its steps as the
training loop does (a list of batch outputs; inference under ``no_grad``). :data:`TYPED`
switches it off (``EDBATCH_TYPED_SEGMENTS=0``: the general path, for comparisons).

Why the user's scheduler is not asked: a batch holds nodes of one op type, so any schedule
of a segment has at least one batch per op type present. Under the conditions above that
many suffice: no node reads one of its own type, so a type's nodes never wait on each
other; the type graph is acyclic, so running the types in a topological order finds every
operand computed. No dependency path visits a type twice, so ED-Batch's lower bound
(:func:`~edbatch.schedule.bounds.lower_bound`: unbatchable nodes plus, per batchable type,
its longest chain of nodes, here 1) is exactly the number of types, and this schedule
meets it. So no scheduler, policy or search can make fewer batches (kernel launches) for
such a segment; what is not considered is anything a scheduler might trade batches for
(peak memory, the order of batches of independent types beyond the topological ties).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.api._bulk_scan import (
    type_edges,
    typed_layout,
)
from edbatch.api._read_plan import read_plan
from edbatch.executor._program import Program, Step, new_step
from edbatch.executor._reads import Read, SelectRead, SliceRead, WholeRead, to_device
from edbatch.executor._result import RunResult
from edbatch.executor.cells_hoist import HEAD_READS
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.graph import Graph
from edbatch.schedule import Batch, Schedule

__all__ = ["TYPED", "TypedPlan", "typed_program"]

#: Whether qualifying segments take this path (``EDBATCH_TYPED_SEGMENTS=0``: never).
TYPED = os.environ.get("EDBATCH_TYPED_SEGMENTS", "1") != "0"


class TypedPlan:
    """A typed segment's schedule, program and where each node's value lands
    (``batch_of``, ``row_of``: per graph node)."""

    __slots__ = ("batch_of", "program", "row_of", "schedule")

    def __init__(self, schedule: Schedule, program: Program, batch_of: NDArray[np.int64],
                 row_of: NDArray[np.int64]) -> None:
        self.schedule, self.program = schedule, program
        self.batch_of, self.row_of = batch_of, row_of


def _type_order(t_node: NDArray[np.int64], first: list[int], operands: NDArray[Any],
                ptr: NDArray[np.int64]) -> NDArray[np.int64] | None:
    """Each op type's batch index (a topological order of the types, ties by first node),
    or ``None`` when a node reads a node of its own type or the types form a cycle: the
    Python twin (the tests' oracle) of the compiled :func:`~edbatch.api._bulk_scan.
    type_order` that :func:`typed_program` calls (in :func:`~edbatch.api._bulk_scan.
    typed_layout`)."""
    k = len(first)
    succ: list[list[int]] = [[] for _ in range(k)]
    indeg = [0] * k
    if len(operands):
        edge = type_edges(t_node, ptr, operands, k)  # (one compiled pass)
        if edge[::k + 1].any():  # a node reads one of its own type
            return None
        for code in np.flatnonzero(edge).tolist():
            a, b = divmod(code, k)
            succ[a].append(b)
            indeg[b] += 1
    ready = [(first[t], t) for t in range(k) if not indeg[t]]
    heapq.heapify(ready)
    rank = np.full(k, -1, np.int64)
    at = 0
    while ready:
        _, t = heapq.heappop(ready)
        rank[t] = at
        at += 1
        for s in succ[t]:
            indeg[s] -= 1
            if not indeg[s]:
                heapq.heappush(ready, (first[s], s))
    return rank if at == k else None


def _tensor(a: NDArray[Any], device: torch.device) -> Tensor:
    if device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    return to_device(np.ascontiguousarray(a, dtype=np.int64), device)


def _read(pb: NDArray[np.int64], lr: NDArray[np.int64], sizes: NDArray[np.int64],
          device: torch.device) -> Read:
    """The training read of rows ``lr`` of batch outputs ``pb`` (``sizes``: every batch's
    rows): a slice when they are one batch's consecutive rows, one ``index_select`` of
    one batch, else of the producers' outputs joined (:class:`JoinedRead`) unless those
    hold more than :data:`JOIN_AT` x the rows read."""
    n = len(pb)
    b0 = int(pb[0])
    if (pb == b0).all():
        lo = int(lr[0])
        if int(lr[-1]) - lo == n - 1 and (n == 1 or bool((np.diff(lr) == 1).all())):
            return (WholeRead if lo == 0 and n == int(sizes[b0]) else SliceRead)(b0, lo, lo + n)
        return SelectRead([(b0, _tensor(lr, device), _NO_POS)], n)  # (pos: unread)
    used = np.flatnonzero(np.bincount(pb, minlength=len(sizes)))
    if int(sizes[used].sum()) <= JOIN_AT * n:
        at = np.zeros(len(sizes), np.int64)
        at[used] = np.cumsum(sizes[used]) - sizes[used]
        return JoinedRead(used.tolist(), _tensor(lr + at[pb], device),
                          sizes[used].tolist())
    order = np.argsort(pb.astype(np.int16), kind="stable")  # (a radix sort)
    cuts = np.flatnonzero(np.diff(pb[order])) + 1
    groups = [(int(pb[pos[0]]), _tensor(lr[pos], device), _tensor(pos, device))
              for pos in np.split(order, cuts)]
    return SelectRead(groups, n)


_NO_POS = torch.zeros(0, dtype=torch.int64)


#: Rows of the joined outputs per row read up to which :class:`JoinedRead` (and the
#: general path's :class:`~edbatch.api._segments.JoinedSelect`) joins them.
JOIN_AT = 4


class JoinedRead:
    """Rows scattered over several batch outputs (a MoE combination's read of its tokens'
    expert outputs): one ``cat`` of those outputs and one ``index_select`` (backward
    zero-fills one gradient)."""

    __slots__ = ("batches", "flat", "sizes")
    gather = True

    def __init__(self, batches: list[int], flat: Tensor, sizes: list[int]) -> None:
        self.batches, self.flat, self.sizes = batches, flat, sizes

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return torch.cat([outs[b] for b in self.batches]).index_select(0, self.flat)

    def route(self, grad: Tensor, bufs: Sequence[Tensor]) -> None:
        """Add the gradient rows into the producers' buffers."""
        full = grad.new_zeros(sum(self.sizes), grad.shape[1])
        full.index_add_(0, self.flat, grad)
        for b, part in zip(self.batches, full.split(self.sizes), strict=True):
            bufs[b].narrow(1, 0, grad.shape[1]).add_(part)


class GatherGroup:
    """Rows of the same producer batches read by several operand slots (a MoE layer's
    experts reading their tokens' rows, a combination's slots reading the experts'
    outputs): one ``index_select`` (of those outputs joined) for all of them, split into
    the slots' parts. Backward then fills one gradient, where a read per slot fills one
    per slot."""

    __slots__ = ("batches", "flat", "sizes")

    def __init__(self, batches: list[int], flat: Tensor, sizes: list[int]) -> None:
        self.batches, self.flat, self.sizes = batches, flat, sizes

    def __call__(self, outs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        src = outs[self.batches[0]] if len(self.batches) == 1 else \
            torch.cat([outs[b] for b in self.batches])
        return src.index_select(0, self.flat).split_with_sizes(self.sizes)  # type: ignore[no-any-return]


class GroupPart:
    """One slot's part of a :class:`GatherGroup` (the group is gathered once per run by
    :func:`_run_steps`; called alone, it gathers the group for itself)."""

    __slots__ = ("group", "j")
    gather = True

    def __init__(self, group: GatherGroup, j: int) -> None:
        self.group, self.j = group, j

    def __call__(self, outs: Sequence[Tensor]) -> Tensor:
        return self.group(outs)[self.j]


def _reads(ops: list[Any], operands: NDArray[Any],
           ptr: NDArray[np.int64], batch_of: NDArray[np.int64], row_of: NDArray[np.int64],
           sizes: NDArray[np.int64], device: torch.device) -> list[list[Read]]:
    """Every batch's operand reads (one per slot; a variadic node's operands one read):
    a slice where the rows are one batch's consecutive rows, else a part of one
    :class:`GatherGroup` per set of producer batches read by more than one slot, else
    :func:`_read`. The producers' (batch, row) of all reads laid out slot by slot (each read
    a contiguous range), the slices, the groups and their rows are found in one compiled
    pass (:func:`~edbatch.api._read_plan.read_plan`)."""
    k = len(sizes)
    size_l = sizes.tolist()
    made: list[list[Any]] = [[] for _ in range(k)]
    if not len(operands):
        return made
    arity = np.array([-1 if op.arity is None else op.arity for op in ops], np.int64)
    pb, lr, rb, whole, gid, ghit, flat = read_plan(operands, ptr, batch_of, row_of, sizes,
                                                   arity)  # (one compiled pass)
    members: list[list[tuple[int, int, int, int]]] = [[] for _ in range(len(ghit))]
    for b, j, lo, hi, w, g in zip(*rb.T.tolist(), whole.tolist(), gid.tolist(), strict=True):
        if w:
            first, src = int(lr[lo]), int(pb[lo])
            made[b].append((WholeRead if first == 0 and hi - lo == size_l[src] else SliceRead)(
                src, first, first + hi - lo))
        else:
            made[b].append(None)  # (placed below)
            members[g].append((b, j, lo, hi))
    for hit, group_of in zip(ghit, members, strict=True):
        src = np.flatnonzero(hit)
        total = sum(hi - lo for _, _, lo, hi in group_of)
        if len(group_of) == 1 or int(sizes[src].sum()) > JOIN_AT * total:
            for b, j, lo, hi in group_of:
                made[b][j] = _read(pb[lo:hi], lr[lo:hi], sizes, device)
            continue
        ranges = [(lo, hi) for _, _, lo, hi in group_of]
        if all(a[1] == z[0] for a, z in itertools.pairwise(ranges)):  # (one range: a copy)
            rows = flat[ranges[0][0]:ranges[-1][1]].copy()
        else:
            rows = np.concatenate([flat[lo:hi] for lo, hi in ranges])
        group = GatherGroup(src.tolist(), _tensor(rows, device), [hi - lo for lo, hi in ranges])
        for i, (b, j, _, _) in enumerate(group_of):
            made[b][j] = GroupPart(group, i)
    return made


#: The op name prefix of :meth:`run_programs <edbatch.api.DynamicBatch.run_programs>`'s
#: value nodes (lookups of rows of earlier segments).
VALUE_PREFIX = "value/"


def value_rows(op: Any, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
    """The kernel of a batch of value nodes that reads its table's rows in order (how a
    segment's value nodes are made): the table itself, no copy (and no embedding
    backward: the gradient flows straight to the rows' producers)."""
    table = params[op.params[0]]
    if table.shape[0] != attrs.shape[0]:  # (not every row: a plain lookup)
        return torch.nn.functional.embedding(attrs, table)
    return table


def typed_program(graph: Graph | Any, kernels: Mapping[str, Kernel], device: torch.device
                  ) -> TypedPlan | None:
    """The one-batch-per-type schedule and program of ``graph`` (see the module
    docstring), or ``None`` where the segment does not qualify. ``graph``: a :class:`Graph`
    or the arrays of one (``SegmentArrays``: op ids, operand pointers and ids, attrs,
    outputs and the vocabulary)."""
    op_ids, ptr, operands = graph.op_ids, graph.operand_ptr, graph.operand_ids
    n = len(op_ids)
    if not n:
        return None
    # the op types present and their counts, a topological rank of the types (empty: the
    # segment does not qualify), each batch's op id, node's batch and row (one compiled pass)
    types, present, rank, type_of_a, batch_of, sizes, order, row_of, order32 = \
        typed_layout(op_ids, ptr, operands)
    if len(types) >= 1 << 15:  # (batch indices are sorted as int16)
        return None
    alone = ~graph.vocab.batchable[types]  # an unbatchable type runs each node alone
    if alone.any() and (present[alone] > 1).any():
        return None
    counts = ptr[1:] - ptr[:-1]
    if not len(rank):
        return None
    vocab = graph.vocab
    type_of = type_of_a.tolist()  # each batch's op id
    ops = [vocab[o] for o in type_of]
    if any(op.kind in HEAD_READS for op in ops):
        return None
    starts = np.cumsum(sizes) - sizes
    size_l, start_l = sizes.tolist(), starts.tolist()
    flat = _tensor(graph.attrs[order], device)
    attrs = flat.split_with_sizes(size_l)
    sum_kernel = KERNELS.get("sum")
    batches = []
    for b, op in enumerate(ops):
        nodes = order32[start_l[b]:start_l[b] + size_l[b]]
        if op.arity is None and (size_l[b] != 1 or counts[nodes[0]] == 0):
            return None  # (a variadic node runs alone of its type, on >= 1 operand)
        batches.append(Batch(type_of[b], nodes))
    slots = _reads(ops, operands, ptr, batch_of, row_of, sizes, device)
    steps: list[Step] = []
    for b, op in enumerate(ops):
        kernel = kernel_for(op, kernels)
        split = op.arity is None
        if op.name.startswith(VALUE_PREFIX) and op.kind == "lookup" and \
                np.array_equal(graph.attrs[order[start_l[b]:start_l[b] + size_l[b]]],
                               np.arange(size_l[b])):
            kernel = value_rows  # every row of its table, in order: the table itself
        steps.append(new_step(op, kernel, attrs[b], size_l[b], math.prod(op.out_shape), b, 0,
                              tuple(slots[b]), split, split and kernel is sum_kernel, False))
    outs = graph.outputs.astype(np.int64)
    outputs = tuple((int(v), int(batch_of[v]), int(row_of[v]), int(row_of[v])) for v in outs)
    done = tuple(steps)
    views = sum(isinstance(r, SliceRead) for s in done for r in s.reads)
    gathers = sum(len(s.reads) for s in done) - views  # (the same steps in both modes)
    program = Program(done, lambda: done, tuple(zip(size_l, (s.width for s in done),
                                                     strict=True)),
                      outputs, [int(batch_of[v]) for v in outs],
                      {False: [views, gathers, 0], True: [views, gathers, 0]}, flat, order)
    return TypedPlan(Schedule(tuple(batches), "typed"), program, batch_of, row_of)


def run_typed(executor: Any, program: Program, params: Mapping[str, Tensor], grad: bool
              ) -> RunResult:
    """Run a typed program's steps on ``executor`` (a ``SegmentExecutor``, its capture's
    outputs cleared first): the training loop, under ``no_grad`` for inference."""
    executor.capture.outputs.clear()
    params = executor._on_device(params)
    t0 = time.perf_counter()
    if grad or not torch.is_grad_enabled():  # (no second no_grad inside one)
        outputs = _run_steps(executor, program, params)
    else:
        with torch.no_grad():
            outputs = _run_steps(executor, program, params)
    seconds = time.perf_counter() - t0
    loss = None
    if len(outputs) == 1:
        (value,) = outputs.values()
        loss = value.reshape(()) if value.numel() == 1 else None
    views, gathers, _ = program.counts[False]  # (counted when the program was made)
    stats = {"exec/num_views": float(views), "exec/num_gathers": float(gathers),
             "exec/num_kernel_calls": float(len(program.steps)), "exec/seconds": seconds,
             "exec/compile_seconds": 0.0, "exec/cuda_graph": 0.0,
             "exec/capture_seconds": 0.0, "exec/hoisted_projections": 0.0}
    return RunResult(outputs, loss, len(program.steps), stats, seconds)


def _run_steps(executor: Any, program: Program, params: Mapping[str, Tensor]
               ) -> dict[int, Tensor]:
    """The training loop over the steps (inference and training steps are the same here;
    reads over several batches are already joined where that pays, :func:`_read`)."""
    outs: list[Tensor] = []
    apply, keep = executor._apply, executor.capture.outputs.append
    timed = executor._timer is not None  # (a profiled run: every read timed on its own)
    groups: dict[GatherGroup, tuple[Tensor, ...]] = {}  # this run's gathered groups
    for i, step in enumerate(program.steps):
        if timed:
            out = executor._call(i, step, outs, params)
        else:
            operands = []
            for read in step.reads:
                if type(read) is GroupPart:
                    parts = groups.get(read.group)
                    if parts is None:
                        parts = groups[read.group] = read.group(outs)
                    operands.append(parts[read.j])
                else:
                    operands.append(read(outs))
            out = apply(i, step, operands, params, None)
        if step.kernel is value_rows:  # (not a capturing kernel)
            keep(out)
        outs.append(out)
    return {v: outs[b][r:r + 1]
            for (v, _, _, r), b in zip(program.outputs, program.output_batch, strict=True)}
