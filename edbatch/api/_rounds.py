"""A round's structure, read from the recording once and reused while it repeats.

Every synchronisation of :meth:`DynamicBatch.run_programs
<edbatch.api.DynamicBatch.run_programs>` runs what the programs recorded since the last one
as a segment. Its graph is the new nodes plus one ``value/<shape>`` node per earlier node
they read (:meth:`~edbatch.api._programs._Runner.run`), so most rounds of a mini-batch
repeat one structure: every greedy decoding step over the same sentences, a parser's
decisions over the same number of sentences. What that structure fixes is made on its
first occurrence and kept in a :class:`RoundPlan` (per :class:`~edbatch.api._segments.
SegmentState`, so later mini-batches find it too): the vocabulary, which value parameters
gather which reads, the segment's op ids, operand counts, operands and outputs, the
constant attrs of its value nodes and the segment-cache key
(:class:`~edbatch.api._segments.SegmentCache`). A round whose :func:`signature` was seen
before then only reads its attrs and the nodes it reads from the recording (a handful of
numpy calls), gathers their values and runs the cached program: no value grouping, array
assembly or structure hashing per round.

The signature is the round's structure in bytes: the new nodes' op ids (and variadic operand
counts), each operand as the index of its value node (a read of an earlier node) or of its
new node relative to the round's first (:func:`localise`), the loss terms the same way, and
the shapes of the earlier nodes read (:func:`shape_ops`: they decide the value nodes). Two
rounds of equal signatures make equal segment arrays except the attrs and instances, which the
schedulers, memory planner and compiled programs do not read (their attrs are rebound).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch._lru import COLD_AFTER, PROBE_EVERY, Lru
from edbatch.api._assemble import warn_outside

__all__ = ["COLD_AFTER", "PROBE_EVERY", "Follow", "Instances", "Lru", "RoundPlan", "Rounds",
           "arange", "extend", "instances", "last_rows", "localise", "op_array", "shape_ops",
           "slot_major", "value_groups", "whole_batch"]


@dataclass
class RoundPlan:
    """What a round's structure fixes (module docstring): ``arrays`` holds the segment's
    ``op_ids``, ``counts``, ``operands``, ``outputs`` and ``sizes`` (``[c, m]``: value
    nodes, new nodes); ``groups`` per value parameter its name and the positions among the
    earlier nodes read that it gathers (``None``: all of them, in order); ``tail`` the attrs
    after the new nodes (``[-1]`` for a loss sum, else none)."""

    vocab: Any
    key: tuple[Any, ...] | None  # None: not looked up (:meth:`Lru.cold`)
    arrays: dict[str, NDArray[Any]]
    groups: tuple[tuple[str, NDArray[np.int64] | None], ...]
    old_attrs: NDArray[np.int64]
    tail: NDArray[np.int64]

    def attrs(self, new: NDArray[np.int64]) -> NDArray[np.int64]:
        """The segment's attrs with ``new`` those of the round's new nodes."""
        return np.concatenate([self.old_attrs, new, self.tail])


class Rounds(Lru[RoundPlan]):
    """Round plans by the round's structure in bytes (module docstring)."""


