"""``replay:<heuristic>``: a forward decision rule that follows a whole-graph heuristic.

Some of the best heuristics are not forward rules an FSM could fall back on: ED-Batch's
``typewise_greedy_backward`` schedules the reversed graph, DyNet's ``dynet_level_agenda``
looks at whole (depth, type) levels. The replay rule runs such a heuristic once per graph,
records each node's *rank* (the index of the batch that ran it in the heuristic's schedule)
and then, scheduling forward (choose an op type, run all its ready nodes), takes the ready
op type holding the ready node of smallest rank. Ties (two types holding nodes of one rank)
cannot occur with ranks from a schedule, since each batch holds one op type; the rule would
take the smallest op id. As an FSM fallback it is named ``replay:<heuristic>`` (e.g.
``replay:typewise_greedy_backward``), and the artifact records that name.

Replaying is not the heuristic's schedule (running *all* ready nodes of the chosen type can
pull nodes the heuristic ran later into an earlier batch), but it **never needs more
batches** than the replayed schedule ``B_0 .. B_{m-1}`` (one op type per batch, unbatchable
nodes alone). At a decision let ``r`` be the smallest ready rank. Every unexecuted node of
rank ``< r`` would have an unexecuted predecessor of still smaller rank, down to one that is
ready (forced nodes never wait), a contradiction; so ``B_0 .. B_{r-1}`` are done, every
unexecuted node of ``B_r`` is ready, and the decision (``B_r``'s op type, all its ready
nodes) finishes ``B_r``. Each decision thus finishes a batch the earlier ones had not, and
each unbatchable node is one batch in both. A hypothesis test checks it on random graphs;
docs/learning_alternatives.md has the counts on the real workloads.

The compiled rule is :mod:`edbatch.schedule._compiled_replay`; :class:`ReplayPolicy` is its
Python twin (the oracle in tests).
"""

from __future__ import annotations

import time
import weakref

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph
from edbatch.schedule import compiled as cc
from edbatch.schedule._compiled_replay import level_agenda_ranks, run_replay
from edbatch.schedule.frontier import FrontierView
from edbatch.schedule.named import HEURISTICS, make_heuristic
from edbatch.schedule.policy import run_policy
from edbatch.schedule.schedule import Schedule, _batches_of

__all__ = ["PREFIX", "REPLAYABLE", "ReplayFsmScheduler", "ReplayPolicy", "ReplayScheduler",
           "rank_of", "replay_arrays", "replay_fsm_supported", "replay_heuristic",
           "replay_names", "replay_ranks",
           "replay_trace"]

PREFIX = "replay:"

#: Heuristics a replay rule may follow: the registry's deterministic whole-graph heuristics.
REPLAYABLE = HEURISTICS

_RANKS: weakref.WeakKeyDictionary[Graph, dict[tuple[str, str | None], NDArray[np.int64]]] = (
    weakref.WeakKeyDictionary())


def replay_names() -> tuple[str, ...]:
    """Every valid ``replay:<heuristic>`` name."""
    return tuple(PREFIX + h for h in REPLAYABLE)


def replay_heuristic(name: str) -> str | None:
    """The heuristic a ``replay:<heuristic>`` name follows; ``None`` for other names.

    Raises:
        UnknownNameError: ``name`` starts with ``replay:`` but names no :data:`REPLAYABLE`
            heuristic.
    """
    if not name.startswith(PREFIX):
        return None
    h = name[len(PREFIX):]
    if h not in REPLAYABLE:
        raise UnknownNameError(f"unknown replay fallback {name!r}; choose one of "
                               f"{list(replay_names())}." + did_you_mean(name, replay_names()))
    return h


def replay_fsm_supported(encoding: str, fallback: str) -> bool:
    """Whether an FSM with this encoding and a ``replay:<heuristic>`` fallback runs on the
    compiled core (:class:`ReplayFsmScheduler`, and as a rollout base)."""
    return encoding in cc.COMPILED_ENCODINGS and replay_heuristic(fallback) is not None


def rank_of(schedule: Schedule, num_nodes: int) -> NDArray[np.int64]:
    """Per node, the index of the batch of ``schedule`` that runs it."""
    rank = np.full(num_nodes, -1, np.int64)
    for i, b in enumerate(schedule.batches):
        rank[b.node_ids] = i
    return rank


def replay_ranks(graph: Graph, heuristic: str, backend: str | None = None
                 ) -> NDArray[np.int64]:
    """The ranks of ``graph``'s nodes in ``heuristic``'s schedule (cached per graph)."""
    per = _RANKS.setdefault(graph, {})
    out = per.get((heuristic, backend))
    if out is None:
        if heuristic not in REPLAYABLE:
            replay_heuristic(PREFIX + heuristic)  # raises with the valid names
        compiled = cc.resolve_backend(backend) == "compiled"
        if compiled and heuristic == "dynet_level_agenda":  # Python: ~15 s per 8k nodes
            arr = cc._arrays(graph)
            out = level_agenda_ranks(arr.op, arr.depth, arr.arity, arr.uptr, arr.uids,
                                     arr.batchable, arr.mean, arr.cplx)
        else:
            out = rank_of(make_heuristic(heuristic, backend)(graph), graph.num_nodes)
        per[(heuristic, backend)] = out
        out.setflags(write=False)
    return out


