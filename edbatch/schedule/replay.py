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

import weakref

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.graph.ir import Graph
from edbatch.schedule.frontier import FrontierView
from edbatch.schedule.schedule import Schedule

__all__ = ["PREFIX", "REPLAYABLE", "ReplayPolicy", "rank_of", "replay_heuristic",
           "replay_names", "replay_ranks"]

PREFIX = "replay:"

#: Heuristics a replay rule may follow (the registry's deterministic whole-graph heuristics,
#: :data:`edbatch.schedule.zoo.HEURISTICS`).
REPLAYABLE = ("depth", "dynet_agenda", "ed_batch_agenda", "dynet_level_agenda",
              "max_frontier", "typewise_greedy", "typewise_greedy_backward", "critical_path")

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


def rank_of(schedule: Schedule, num_nodes: int) -> NDArray[np.int64]:
    """Per node, the index of the batch of ``schedule`` that runs it."""
    rank = np.full(num_nodes, -1, np.int64)
    for i, b in enumerate(schedule.batches):
        rank[b.node_ids] = i
    return rank


def replay_ranks(graph: Graph, heuristic: str, backend: str | None = None
                 ) -> NDArray[np.int64]:
    """The ranks of ``graph``'s nodes in ``heuristic``'s schedule (cached per graph)."""
    from edbatch.schedule.zoo import make_scheduler  # zoo -> compiled -> this module

    per = _RANKS.setdefault(graph, {})
    out = per.get((heuristic, backend))
    if out is None:
        if heuristic not in REPLAYABLE:
            replay_heuristic(PREFIX + heuristic)  # raises with the valid names
        s = make_scheduler(heuristic, backend=backend)(graph)
        out = per[(heuristic, backend)] = rank_of(s, graph.num_nodes)
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
        self._rank: NDArray[np.int64] = np.zeros(0, np.int64)

    def choose(self, view: FrontierView) -> int:
        """Pick the ready type whose ready nodes include the earliest-ranked one."""
        if view.graph is not self._graph:
            self._graph = view.graph
            self._rank = replay_ranks(view.graph, self.heuristic, self.backend)
        best, best_r = -1, None
        for a in view.ready_ops:
            r = int(self._rank[view.ready_nodes(a)].min())
            if best_r is None or r < best_r:
                best, best_r = a, r
        return best