class Follow:
    """The last round's structure, so that a round repeating it shifted by a constant (the
    next decoding step of the same sentences: every operand and loss term ``d`` nodes
    later, the earlier nodes read of the same shapes) takes its :class:`RoundPlan` and
    :func:`localise`'s renumbering without localising or hashing its signature. Equal
    inputs shifted give equal outputs shifted: ``localise`` reads only the order and
    equality of node ids and which lie below the round's first."""

    __slots__ = ("flat", "found", "losses", "new_ops", "old_ops", "start", "tag")

    def __init__(self) -> None:
        self.tag: tuple[Any, ...] | None = None

    def match(self, tag: tuple[Any, ...], start: int, new_ops: NDArray[np.int32],
              counts: NDArray[np.int64] | None, flat: NDArray[np.int64],
              losses: NDArray[np.int64], op_all: NDArray[np.int32]
              ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                         RoundPlan] | None:
        """``(old, local, loss_local, plan)`` of this round if it is the last one shifted
        (``tag``: what else the plan depends on; ``counts``: variadic operand counts)."""
        if tag != self.tag or counts is not None or len(flat) != len(self.flat) or \
                len(losses) != len(self.losses) or not np.array_equal(new_ops, self.new_ops):
            return None
        d = start - self.start
        if (len(flat) and flat[0] != self.flat[0] + d) or not (  # (a parser's: at once)
                np.array_equal(flat, self.flat + d) and np.array_equal(losses, self.losses + d)):
            return None
        old, local, loss_local, plan = self.found
        old = old + d
        if not np.array_equal(op_all[old], self.old_ops):
            return None
        self.start, self.flat, self.losses = start, flat, losses
        self.found = (old, local, loss_local, plan)
        return self.found

    def keep(self, tag: tuple[Any, ...] | None, start: int, new_ops: NDArray[np.int32],
             flat: NDArray[np.int64], losses: NDArray[np.int64], old: NDArray[np.int64],
             local: NDArray[np.int64], loss_local: NDArray[np.int64], plan: RoundPlan,
             op_all: NDArray[np.int32]) -> None:
        """Remember a round localised and planned the long way (``tag`` ``None``: a round
        with variadic nodes or a plan without a cache key, never followed)."""
        self.tag, self.start, self.new_ops, self.flat, self.losses = \
            tag, start, new_ops, flat, losses
        self.old_ops = op_all[old]
        self.found = (old, local, loss_local, plan)


_ALL: dict[int, NDArray[np.int64]] = {}


def arange(k: int) -> NDArray[np.int64]:
    """``np.arange(k)`` (read-only, made once per length)."""
    got = _ALL.get(k)
    if got is None:
        got = _ALL[k] = np.arange(k, dtype=np.int64)
        got.flags.writeable = False
        if len(_ALL) > 4096:
            _ALL.clear()
    return got


