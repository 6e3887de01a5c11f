"""Direct rounds: a repeated one-cell round of ``run_programs`` run as one gather and one
kernel call, with no per-round planning.

A parser's decision round records, per live sentence, one ``scores`` node over four earlier
feature nodes, and asks for its argmax. Through :meth:`_Runner.run
<edbatch.api._programs._Runner.run>` every such round localises its reads, hashes its
structure, finds its :class:`~edbatch.api._rounds.RoundPlan` and segment-cache entry, binds
the cached typed program's attrs and runs it (a value batch, then the cell over its slot
views): about 0.2 ms of host work per round around a kernel of about the same cost.

A round is *direct* when (CPU inference, typed segments) its ``m`` new nodes are all of one
op type of fixed arity ``a`` whose operand shapes are all one, every operand is an earlier
segment's node, too few reads share a node for the segment to give several reads one value node
(:func:`~edbatch.api._rounds.localise`'s rule), there is no loss term nor new input row,
and a round of that op type and ``m`` ran the long way before in this segment state with
the same output as the direct computation (checked once, when it is learnt, bitwise). Then
its value is computed as the long path computes it, less the planning: the ``a * m``
operand rows gathered instance after instance (:meth:`Values.gather
<edbatch.api._values.Values.gather>`, one ``index_select``) and viewed as ``[m, a * w]``,
the cell's kernel on its ``a`` column blocks (the values of the long path's slot views; a
kernel that concatenates them takes the block itself,
:func:`~edbatch.executor.cells_parser.side_by_side`). The segment's graph (the long path's,
with this round's attrs and instances) and schedule (the cached one: a one-op-type round
has no other) are made only when read (:class:`DirectSegment`).

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

__all__ = ["DIRECT", "DirectPlan", "DirectRounds", "DirectSegment"]

#: Whether ``run_programs`` takes direct rounds (module docstring).
DIRECT = os.environ.get("EDBATCH_DIRECT_ROUNDS", "1") != "0"

#: Direct plans kept per segment state (op type and round size pairs).
PLANS_KEPT = 1024


@dataclasses.dataclass
class DirectPlan:
    """What a direct round of one op type and size reuses: the long path's first graph of
    it (``base``: value nodes' attrs ``base.attrs[:c]``, a loss-free tail), its schedule
    and run stats, and the kernel. (Its operands' shapes are the op type's, which the cell
    call checks: so are the shape ops the long path's plan keys on.)"""

    op: Any
    kernel: Any
    base: Graph
    schedule: Schedule
    stats: dict[str, float]
    steps: int


class DirectSegment:
    """A direct round's segment: ``graph`` (made when first read, as the long path's cached
    segments make theirs), ``schedule`` and ``run`` (its :class:`RunResult`, made when
    read) as :class:`~edbatch.api._programs.Segment` has them."""

    __slots__ = ("_graph", "_make", "_plan", "_run", "schedule")

    def __init__(self, plan: DirectPlan, attrs: NDArray[np.int64], inst: Instances,
                 old: NDArray[np.int64], start: int, n: int, seconds: float) -> None:
        self._graph: Graph | None = None
        self._make = (attrs, inst, old, start, n)
        self._plan = plan
        self._run: RunResult | float = seconds  # (the kernel's seconds until ``run`` is read)
        self.schedule = plan.schedule

    @property
    def run(self) -> RunResult:
        if not isinstance(self._run, RunResult):
            stats = dict(self._plan.stats)
            stats["exec/seconds"] = self._run
            self._run = RunResult({}, None, self._plan.steps, stats, self._run)
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
        batch = runner.batch
        self.on = DIRECT and not runner.grad and _typed.TYPED and batch.device.type == "cpu"
        self.tag = (runner.maker, runner.strategy)
        self.share_at = share_at  # (the long path's rule: localise's)
        self.state: tuple[int, Any] = (-1, None)  # (op types then, their segment state)

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
                len(rec.counts) != runner.count_start:
            return False
        return self._uniform(runner, runner.batch, rec, start, n, m, rec.ops[start])

    def _uniform(self, runner: Any, batch: Any, rec: Any, start: int, n: int, m: int,
                 x: int) -> bool:
        ops = rec.ops
        if ops[n - 1] != x or ops[start:n].count(x) != m:
            return False
        op = batch._ops[x]
        a = op.arity
        shapes = op.in_shapes
        if not a or not shapes or len(set(shapes)) != 1 or \
                (rec.blocks and rec.blocks[-3] >= start):
            return False
        if len(rec.operands) - runner.op_start != a * m:
            return False
        c = a * m
        part = rec.operands[runner.op_start:]  # (no operand block: checked above)
        if max(part) >= start or \
                (c >= 2 * self.share_at and len(set(part)) * self.share_at <= c):
            return False  # a new node read, or shared reads (localise's rule): not direct
        flat = np.fromiter(part, np.int64, c)
        kinds = len(batch._ops)
        if self.state[0] != kinds:  # (a kernel registered: the state may have changed)
            self.state = (kinds, _plans_of(segment_state(batch)))
        plans = self.state[1]
        key = (*self.tag, kinds, x, m)
        plan = plans.get(key, False)
        if plan is None:  # (learnt: not direct)
            return False
        if plan is False:
            runner.run()
            self.state = (-1, None)
            if len(plans) >= PLANS_KEPT:
                plans.clear()
            plans[key] = _learn(runner, batch, op, flat, start, n, m, a)
            return True
        t0 = time.perf_counter()
        if len(runner.op_all) >= n:  # (room: filled in place)
            runner.op_all[start:n] = runner.shape_op[x]
        else:
            runner.op_all = extend(runner.op_all, start, np.full(m, runner.shape_op[x], np.int32))
        runner.inst.read(rec.marks, start, n)
        attrs = int_array(rec.attrs, start, n, "q")
        t1 = time.perf_counter()
        out, seconds = _compute(runner, plan, flat, attrs, m, a)
        values = runner.values
        values.grow(n)
        values.batch[start:n] = len(values.outputs)
        values.row[start:n] = arange(m)
        values.outputs.append(out)
        runner.new = (start, n, out)
        runner.segments.append(DirectSegment(plan, attrs, runner.inst, flat, start, n, seconds))
        runner.start, runner.op_start = n, len(rec.operands)
        sec = runner.seconds
        sec["graph"] += t1 - t0
        sec["segment"] += time.perf_counter() - t1
        return True


def _compute(runner: Any, plan: DirectPlan, flat: NDArray[np.int64], attrs: NDArray[np.int64],
             m: int, a: int) -> tuple[Tensor, float]:
    """The round's output and the kernel's seconds: the operand rows instance after instance,
    the kernel on their ``a`` column blocks."""
    rows = runner.values.gather(flat)  # (instance after instance: no cat for a concatenating
    t = time.perf_counter()           # kernel, cells_parser.side_by_side)
    width = rows.shape[1]
    out = plan.kernel(plan.op, rows.view(m, a * width).split(width, dim=1), runner.batch.params,
                      torch.from_numpy(attrs))
    return out, time.perf_counter() - t


def _learn(runner: Any, batch: Any, op: Any, flat: NDArray[np.int64], start: int, n: int,
           m: int, a: int) -> DirectPlan | None:
    """The plan of a round just run the long way, if computing it directly gives the same
    output (``None``: never direct)."""
    seg = runner.segments[-1]
    new = runner.new
    if new is None or new[0] != start or new[1] != n or not isinstance(seg.graph, Graph):
        return None
    base = seg.graph
    plan = DirectPlan(op, kernel_for(op, segment_state(batch).capture.originals), base,
                      seg.schedule, dict(seg.run.stats), int(seg.run.num_kernel_calls))
    c = len(flat)
    if len(base.attrs) != c + m or len(base.outputs):  # (a tail: not a plain round)
        return None
    try:  # (a kernel that refuses column-block views: never direct)
        with torch.no_grad():
            out, _ = _compute(runner, plan, flat, base.attrs[c:].copy(), m, a)
    except Exception:  # (any failure only means the long path stays)
        return None
    if out.shape != new[2].shape or out.dtype != new[2].dtype or not torch.equal(out, new[2]):
        return None
    return plan


def _frozen(a: NDArray[Any], dtype: Any) -> NDArray[Any]:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.flags.writeable = False
    return a
