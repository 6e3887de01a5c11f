"""Schedule reuse for identical structures: :class:`MemoScheduler`.

A schedule depends only on a graph's structure (op types and operands; policies never read
``attrs``), so graphs of equal :meth:`~edbatch.graph.Graph.structure_key` (the same
mini-batch in another epoch, sentences of the same length in a chain model) can share one.
Together with :func:`~edbatch.memory.plan_memory`'s plan memo this makes a repeated
structure cost a hash instead of a scheduling and planning run.

Example:
    >>> from edbatch.workloads import make_workload
    >>> from edbatch.schedule import make_scheduler
    >>> wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=4)
    >>> memo = MemoScheduler(make_scheduler("typewise_greedy"))
    >>> a = memo(wl.build_graph(wl.load("dev")[:2]))
    >>> b = memo(wl.build_graph(wl.load("dev")[:2]))  # a new graph object, same structure
    >>> a is b, memo.hits, memo.misses
    (True, 1, 1)
"""

from __future__ import annotations

from collections import OrderedDict

from edbatch.graph import Graph
from edbatch.schedule.policy import Scheduler
from edbatch.schedule.schedule import Schedule

__all__ = ["MemoScheduler"]


class MemoScheduler:
    """Wrap a scheduler; graphs of an already seen structure get the stored schedule.

    Args:
        scheduler: the wrapped scheduler.
        size: schedules kept (least recently used dropped first).
    """

    def __init__(self, scheduler: Scheduler, size: int = 256) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.scheduler, self.size = scheduler, size
        self.hits = self.misses = 0
        self._memo: OrderedDict[bytes, Schedule] = OrderedDict()

    def __call__(self, graph: Graph) -> Schedule:
        """The schedule of ``graph``'s structure (computed on the first sight)."""
        key = graph.structure_key()
        schedule = self._memo.get(key)
        if schedule is not None:
            self.hits += 1
            self._memo.move_to_end(key)
            return schedule
        self.misses += 1
        schedule = self._memo[key] = self.scheduler(graph)
        while len(self._memo) > self.size:
            self._memo.popitem(last=False)
        return schedule

    def __repr__(self) -> str:
        return (f"MemoScheduler({self.scheduler!r}, size={self.size}, hits={self.hits}, "
                f"misses={self.misses})")
