"""Compiled schedulers: the registry's rules and the FSM's run-time path on the numba core.

:mod:`edbatch.schedule._compiled` runs a whole schedule in one call; this module turns a
:class:`~edbatch.graph.ir.Graph` into its flat arrays (cached per graph), runs the core and
builds the same :class:`~edbatch.schedule.schedule.Schedule` the Python path returns.

Backend choice: ``make_scheduler(name, backend="python")``, or ``EDBATCH_BACKEND=python`` in
the environment; the default is ``compiled`` for every rule the core implements
(:data:`COMPILED_RULES`, plus ``typewise_greedy_backward``); the others stay Python.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import ScheduleError, UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph
from edbatch.schedule import _compiled as core
from edbatch.schedule import bounds
from edbatch.schedule._compiled_analysis import (
    core_inputs,
    flat_arrays,
    heights_numba,
    typewise_graph_numba,
)
from edbatch.schedule._compiled_replay import level_agenda_ranks
from edbatch.schedule.reverse import reversed_operands
from edbatch.schedule.schedule import Batch, Schedule, _batches_of

__all__ = ["BACKENDS", "COMPILED_ENCODINGS", "COMPILED_RULES", "CompiledFsmScheduler",
           "CompiledScheduler", "FsmTable", "compiled_arrays", "compiled_schedule", "core_schedule",
           "compiled_typewise_greedy_backward", "fsm_supported", "heights", "resolve_backend",
           "typewise"]

BACKENDS = ("compiled", "python")

#: scheduler / fallback name -> (rule id, needs T(a), needs heights)
COMPILED_RULES: dict[str, tuple[int, bool, bool]] = {
    "dynet_agenda": (core.RULE_DYNET_AGENDA, False, False),
    "ed_batch_agenda": (core.RULE_ED_BATCH_AGENDA, False, False),
    "max_frontier": (core.RULE_MAX_FRONTIER, False, False),
    "typewise_greedy": (core.RULE_TYPEWISE_GREEDY, True, False),
    "critical_path": (core.RULE_CRITICAL_PATH, True, True),
    "ed_batch": (core.RULE_KEY_LAST, False, False),  # the FSM's fallback only
}

#: FSM encoding name -> (encoding id, needs T(a), needs heights)
COMPILED_ENCODINGS: dict[str, tuple[int, bool, bool]] = {
    "base": (core.ENC_BASE, False, False),
    "sorted": (core.ENC_SORTED, False, False),
    "max": (core.ENC_MAX, False, False),
    "complete": (core.ENC_COMPLETE, True, False),
    "hints": (core.ENC_HINTS, True, True),
    "expert": (core.ENC_EXPERT, True, True),
    "rich": (core.ENC_RICH, True, True),
    "fill": (core.ENC_FILL, True, True),
    "crit": (core.ENC_CRIT, True, True),
    "tie": (core.ENC_TIE, True, True),
}


def resolve_backend(backend: str | None = None) -> str:
    """``backend``, or ``$EDBATCH_BACKEND``, or ``compiled``; checked against :data:`BACKENDS`."""
    name = backend if backend is not None else os.environ.get("EDBATCH_BACKEND", "compiled")
    if name not in BACKENDS:
        where = "the backend argument" if backend is not None else "EDBATCH_BACKEND"
        raise UnknownNameError(f"unknown scheduling backend {name!r} (from {where}); choose "
                               f"one of {list(BACKENDS)}." + did_you_mean(name, BACKENDS))
    return name


_EMPTY_I = np.zeros(0, np.int64)
_EMPTY_I.setflags(write=False)
_EMPTY_32 = np.zeros(0, np.int32)  # the type-wise arrays' dtypes: one compiled signature
_EMPTY_32.setflags(write=False)


@dataclass(frozen=True, slots=True)
class _Arrays:
    """A graph's flat arrays in the dtypes the core is compiled for."""

    op: NDArray[np.int64]
    depth: NDArray[np.int64]
    arity: NDArray[np.int64]
    uptr: NDArray[np.int64]
    uids: NDArray[np.int64]
    batchable: NDArray[np.bool_]
    mean: NDArray[np.float64]
    cplx: NDArray[np.bool_]


_ARRAYS: weakref.WeakKeyDictionary[Graph, _Arrays] = weakref.WeakKeyDictionary()
_TYPEWISE: weakref.WeakKeyDictionary[Graph, tuple[NDArray, NDArray, NDArray]] = (  # type: ignore[type-arg]
    weakref.WeakKeyDictionary())
_HEIGHTS: weakref.WeakKeyDictionary[Graph, NDArray[np.int64]] = weakref.WeakKeyDictionary()