def localise(flat: NDArray[np.int64], losses: NDArray[np.int64], start: int, share_at: int
             ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """``(old, local, loss_local)``: the earlier nodes (ids below ``start``) that operands
    ``flat`` and loss terms ``losses`` read, one per read in order, or each distinct one
    once (sorted) when there are ``share_at`` reads or more per distinct node; and the
    operands and loss terms renumbered for the segment: a read of an earlier node as the
    index of its value node, a new node ``v`` as ``len(old) + v - start``."""
    is_old = flat < start
    old = flat[is_old]
    reads = len(old)
    old_loss = None
    if len(losses):
        old_loss = losses < start
        old = np.concatenate([old, losses[old_loss]])
    c = len(old)
    where = arange(c)  # each read's value node
    if c >= share_at * 2:  # the distinct nodes read; the mapping only if shared
        lo = int(old.min())
        span = start - lo
        if span <= 4 * c:  # a dense range (a layer's token rows): marks, no sort
            mark = np.zeros(span, bool)
            mark[old - lo] = True
            distinct = np.flatnonzero(mark)
            if len(distinct) * share_at <= c:
                lut = np.empty(span, np.int64)
                lut[distinct] = arange(len(distinct))
                old, where = distinct + lo, lut[old - lo]
                c = len(old)
        else:
            s = np.sort(old)
            first = np.empty(c, bool)
            first[0] = True
            np.not_equal(s[1:], s[:-1], out=first[1:])
            if int(np.count_nonzero(first)) * share_at <= c:
                distinct = s[first]
                old, where = distinct, np.searchsorted(distinct, old)
                c = len(old)
    local = flat + (c - start)
    local[is_old] = where[:reads]
    loss_local = losses + (c - start)
    if old_loss is not None:
        loss_local[old_loss] = where[reads:]
    return old, local, loss_local


def slot_major(local: NDArray[np.int64], loss_local: NDArray[np.int64], c: int,
               new_ops: NDArray[np.int32], counts: NDArray[np.int64]
               ) -> tuple[NDArray[np.int64] | None, NDArray[np.int64], NDArray[np.int64]]:
    """The value nodes (``0..c-1``, one per read of an earlier node, in read order) put in
    the order of their readers' op type, operand slot and node: ``(perm, local, loss_local)``
    with ``perm[k]`` the read that value node ``k`` now is (``None``: already so) and the
    operands renumbered. A batch's reads of one slot are then consecutive rows of the
    value batch (views, no gather): a parser's four features per decision, say. Made once
    per :class:`RoundPlan` (the order follows from the round's structure)."""
    if not c:
        return None, local, loss_local
    m = len(new_ops)
    ptr = np.zeros(m + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    owner = np.repeat(np.arange(m), counts)
    is_value, loss_value = local < c, loss_local < c
    types = np.concatenate([new_ops[owner][is_value].astype(np.int64),
                            np.full(int(loss_value.sum()), 1 << 40)])
    slots = np.concatenate([(np.arange(len(local)) - ptr[owner])[is_value],
                            np.flatnonzero(loss_value)])
    nodes = np.concatenate([owner[is_value], np.zeros(int(loss_value.sum()), np.int64)])
    reads = np.concatenate([local[is_value], loss_local[loss_value]])
    perm = reads[np.lexsort((nodes, slots, types))]
    if np.array_equal(perm, np.arange(c)):
        return None, local, loss_local
    inv = np.empty(c, np.int64)
    inv[perm] = np.arange(c)
    local, loss_local = local.copy(), loss_local.copy()
    local[is_value] = inv[local[is_value]]
    loss_local[loss_value] = inv[loss_local[loss_value]]
    return perm, local, loss_local


def instances(marks: list[tuple[int, int]], last: int, start: int, n: int
              ) -> NDArray[np.int32]:
    """The instance of nodes ``start..n-1`` from ``marks`` (``(first node, instance)``,
    every one at or after ``start``) and ``last``, the instance in effect before them."""
    m = np.fromiter(chain.from_iterable(marks), np.int64, 2 * len(marks)).reshape(-1, 2)
    bounds = np.empty(len(m) + 2, np.int64)
    bounds[0], bounds[-1] = start, n
    np.minimum(m[:, 0], n, out=bounds[1:-1])
    values = np.empty(len(m) + 1, np.int32)
    values[0] = last
    values[1:] = m[:, 1]
    return np.repeat(values, np.diff(bounds))


class Instances:
    """The instances of a mini-batch's nodes, from the recording's ``(first node,
    instance)`` marks, read segment by segment (:meth:`read`). Where only
    ``run_programs``'s loop made a segment's marks (one per program and round, counted in
    ``marks``; none made inside a program), every node is in its program's instance, so
    they are worked out only when a graph asks (:meth:`of`); else at once, with a warning
    for nodes recorded outside every instance."""

    def __init__(self, batch: Any, marks: int) -> None:
        self.batch, self.marks = batch, marks
        self.all = np.zeros(0, np.int32)  # every node's instance, up to the pending rounds
        self.pending: list[tuple[int, int, list[tuple[int, int]], int]] = []
        self.mark_at, self.last = 0, -1  # the marks read so far; the instance then

    def read(self, marks: list[tuple[int, int]], start: int, n: int) -> None:
        """Take the marks of nodes ``start..n-1`` (recorded since the last segment)."""
        new = marks[self.mark_at:]
        self.mark_at = len(marks)
        last, expected = self.last, self.marks
        self.marks = 0
        if new:
            self.last = new[-1][1]
        if len(new) == expected:
            self.pending.append((start, n, new, last))
            return
        self.of(np.zeros(0, np.int64), start, start, False)  # the rounds before, in order
        inst = instances(new, last, start, n)
        if len(inst) and inst.min() < 0:
            warn_outside(self.batch, int((inst < 0).sum()))
            inst[inst < 0] = 0
        self.all = extend(self.all, start, inst)

    def of(self, old: NDArray[np.int64], start: int, n: int, loss: bool) -> NDArray[np.int32]:
        """A segment's instances: those of the earlier nodes it reads (``old``), of its new
        nodes ``start..n-1`` and ``0`` for its loss sum (``loss``)."""
        while self.pending and self.pending[0][0] < n:
            s, e, marks, last = self.pending.pop(0)
            self.all = extend(self.all, s, instances(marks, last, s, e))
        tail = [np.zeros(1, np.int32)] if loss else []
        return np.concatenate([self.all[old], self.all[start:n], *tail])


def extend(buf: NDArray[Any], at: int, new: NDArray[Any]) -> NDArray[Any]:
    """``buf[:at]`` followed by ``new``, in ``buf`` when it has room (else in one twice as
    large): entries past the end are never read."""
    end = at + len(new)
    if end > len(buf):
        grown = np.empty(max(end, 2 * len(buf)), buf.dtype)
        grown[:at] = buf[:at]
        buf = grown
    buf[at:end] = new
    return buf


def last_rows(new: tuple[int, int, int, Any] | None, nodes: NDArray[np.int64]) -> Any:
    """The values of ``nodes`` if they are the last segment's new nodes ``first, first +
    step, .. < stop`` in order, the rows of one batch output, ``new = (first, stop, step,
    that output)`` (a parser's scores, a decoder's logits: what ``Values.gather`` finds with
    more numpy calls), else ``None``."""
    if new is None:
        return None
    first, stop, step, out = new
    k = len(nodes)
    if k != len(out) or nodes[0] != first or nodes[-1] != stop - 1 or \
            (k > 2 and not bool((nodes[1:] - nodes[:-1] == step).all())):
        return None
    return out


def whole_batch(batch_of: NDArray[np.int64], row_of: NDArray[np.int64], c: int, m: int
                ) -> int:
    """The batch of a typed segment (``batch_of``, ``row_of``: each node's batch and row)
    made of exactly its new nodes ``c..c+m-1``, in order, for :func:`last_rows`; ``-1``:
    none (they are spread over several, or share theirs)."""
    if not m:
        return -1
    b = int(batch_of[c])
    if not (batch_of[c:c + m] == b).all() or int(np.count_nonzero(batch_of == b)) != m or \
            not np.array_equal(row_of[c:c + m], arange(m)):
        return -1
    return b


def op_array(ops: list[int], start: int, stop: int) -> NDArray[np.int32]:
    """``ops[start:stop]`` (a recording's op ids, Python ints) as a writable ``int32``
    array: through ``bytes`` while every id is below 256 (one C check per entry, about
    0.45x the time of ``np.fromiter``), else ``np.fromiter``."""
    part = ops if start == 0 and stop == len(ops) else ops[start:stop]
    try:
        return np.frombuffer(bytes(part), np.uint8).astype(np.int32)
    except ValueError:  # (an op id of 256 or more)
        return np.fromiter(part, np.int32, len(part))


def shape_ops(ops: list[Any]) -> NDArray[np.int32]:
    """Per op type of ``ops`` the first one of its output shape (stable as op types are
    added): the op id a round's signature keeps for an earlier node it reads."""
    first: dict[Any, int] = {}
    return np.array([first.setdefault(op.out_shape, k) for k, op in enumerate(ops)], np.int32)


#: Op lists whose shape index :func:`value_groups` keeps.
_SHAPES_KEPT = 256
_SHAPES: dict[int, tuple[list[Any], int, list[Any], NDArray[np.int64]]] = {}


def value_groups(ops: list[Any], op_ids: NDArray[Any]
                 ) -> list[tuple[tuple[int, ...], NDArray[np.int64]]]:
    """The positions in ``op_ids`` grouped by their op type's output shape, shapes sorted:
    ``(shape, positions)`` pairs, from one shape index per op type (no per-node Python)."""
    if not len(op_ids):
        return []
    hit = _SHAPES.get(id(ops))
    if hit is None or hit[0] is not ops or hit[1] != len(ops):  # op types are only added
        shapes = sorted({op.out_shape for op in ops})
        index = {shape: k for k, shape in enumerate(shapes)}
        hit = _SHAPES[id(ops)] = (ops, len(ops), shapes,
                                  np.array([index[op.out_shape] for op in ops], np.int64))
        while len(_SHAPES) > _SHAPES_KEPT:
            del _SHAPES[next(iter(_SHAPES))]
    _, _, shapes, of_op = hit
    sid = of_op[op_ids]
    lo = int(sid.min())
    if lo == int(sid.max()):  # one shape (a decoding round's states)
        return [(shapes[lo], np.arange(len(sid)))]
    return [(shapes[k], np.flatnonzero(sid == k))
            for k in np.flatnonzero(np.bincount(sid, minlength=len(shapes))).tolist()]
