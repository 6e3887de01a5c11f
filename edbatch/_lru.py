"""A least-recently-used map that stops looking up when nothing hits: after
:data:`COLD_AFTER` misses in a row only every :data:`PROBE_EVERY`-th lookup is made (and
its key computed), so a cache whose keys never repeat (reshuffled mini-batches, MoE routing)
costs no hashing; a hit turns lookups back on."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["COLD_AFTER", "PROBE_EVERY", "Lru"]

V = TypeVar("V")


#: Misses in a row after which :meth:`Lru.cold` skips most lookups, and every how many
#: skippable lookups it still makes one (a pattern that starts repeating turns them back on).
COLD_AFTER, PROBE_EVERY = 32, 16


class Lru(Generic[V]):
    """Values by key, least recently used first out past ``size``, hits and misses counted
    (:mod:`edbatch.api._rounds`' round plans, :class:`~edbatch.api._segments.SegmentCache`'s
    entries, :func:`~edbatch.memory.plan_memory`'s memo)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: OrderedDict[Hashable, V] = OrderedDict()
        self.hits = self.misses = 0
        self.streak = self.skipped = 0  # misses in a row; lookups skipped by :meth:`cold`

    def cold(self) -> bool:
        """Whether to skip a lookup (and the key it needs) as a miss: after
        :data:`COLD_AFTER` misses in a row (a MoE layer's rounds, reshuffled mini-batches:
        structures that never repeat), all but every :data:`PROBE_EVERY`-th; a hit ends it."""
        if self.streak < COLD_AFTER:
            return False
        self.skipped += 1
        if self.skipped % PROBE_EVERY == 0:
            return False
        self.misses += 1
        return True

    def get(self, key: Hashable) -> V | None:
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
            self.streak += 1
            return None
        self.hit()
        self.entries.move_to_end(key)
        return value

    def hit(self) -> None:
        """Count a hit (also one found without :meth:`get`): lookups are warm again."""
        self.hits += 1
        self.streak = 0

    def put(self, key: Hashable, value: V) -> None:
        self.entries[key] = value
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
