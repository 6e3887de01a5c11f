"""Direct rounds: a repeated round of ``run_programs`` (one cell per live instance, or a
short chain of cells) run as one gather and one kernel call per chain position, with no
per-round planning.

A parser's decision round records per live sentence one ``scores`` node over four earlier
feature nodes; a greedy decoder's round a chain of two, ``dec(state, attr=prev)`` then
``logits(dec)``; each asks for an argmax. Through :meth:`_Runner.run
<edbatch.api._programs._Runner.run>` every such round localises its reads, hashes its
structure, finds its :class:`~edbatch.api._rounds.RoundPlan` and segment-cache entry, binds
the cached typed program's attrs and runs it: about 0.2 ms of host work per round.

A round is *direct* when (CPU inference, typed segments) its ``m`` new nodes are ``L``
repetitions, instance after instance, of one chain of ``k`` fixed-arity op types; each
operand of chain position ``j`` reads an earlier segment's node or (the same slot in every
repetition) its own repetition's node of an earlier position; one position's reads of
earlier segments are of one shape and too few share a node for the segment to give several
reads one value node (:func:`~edbatch.api._rounds.localise`'s rule); there is no loss term
nor new input row; and a round of that chain, wiring and ``m`` ran the long way before in
this segment state, each position's values one batch of it, equal to the direct
computation's (checked once, when it is learnt, bitwise). Then per position its operand
rows of earlier segments are gathered instance after instance (:meth:`Values.gather
<edbatch.api._values.Values.gather>`, one ``index_select``) and viewed as ``[L, a * w]``,
and the cell's kernel runs on their ``a`` column blocks (the values of the long path's slot
views; a kernel that concatenates them takes the block itself,
:func:`~edbatch.executor.cells_parser.side_by_side`) and on earlier positions' outputs; its
output is registered as the long path registers its batch (node ``start + i * k + j``: row
``i``). The segment's graph (the long path's, with this round's attrs and instances) and
schedule (the cached one) are made only when read (:class:`DirectSegment`).

``EDBATCH_DIRECT_ROUNDS=0`` (or :data:`DIRECT` set to ``False``) turns the path off; the
tests compare the two.
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from edbatch.api import _typed
from edbatch.api._bulk import int_array
from edbatch.api._rounds import Instances, arange, extend
from edbatch.api._segments import segment_state
from edbatch.executor.kernels import kernel_for
from edbatch.executor.torch_executor import RunResult
from edbatch.graph import Graph
from edbatch.schedule import Schedule

__all__ = ["DIRECT", "MAX_CHAIN", "DirectPlan", "DirectRounds", "DirectSegment", "Step"]

#: Whether ``run_programs`` takes direct rounds (module docstring).
DIRECT = os.environ.get("EDBATCH_DIRECT_ROUNDS", "1") != "0"

#: Direct plans kept per segment state (round keys).
PLANS_KEPT = 1024

#: The longest chain of cells per instance a direct round may repeat.
MAX_CHAIN = 8


@dataclasses.dataclass
class Step:
    """A chain position: op type, kernel, its operands among a repetition's reads of earlier
    segments (``reads`` of them; ``old``, ``None``: all) and per slot its value: ``(-1, b)``
    column block ``b`` of those rows, ``(j, 0)`` the output of chain position ``j``."""

    op: Any
    kernel: Any
    reads: int
    old: NDArray[np.int64] | None
    slots: tuple[tuple[int, int], ...]


@dataclasses.dataclass
class DirectPlan:
    """What a direct round of one chain, wiring and size reuses: its steps, the long path's
    first graph of it (``base``: value nodes' attrs ``base.attrs[:c]``, a loss-free tail),
    its schedule and run stats, and one repetition's output-shape ops (``shape_ops``)."""

    steps: list[Step]
    base: Graph
    schedule: Schedule
    stats: dict[str, float]
    calls: int
    shape_ops: NDArray[np.int32]


class DirectSegment:
    """A direct round's segment: ``graph`` (made when first read, as the long path's cached
    segments make theirs), ``schedule`` and ``run`` (its :class:`RunResult`, made when
    read) as :class:`~edbatch.api._programs.Segment` has them."""

    __slots__ = ("_graph", "_make", "_plan", "_run", "schedule")

    def __init__(self, plan: DirectPlan, attrs: NDArray[np.int64], inst: Instances,
                 old: NDArray[np.int64], start: int, n: int, seconds: float) -> None:
        self._graph: Graph | None = None
        self._make, self._plan = (attrs, inst, old, start, n), plan
        self._run: RunResult | float = seconds  # (the kernels' seconds until ``run`` is read)
        self.schedule = plan.schedule

    @property
    def run(self) -> RunResult:
        if not isinstance(self._run, RunResult):
            stats = dict(self._plan.stats)
            stats["exec/seconds"] = self._run
            self._run = RunResult({}, None, self._plan.calls, stats, self._run)
        return self._run

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            attrs, inst, old, start, n = self._make
            base, c = self._plan.base, len(old)
            full = np.concatenate([base.attrs[:c], attrs, base.attrs[c + n - start:]])
            self._graph = dataclasses.replace(base, attrs=_frozen(full, np.int64),
                                              instance=_frozen(inst.of(old, start, n, False),
                                                               np.int32))
        return self._graph

    def __repr__(self) -> str:
        return f"Segment({self.schedule.num_batches} batches, direct)"


#: Per segment state (by id, with a weak reference to it: a state is unhashable) its
#: direct plans by round key (``None``: a round key learnt not direct).
_PLANS: dict[int, tuple[weakref.ref[Any], dict[tuple[Any, ...], DirectPlan | None]]] = {}


def _plans_of(state: Any) -> dict[tuple[Any, ...], DirectPlan | None]:
    got = _PLANS.get(id(state))
    if got is None or got[0]() is not state:
        for k in [k for k, (ref, _) in _PLANS.items() if ref() is None]:
            del _PLANS[k]
        got = _PLANS[id(state)] = (weakref.ref(state), {})
    return got[1]


class DirectRounds:
    """A mini-batch's direct rounds (module docstring), over one ``_Runner``'s state."""

    def __init__(self, runner: Any, share_at: int) -> None:
        self.on = DIRECT and not runner.grad and _typed.TYPED and \
            runner.batch.device.type == "cpu"
        self.tag = (runner.maker, runner.strategy)
        self.share_at = share_at  # (the long path's rule: localise's)
        self.state: tuple[int, Any] = (-1, None)  # (op types then, their segment state)
        self.last: tuple[list[int], tuple[int, ...]] | None = None  # (chain, wiring)

    def run(self, runner: Any) -> bool:
        """Run the pending round directly if it is a direct round (module docstring),
        learning its plan the long way (``runner.run()``) the first time; ``False``: it is
        not one (nothing was run)."""
        if not self.on:
            return False
        rec, start = runner.batch._rec, runner.start
        n = len(rec.ops)
        m = n - start
        if m < 1 or len(rec.losses) != runner.loss_start or \
                len(rec.counts) != runner.count_start or (rec.blocks and rec.blocks[-3] >= start):
            return False  # (an operand block: bulk operands, not a repeated chain)
        part = rec.operands[runner.op_start:]
        if not _again(self.last, rec.ops, part, start, n, m):  # (most repeat the last)
            chain = _chain(runner.batch, rec, start, n, m, len(part))
            if chain is None:
                return False
            wiring = _wiring(part[:chain[1]], chain[0], runner.batch._ops, start)
            if wiring is None:
                return False
            self.last = (chain[0], wiring)
        return self._round(runner, runner.batch, rec, start, n, m, *self.last, part)

    def _round(self, runner: Any, batch: Any, rec: Any, start: int, n: int, m: int,
               seq: list[int], wiring: tuple[int, ...], part: list[int]) -> bool:
        k, reps = len(seq), m // len(seq)
        old = _old_reads(part, wiring, start, n, k, reps)
        if old is None:
            return False  # (the repetitions are not wired alike)
        c = len(old)
        if c >= 2 * self.share_at and \
                len(set(part if c == len(part) else old.tolist())) * self.share_at <= c:
            return False  # shared reads (localise's rule): not direct
        kinds = len(batch._ops)
        if self.state[0] != kinds:  # (a kernel registered: the state may have changed)
            self.state = (kinds, _plans_of(segment_state(batch)))
        plans = self.state[1]
        key = (*self.tag, kinds, *seq, wiring, m)
        plan = plans.get(key, False)
        if plan is None:  # (learnt: not direct)
            return False
        if plan is False:
            runner.run()
            self.state = (-1, None)
            if len(plans) >= PLANS_KEPT:
                plans.clear()
            plans[key] = _learn(runner, batch, seq, wiring, old, start, n)
            return True
        t0 = time.perf_counter()
        if len(runner.op_all) < n:  # (no room: grown)
            runner.op_all = extend(runner.op_all, start, np.empty(m, np.int32))
        for j in range(k):
            runner.op_all[start + j:n:k] = plan.shape_ops[j]
        runner.inst.read(rec.marks, start, n)
        attrs = int_array(rec.attrs, start, n, "q")
        t1 = time.perf_counter()
        outs, seconds = _compute(runner, plan, old, reps, attrs)
        values = runner.values
        values.grow(n)
        base = len(values.outputs)
        rows = arange(reps)
        for j in range(k):
            values.batch[start + j:n:k] = base + j
            values.row[start + j:n:k] = rows
        values.outputs.extend(outs)
        runner.new = (start + k - 1, n, k, outs[-1])  # (the last position's nodes)
        runner.segments.append(DirectSegment(plan, attrs, runner.inst, old, start, n, seconds))
        runner.start, runner.op_start = n, len(rec.operands)
        sec = runner.seconds
        sec["graph"] += t1 - t0
        sec["segment"] += time.perf_counter() - t1
        return True


def _again(last: tuple[list[int], tuple[int, ...]] | None, ops: list[int], part: list[int],
           start: int, n: int, m: int) -> bool:
    """Whether the new nodes ``start..n-1`` (operands ``part``) repeat the ``last`` chain,
    the first repetition wired as there (what :func:`_chain` and :func:`_wiring` find)."""
    if last is None:
        return False
    seq, wiring = last
    k, width = len(seq), len(wiring)
    reps = m // k
    return not m % k and len(part) == width * reps and ops[start:n] == seq * reps and \
        tuple([v - start if v >= start else -1 for v in part[:width]]) == wiring


def _chain(batch: Any, rec: Any, start: int, n: int, m: int, operands: int
           ) -> tuple[list[int], int] | None:
    """``(op types of one repetition, its operand count)`` if the new nodes ``start..n-1``
    repeat one chain of at most :data:`MAX_CHAIN` fixed-arity op types (the shortest that
    fits) and the new operands are as many as they read; else ``None``."""
    ops, first, k = rec.ops, rec.ops[start], 0
    while True:  # (the next node of the first one's op type starts the second repetition)
        try:
            k = ops.index(first, start + k + 1, n) - start
        except ValueError:
            k = m
        if k > MAX_CHAIN:
            return None
        if not m % k:
            seq = ops[start:start + k]
            if ops[start:n] == seq * (m // k):
                break
    width = 0
    vocab = batch._ops
    for x in seq:
        a = vocab[x].arity
        if not a:  # (an input, a zero state or a variadic op: not direct)
            return None
        width += a
    return (seq, width) if operands == width * (m // k) else None


def _wiring(row: list[int], seq: list[int], vocab: Any, start: int) -> tuple[int, ...] | None:
    """Per operand of the first repetition (``row``) where it reads: ``-1`` an earlier
    segment's node, ``j`` the node of chain position ``j`` before its own; ``None`` if one
    reads a later or its own position, or a position's earlier-segment reads differ in
    shape."""
    out: list[int] = []
    at = 0
    for j, x in enumerate(seq):
        op = vocab[x]
        shapes = op.in_shapes
        if not shapes:
            return None
        seen = None
        for s in range(op.arity):
            v = row[at + s] - start
            if v >= j:
                return None
            if v < 0:
                if seen is not None and shapes[s] != seen:
                    return None  # (one gather per position: one row shape)
                seen = shapes[s]
            out.append(v if v >= 0 else -1)
        at += op.arity
    return tuple(out)


def _old_reads(part: list[int], wiring: tuple[int, ...], start: int, n: int, k: int,
               reps: int) -> NDArray[np.int64] | None:
    """The round's reads of earlier segments' nodes in operand order (``part``: its
    operands, ``reps`` repetitions of ``wiring``), if every repetition is wired as the first
    (else ``None``)."""
    width, old_cols = len(wiring), [i for i, w in enumerate(wiring) if w < 0]
    if len(old_cols) == width:  # (one cell, or reads of earlier segments only)
        if reps > 1 and max(part) >= start:
            return None
        return np.fromiter(part, np.int64, len(part))
    for c, w in enumerate(wiring):  # (each the node of its own repetition's position)
        if w >= 0 and reps > 1 and part[c::width] != list(range(start + w, n, k)):
            return None
    if len(old_cols) == 1:
        olds = part[old_cols[0]::width]
        return None if reps > 1 and max(olds) >= start else np.fromiter(olds, np.int64, reps)
    old = np.fromiter(part, np.int64, len(part)).reshape(reps, width)[:, old_cols]
    return None if reps > 1 and int(old.max()) >= start else old.reshape(-1)


def _compute(runner: Any, plan: DirectPlan, old: NDArray[np.int64], reps: int,
             attrs: NDArray[np.int64]) -> tuple[list[Tensor], float]:
    """The round's outputs per chain position and the kernels' seconds (``old``: the reads
    of earlier segments' nodes in operand order, ``reps`` repetitions): per position its
    operand rows of earlier segments instance after instance, the kernel on their column
    blocks and on earlier positions' outputs; under ``no_grad``, as the long path runs an
    inference segment (a kernel may take another path for a tensor that records autograd)."""
    if not torch.is_grad_enabled():  # (an inference loop's no_grad: no second one)
        return _outputs(runner, plan, old, reps, attrs)
    with torch.no_grad():
        return _outputs(runner, plan, old, reps, attrs)


def _outputs(runner: Any, plan: DirectPlan, old: NDArray[np.int64], reps: int,
             attrs: NDArray[np.int64]) -> tuple[list[Tensor], float]:
    k = len(plan.steps)
    params = runner.batch.params
    gather = runner.values.gather
    outs: list[Tensor] = []
    seconds = 0.0
    # (each position's attrs a contiguous row: one copy and one tensor for all positions)
    by_step = torch.from_numpy(attrs if k == 1 else attrs.reshape(reps, k).T.copy())
    for j, step in enumerate(plan.steps):
        blocks: Any = ()
        a = step.reads
        if a:
            rows = gather(old if step.old is None else
                          old.reshape(reps, -1)[:, step.old].reshape(-1))
            # (instance after instance: no cat for a concatenating kernel, side_by_side)
            blocks = (rows,) if a == 1 else rows.reshape(reps, -1).split(rows.shape[1], dim=1)
        inputs = [blocks[b] if src < 0 else outs[src] for src, b in step.slots]
        at = by_step if k == 1 else by_step[j]
        t = time.perf_counter()
        outs.append(step.kernel(step.op, inputs, params, at))
        seconds += time.perf_counter() - t
    return outs, seconds


def _learn(runner: Any, batch: Any, seq: list[int], wiring: tuple[int, ...],
           old: NDArray[np.int64], start: int, n: int) -> DirectPlan | None:
    """The plan of a round just run the long way, if each chain position's values are one
    batch of it in instance order, equal to the direct computation's (``None``: never)."""
    seg = runner.segments[-1]
    if runner.start != n or not isinstance(seg.graph, Graph):
        return None
    base, c, m, k, reps = seg.graph, len(old), n - start, len(seq), (n - start) // len(seq)
    if len(base.attrs) != c + m or len(base.outputs):  # (a tail: not a plain round)
        return None
    values = runner.values
    want = []
    for j in range(k):
        b, row = values.batch[start + j:n:k], values.row[start + j:n:k]
        if b[0] < 0 or not (b == b[0]).all() or not np.array_equal(row, arange(reps)) or \
                values.outputs[int(b[0])].shape[0] != reps:
            return None  # (the long path batches the position otherwise)
        want.append(values.outputs[int(b[0])])
    originals = segment_state(batch).capture.originals
    steps, at, seen = [], 0, 0
    olds = c // reps  # (a repetition's reads of earlier segments' nodes)
    for x in seq:
        op = batch._ops[x]
        mine = wiring[at:at + op.arity]
        reads = sum(w < 0 for w in mine)
        cols = None if reads == olds else np.arange(seen, seen + reads)
        blocks = iter(range(reads))
        slots = tuple((-1, next(blocks)) if w < 0 else (w, 0) for w in mine)
        steps.append(Step(op, kernel_for(op, originals), reads, cols, slots))
        at, seen = at + op.arity, seen + reads
    plan = DirectPlan(steps, base, seg.schedule, dict(seg.run.stats),
                      int(seg.run.num_kernel_calls), np.asarray(runner.shape_op)[seq])
    try:  # (a kernel that refuses column-block views: never direct)
        outs, _ = _compute(runner, plan, old, reps, base.attrs[c:].copy())
    except Exception:  # (any failure only means the long path stays)
        return None
    for out, w in zip(outs, want, strict=True):
        if out.shape != w.shape or out.dtype != w.dtype or not torch.equal(out, w):
            return None
    return plan


def _frozen(a: NDArray[Any], dtype: Any) -> NDArray[Any]:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.flags.writeable = False
    return a
