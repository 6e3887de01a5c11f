"""Per-op-type features of a frontier for the equivariant frontier network.

One row per *ready* batchable op type (ascending op id), :data:`NUM_FEATURES` columns, all
graph-size free (log-scaled counts, ratios, capped gaps), so one network reads any workload
and any number of op types. Nothing in a row names its op type: the network scores a type
from what the type looks like now, not from which type it is (hence equivariant to the order
of types). The critical-path quantities reuse :func:`edbatch.schedule.bounds.height_list`
(a node's longest remaining path) and the frontier's ``max_over_ready`` cache, as the
``expert`` key of :mod:`envs.encoding` does.

Columns (``FEATURES``): ready count and ``T(a)`` (log1p / 4), fill ``|F(a)|/T(a)``, complete
(``|F(a)| >= T(a)``), one-hot critical-path gap 0 | 1 | 2 and the gap itself (/16, capped),
the type's highest ready height relative to the graph's, whether critical path would pick
the type, whether it was the last decision and how often among the last three, the share
of the type's nodes still unexecuted, the nodes left after this batch (log1p / 8), its
share of the ready nodes, the number of ready types (/8), the mean height gap of its ready
nodes below its highest one (/16, capped) and the share of its ready nodes at the
frontier's top height.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import FrontierView
from edbatch.schedule.bounds import height_list

__all__ = ["FEATURES", "HISTORY", "NUM_FEATURES", "FeatureTracker"]

FEATURES = ("log_ready", "log_typewise", "fill", "complete", "gap0", "gap1", "gap2",
            "gap", "rel_height", "cp_pick", "last", "recent", "remaining_share", "log_after",
            "ready_share", "ready_types", "mean_gap", "top_share")
NUM_FEATURES = len(FEATURES)
#: Decisions remembered for the ``recent`` column.
HISTORY = 3


class FeatureTracker:
    """Builds the feature rows of successive frontier views of one graph at a time.

    Stateful only through the decisions it is told (:meth:`record`) for the ``recent``
    column; a new graph, a new episode of the same graph (fewer nodes executed than at the
    previous call) or :meth:`reset` clears that history.
    """

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._h: list[int] = []
        self._h_np: NDArray[np.int64] = np.zeros(0, np.int64)
        self._top_h = 1.0
        self._total: list[int] = []
        self._recent: deque[int] = deque(maxlen=HISTORY)
        self._executed = -1

    def reset(self) -> None:
        """Forget the decision history (a new episode of the same graph)."""
        self._recent.clear()

    def _prepare(self, graph: Graph) -> None:
        self._graph = graph
        self._h = height_list(graph)
        self._h_np = np.asarray(self._h, dtype=np.int64)
        self._top_h = float(max(self._h, default=0)) + 1.0
        self._total = graph.type_counts.tolist()
        self._recent.clear()

    def record(self, op_id: int) -> None:
        """Remember a decision (for the ``recent`` column)."""
        self._recent.append(int(op_id))

    def features(self, view: FrontierView) -> tuple[list[int], NDArray[np.float32]]:
        """``(ready op ids ascending, float32[len(ready), NUM_FEATURES])`` of ``view``.

        Raises:
            UnknownNameError: the frontier does not track ``T(a)`` (create it with
                ``typewise=True``; policies set ``needs_typewise``).
        """
        if view.graph is not self._graph:
            self._prepare(view.graph)
        elif view.num_executed <= self._executed:  # the graph again: a new episode
            self._recent.clear()
        self._executed = view.num_executed
        if view.typewise_count is None:
            raise UnknownNameError("the frontier network needs T(a); create the Frontier with "
                                   "typewise=True")
        ready = view.ready_ops
        r = len(ready)
        out = np.zeros((r, NUM_FEATURES), dtype=np.float32)
        if not r:
            return ready, out
        h = self._h
        tops = [view.max_over_ready(a, h) for a in ready]
        top = max(tops)
        counts = [view.count(a) for a in ready]
        tws = [view.typewise(a) for a in ready]
        n_ready = float(sum(counts))
        # critical path's pick: highest ready node, then the best |F|/T, then the smallest id
        best_key, pick = (-1, -1.0), -1
        for i in range(r):
            key = (tops[i], counts[i] / max(tws[i], 1))
            if key > best_key:
                best_key, pick = key, i
        last = view.last_op
        recent = list(self._recent)
        for i, a in enumerate(ready):
            c, t = counts[i], tws[i]
            gap = top - tops[i]
            rem, _ = view.remaining(a)
            nodes = view.ready_nodes(a)
            hv = self._h_np[nodes]
            row = out[i]
            row[0] = math.log1p(c) / 4.0
            row[1] = math.log1p(t) / 4.0
            row[2] = min(c / max(t, 1), 1.0)
            row[3] = 1.0 if c >= t else 0.0
            if gap <= 2:
                row[4 + gap] = 1.0
            row[7] = min(gap, 16) / 16.0
            row[8] = tops[i] / self._top_h
            row[9] = 1.0 if i == pick else 0.0
            row[10] = 1.0 if a == last else 0.0
            row[11] = recent.count(a) / HISTORY
            row[12] = rem / max(self._total[a], 1)
            row[13] = math.log1p(max(rem - c, 0)) / 8.0
            row[14] = c / n_ready
            row[15] = r / 8.0
            row[16] = min(float(tops[i] - hv.mean()), 16.0) / 16.0
            row[17] = float(np.count_nonzero(hv == top)) / c
        return ready, out