def typewise(graph: Graph) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.int32]]:
    """:func:`edbatch.schedule.bounds.typewise_graph` (same relation and row order), from its
    cache if the Python analysis already ran on ``graph``, else compiled (cached per graph)."""
    out = bounds._TYPEWISE.get(graph) or _TYPEWISE.get(graph)
    if out is None:
        out = _TYPEWISE[graph] = typewise_graph_numba(
            _arrays(graph).op, graph.operand_ptr, graph.operand_ids.astype(np.int64))
    return out  # type: ignore[return-value]


def heights(graph: Graph) -> NDArray[np.int64]:
    """:func:`edbatch.schedule.bounds.heights`, compiled (cached per graph)."""
    out = bounds._HEIGHTS.get(graph)
    if out is None:
        out = _HEIGHTS.get(graph)
    if out is None:
        arr = _arrays(graph)
        out = _HEIGHTS[graph] = heights_numba(arr.uptr, arr.uids)
    return out


def _arrays(graph: Graph) -> _Arrays:
    out = _ARRAYS.get(graph)
    if out is None:
        op, depth, arity, uptr, uids, mean = flat_arrays(
            graph.op_ids, graph.operand_ptr, graph.operand_ids, graph.depth, len(graph.vocab))
        batchable, cplx = _vocab_flags(graph)
        out = _ARRAYS[graph] = _Arrays(op, depth, arity, uptr, uids, batchable, mean, cplx)
    return out


def _vocab_flags(graph: Graph) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """``(batchable, is_complex)`` per op type of the graph's vocabulary."""
    vocab = graph.vocab
    return (np.ascontiguousarray(vocab.batchable, dtype=np.bool_),
            np.array([o.is_complex for o in vocab], np.bool_))


def _fresh(graph: Graph) -> None:
    """The flat arrays, heights and type-wise graph of ``graph`` (nothing cached for it) in
    one compiled call (:func:`~edbatch.schedule._compiled_analysis.core_inputs`), cached as
    :func:`_arrays`, :func:`heights` and :func:`typewise` cache them; those already computed
    by the Python analyses (``bounds``' caches) are kept."""
    (op, depth, arity, uptr, uids, mean, height, *tw) = core_inputs(
        graph.op_ids, graph.operand_ptr, graph.operand_ids, graph.depth, len(graph.vocab),
        True, True)
    batchable, cplx = _vocab_flags(graph)
    _ARRAYS[graph] = _Arrays(op, depth, arity, uptr, uids, batchable, mean, cplx)
    _HEIGHTS.setdefault(graph, height)
    _TYPEWISE.setdefault(graph, tuple(tw))  # type: ignore[arg-type]