class ReplayPolicy:
    """The replay rule as a Python policy: the ready op type holding the ready node of
    smallest rank in ``heuristic``'s schedule (ties: the smallest op id).

    Args:
        heuristic: a name of :data:`REPLAYABLE`.
        backend: the backend that runs the heuristic for the ranks (default: the
            registry's, compiled where it can).
    """

    def __init__(self, heuristic: str, backend: str | None = None) -> None:
        if heuristic not in REPLAYABLE:
            replay_heuristic(PREFIX + heuristic)
        self.heuristic, self.backend = heuristic, backend
        self._graph: Graph | None = None
        self._neg: list[int] = []  # minus each node's rank (a list: the frontier's max memo)

    def choose(self, view: FrontierView) -> int:
        """Pick the ready type whose ready nodes include the earliest-ranked one (the
        smallest rank is the largest negated one, kept per type by the frontier as its
        ready list grows: a numpy ``min`` per ready type made each decision O(K) calls)."""
        if view.graph is not self._graph:
            self._graph = view.graph
            self._neg = (-replay_ranks(view.graph, self.heuristic, self.backend)).tolist()
        best, best_r = -1, None
        neg = self._neg
        for a in view.ready_ops:
            r = -view.max_over_ready(a, neg)
            if best_r is None or r < best_r:
                best, best_r = a, r
        return best


# ---------------------------------------------------------------------- the compiled path
def _run(graph: Graph, fallback: str, encoding: str | None, table: cc.FsmTable | None, *,
         record: bool) -> tuple:  # type: ignore[type-arg]
    heuristic = replay_heuristic(fallback)
    if heuristic is None:
        raise UnknownNameError(f"{fallback!r} is not a replay fallback; choose one of "
                               f"{list(replay_names())}.")
    rank = replay_ranks(graph, heuristic)
    enc_id, need_tw, need_h = (cc.COMPILED_ENCODINGS[encoding] if encoding is not None
                               else (cc.core.ENC_NONE, False, False))
    arr, height, tw_pred, tw_ptr, tw_ids = cc.core_graph(graph, need_tw, need_h)
    tab = table if table is not None else cc._NO_TABLE
    return run_replay(arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height,
                      tw_pred, tw_ptr, tw_ids, rank, enc_id, tab.hashes, tab.actions, record)


def replay_arrays(graph: Graph, fallback: str, *, encoding: str | None = None,
                  table: cc.FsmTable | None = None) -> tuple:  # type: ignore[type-arg]
    """The compiled FSM (``encoding``, ``table``; none: the replay alone) with the
    ``replay:<heuristic>`` ``fallback`` on ``graph``: ``(batch_op, batch_forced,
    batch_ptr, nodes, hits, misses)`` as :func:`~edbatch.schedule.compiled.compiled_arrays`."""
    return _run(graph, fallback, encoding, table, record=False)[:6]


def replay_trace(graph: Graph, fallback: str, encoding: str, table: cc.FsmTable) -> tuple:  # type: ignore[type-arg]
    """The same schedule with every decision's state key and action: ``(keys, key_len,
    actions, num_batches)`` as :func:`~edbatch.schedule._compiled_trace.trace_schedule`."""
    out = _run(graph, fallback, encoding, table, record=True)
    return out[6], out[7], out[8], len(out[0])


class ReplayFsmScheduler(cc.CompiledFsmScheduler):
    """An FSM with a ``replay:<heuristic>`` fallback on the compiled core (its run-time path,
    no lookahead); counters as :class:`~edbatch.schedule.compiled.CompiledFsmScheduler`."""

    def __call__(self, graph: Graph) -> Schedule:
        p = self.policy
        table = self.table()
        encoding = p.encoding if table.size else None  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        bop, bforced, bptr, nodes, hits, misses = replay_arrays(
            graph, p.fallback_name, encoding=encoding, table=table)  # type: ignore[attr-defined]
        s = Schedule(_batches_of(bop, bptr, nodes, bforced), self.name,
                     seconds=time.perf_counter() - t0)
        p.hits += int(hits)  # type: ignore[attr-defined]
        p.misses += int(misses) if encoding is not None else s.num_decisions  # type: ignore[attr-defined]
        return s


class ReplayScheduler:
    """The replay rule alone as a whole-graph scheduler (``make_scheduler("replay:<h>")``):
    compiled, or the Python twin under ``backend="python"``."""

    def __init__(self, name: str, backend: str | None = None) -> None:
        self.heuristic = replay_heuristic(name)
        if self.heuristic is None:
            raise UnknownNameError(f"{name!r} is not a replay rule; choose one of "
                                   f"{list(replay_names())}.")
        self.name, self.backend = name, cc.resolve_backend(backend)

    def __call__(self, graph: Graph) -> Schedule:
        t0 = time.perf_counter()
        if self.backend == "python":
            s = run_policy(graph, ReplayPolicy(self.heuristic, backend="python"))  # type: ignore[arg-type]
            return Schedule(s.batches, self.name, seconds=time.perf_counter() - t0)
        bop, bforced, bptr, nodes, _, _ = replay_arrays(graph, self.name)
        return Schedule(_batches_of(bop, bptr, nodes, bforced), self.name,
                        seconds=time.perf_counter() - t0)

    def __repr__(self) -> str:
        return f"ReplayScheduler({self.name})"