class FsmTable:
    """An FSM table ``state key -> op id`` as sorted key hashes and actions for the core.

    Raises:
        ScheduleError: two different keys of the table hash alike (then use the Python
            backend; with 64-bit hashes this needs billions of states).
    """

    def __init__(self, table: Mapping[tuple[int, ...], int]) -> None:
        keys = list(table)
        hashes = np.array([core.key_hash(k) for k in keys], dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        self.hashes = np.ascontiguousarray(hashes[order])
        self.actions = np.array([int(table[keys[i]]) for i in order], dtype=np.int64)
        if len(self.hashes) > 1 and np.any(self.hashes[1:] == self.hashes[:-1]):
            raise ScheduleError("two FSM states hash to the same 64-bit key; schedule this "
                                "policy with backend='python'")
        self.size = len(keys)


_NO_TABLE = FsmTable({})


def core_ids(rule: str, encoding: str | None = None) -> tuple[int, int, bool, bool]:
    """``(rule id, encoding id, needs the type-wise graph, needs heights)`` of a decision
    rule (a key of :data:`COMPILED_RULES`) with an optional FSM ``encoding``."""
    rule_id, need_tw, need_h = COMPILED_RULES[rule]
    enc_id = core.ENC_NONE
    if encoding is not None:
        enc_id, enc_tw, enc_h = COMPILED_ENCODINGS[encoding]
        need_tw, need_h = need_tw or enc_tw, need_h or enc_h
    return rule_id, enc_id, need_tw, need_h


def core_graph(graph: Graph, need_tw: bool, need_h: bool) -> tuple:  # type: ignore[type-arg]
    """The core's inputs for ``graph``: ``(flat arrays, heights, tw_pred, tw_ptr, tw_ids)``,
    the optional ones empty unless needed. On a fresh graph (none of them cached) that
    needs both analyses: all in one compiled call (:func:`_fresh`)."""
    if need_tw and need_h and graph not in _ARRAYS:
        _fresh(graph)
    height = heights(graph) if need_h else _EMPTY_I
    tw = typewise(graph) if need_tw else (_EMPTY_32, _EMPTY_I, _EMPTY_32)
    return (_arrays(graph), _read_only(height), *map(_read_only, tw))


def _read_only(a: NDArray) -> NDArray:  # type: ignore[type-arg]
    """``a`` as a read-only view: numba compiles one signature per array's writeable flag,
    so the core's optional inputs (cached or fresh, empty or not) always come read-only."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def fsm_encoding(table: FsmTable, fallback: str, encoding: str) -> str | None:
    """The encoding an FSM runs with on the core: none for an empty table (it decides by
    its fallback alone, and the Python path skips the key too), except ED-Batch's."""
    return None if not table.size and fallback != "ed_batch" else encoding


def compiled_arrays(graph: Graph, rule: str, *, encoding: str | None = None,
                    table: FsmTable | None = None) -> tuple:  # type: ignore[type-arg]
    """The core's raw result for ``graph`` (no :class:`Batch` objects):
    ``(batch_op, batch_forced, batch_ptr, nodes, hits, misses)``, see
    :func:`~edbatch.schedule._compiled.run_schedule`. Arguments as :func:`compiled_schedule`."""
    rule_id, enc_id, need_tw, need_h = core_ids(rule, encoding)
    arr, height, tw_pred, tw_ptr, tw_ids = core_graph(graph, need_tw, need_h)
    tab = table if table is not None else _NO_TABLE
    return core.run_schedule(  # type: ignore[no-any-return]
        arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height,
        tw_pred, tw_ptr, tw_ids, arr.mean, arr.cplx, rule_id, enc_id, tab.hashes, tab.actions)


def compiled_schedule(graph: Graph, rule: str, name: str, *, encoding: str | None = None,
                      table: FsmTable | None = None) -> tuple[Schedule, int, int]:
    """Schedule ``graph`` in compiled code with decision rule ``rule`` (a key of
    :data:`COMPILED_RULES`); with ``encoding``, ``table`` is looked up first at each decision.

    Returns:
        ``(schedule, table hits, table misses)`` (both 0 without an encoding).
    """
    t0 = time.perf_counter()
    bop, bforced, bptr, nodes, hits, misses = compiled_arrays(graph, rule, encoding=encoding,
                                                              table=table)
    return core_schedule(bop, bforced, bptr, nodes, name, t0), int(hits), int(misses)


def core_schedule(bop: NDArray[np.int64], bforced: NDArray[np.bool_], bptr: NDArray[np.int64],
                  nodes: NDArray[np.int64], name: str, t0: float | None = None) -> Schedule:
    """The :class:`Schedule` of a compiled loop's batch arrays (op ids, forced flags, batch
    pointers into ``nodes``), its :meth:`~Schedule.flat` arrays set to them, so the planner and
    the program read them instead of passing over every batch; ``t0``: the
    ``time.perf_counter()`` the scheduling started at (its ``seconds``)."""
    # (copies of the short slices: the core's N-long buffers behind them are freed; the
    # Batch objects made on first access to ``batches``)
    return Schedule.of_flat(bop.copy(), bptr.copy(), nodes, bforced.copy(), name,
                            0.0 if t0 is None else time.perf_counter() - t0)


def _reversed_arrays(graph: Graph) -> tuple[NDArray[np.int64], ...]:
    """:func:`~edbatch.schedule.reverse.reverse_graph`'s arrays without building a Graph:
    ``(op, operand_ptr, operand_ids, user_ptr, user_ids)`` of the reversed graph, users in
    the order :attr:`Graph.users` gives them (it decides the release order)."""
    n = graph.num_nodes
    optr, oids = reversed_operands(graph)
    consumer = np.repeat(np.arange(n, dtype=np.int64), np.diff(optr))
    users = consumer[np.argsort(oids, kind="stable")]
    rptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(oids, minlength=n), out=rptr[1:])
    return graph.op_ids[::-1].astype(np.int64), optr, oids, rptr, users


def compiled_level_agenda(graph: Graph, name: str = "dynet_level_agenda") -> Schedule:
    """:class:`~edbatch.schedule.heuristics.CompleteLevelAgendaPolicy` on the compiled core
    (:func:`~edbatch.schedule._compiled_replay.level_agenda_ranks`, its batches read off
    the nodes' ranks; the Python policy took ~90 s on a 20,000-node graph of 2,000 types)."""
    t0 = time.perf_counter()
    arr = _arrays(graph)
    rank = level_agenda_ranks(arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable,
                              arr.mean, arr.cplx)
    nodes = np.argsort(rank, kind="stable")  # (batch by batch, node ids ascending)
    ptr = np.zeros(int(rank.max()) + 2 if len(rank) else 1, np.int64)
    np.cumsum(np.bincount(rank, minlength=len(ptr) - 1), out=ptr[1:])
    bop = arr.op[nodes[ptr[:-1]]]
    return core_schedule(bop, ~arr.batchable[bop], ptr, nodes, name, t0)


def compiled_typewise_greedy_backward(graph: Graph) -> Schedule:
    """:func:`~edbatch.schedule.heuristics.typewise_greedy_backward` on the compiled core."""
    t0 = time.perf_counter()
    n = graph.num_nodes
    arr = _arrays(graph)
    op, optr, oids, uptr, uids = _reversed_arrays(graph)
    tw_pred, tw_ptr, tw_ids = map(_read_only, typewise_graph_numba(op, optr, oids))
    zeros = np.zeros(n, np.int64)
    bop, bforced, bptr, nodes, _, _ = core.run_schedule(
        op, zeros, np.diff(optr), uptr, uids, arr.batchable, _EMPTY_I, tw_pred, tw_ptr,
        tw_ids, arr.mean, arr.cplx, core.RULE_TYPEWISE_GREEDY, core.ENC_NONE, _NO_TABLE.hashes,
        _NO_TABLE.actions)
    back = _batches_of(bop, bptr, nodes, bforced)
    batches = tuple(Batch(b.op_id, np.sort((n - 1 - b.node_ids).astype(np.int32)), b.forced)
                    for b in reversed(back))
    return Schedule(batches, "typewise_greedy_backward", seconds=time.perf_counter() - t0)


#: Rules run by a whole-graph compiled pass of their own, not the core's decision loop.
_WHOLE_GRAPH = ("typewise_greedy_backward", "dynet_level_agenda")


class CompiledScheduler:
    """A registry rule run on the compiled core (a :data:`~edbatch.schedule.Scheduler`).

    Args:
        rule: a key of :data:`COMPILED_RULES`, ``typewise_greedy_backward`` or
            ``dynet_level_agenda``.
        name: the scheduler name stamped on its schedules (default ``rule``).
    """

    def __init__(self, rule: str, name: str | None = None) -> None:
        if rule not in COMPILED_RULES and rule not in _WHOLE_GRAPH:
            raise UnknownNameError(f"no compiled rule {rule!r}; compiled rules: "
                                   f"{sorted(COMPILED_RULES)}." + did_you_mean(rule,
                                                                               COMPILED_RULES))
        self.rule, self.name = rule, name or rule

    def __call__(self, graph: Graph) -> Schedule:
        if self.rule == "typewise_greedy_backward":
            s = compiled_typewise_greedy_backward(graph)
            return Schedule(s.batches, self.name, s.seconds)
        if self.rule == "dynet_level_agenda":
            return compiled_level_agenda(graph, self.name)
        return compiled_schedule(graph, self.rule, self.name)[0]

    def __repr__(self) -> str:
        return f"CompiledScheduler({self.name})"


def fsm_supported(encoding: str, fallback: str) -> bool:
    """Whether an FSM with this encoding and fallback can run on the compiled core."""
    return encoding in COMPILED_ENCODINGS and fallback in COMPILED_RULES


class CompiledFsmScheduler:
    """An FSM policy's run-time path (no lookahead) on the compiled core.

    ``policy`` is any object with ``table`` (key tuple -> op id), ``encoding``,
    ``fallback_name`` and ``hits`` / ``misses`` counters (``policies.fsm.FSMPolicy``); the
    counters advance as the Python path advances them. The table is hashed once and again
    only when ``policy.table`` is replaced or changes size.
    """

    def __init__(self, policy: object, name: str = "fsm") -> None:
        self.policy, self.name = policy, name
        self._table: FsmTable | None = None
        self._seen: tuple[int, int] = (0, -1)

    def table(self) -> FsmTable:
        """The policy's table in the core's form (rebuilt if the policy's dict changed)."""
        tab = self.policy.table  # type: ignore[attr-defined]
        if self._table is None or self._seen != (id(tab), len(tab)):
            self._table, self._seen = FsmTable(tab), (id(tab), len(tab))
        return self._table

    def __call__(self, graph: Graph) -> Schedule:
        p = self.policy
        table = self.table()
        fallback = p.fallback_name  # type: ignore[attr-defined]
        encoding = fsm_encoding(table, fallback, p.encoding)  # type: ignore[attr-defined]
        s, hits, misses = compiled_schedule(graph, fallback, self.name, encoding=encoding,
                                            table=table)
        p.hits += hits  # type: ignore[attr-defined]
        p.misses += misses if encoding is not None else s.num_decisions  # type: ignore[attr-defined]
        return s

    def __repr__(self) -> str:
        return f"CompiledFsmScheduler({self.name})"
