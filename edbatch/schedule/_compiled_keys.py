"""Compiled FSM state keys of the expert-iteration learner (twins of ``envs.encoding``).

Both follow the signature the core's :func:`~edbatch.schedule._compiled._encode` dispatches
on, ``(k, rlen, tw, maxh, rem, remd, batchable, out) -> length``: they write one int per
ready batchable op type ``a`` (ascending) into ``out`` and return how many they wrote.

* ``expert``: ``6 * a + 2 * gap + complete`` (``envs.encoding.expert_key``);
* ``tie``: ``8 * a + 2 * tier + complete`` (``envs.encoding.tie_key``): ``tier`` 0 for the
  type critical path picks, 1 for the other types on the critical path (gap 0), 2 | 3 for a
  gap of 1 | 2 or more; ``expert`` plus which of the tied critical types the fallback takes;
* ``rich``: ``16 * a + 4 * gap_class + 2 * complete + half`` (``envs.encoding.rich_key``),
  where ``gap_class`` is 0 | 1 | 2 | 3 for a gap of 0 | 1-2 | 3-9 | 10 or more and ``half``
  is ``2 * |F(a)| >= T(a)``.

``gap`` is ``top - maxh[a]`` (capped at 2 in ``expert``), ``top`` the highest ready
critical-path height of all types; ``complete`` is ``|F(a)| >= T(a)``. Tests assert the
Python twins give the same tuples on random arrays and on frontiers (FSM tables are looked
up by the tuple's hash).
"""

from __future__ import annotations

from numba import njit

__all__ = ["CRIT_FEATURES", "EXPERT_FEATURES", "FILL_FEATURES", "RICH_FEATURES", "TIE_FEATURES",
           "key_crit", "key_expert", "key_fill", "key_rich", "key_tie"]

EXPERT_FEATURES = 6
RICH_FEATURES = 16
FILL_FEATURES = 9
CRIT_FEATURES = 7
TIE_FEATURES = 8


@njit(cache=True, inline="always")
def _ratio(rlen, tw, a):  # type: ignore[no-untyped-def]
    """``|F(a)| / max(T(a), 1)``: how full type ``a``'s batch is."""
    t = tw[a] if tw[a] > 1 else 1
    return rlen[a] / t


@njit(cache=True)
def _critical(k, rlen, tw, maxh, batchable):  # type: ignore[no-untyped-def]
    """Critical path's choice (the core's ``RULE_CRITICAL_PATH``, and the ``tie`` key's
    pick): highest ready height, then the largest :func:`_ratio`, then the smallest id."""
    best, best_top, best_ratio = -1, -1, -1.0
    for a in range(k):
        if rlen[a] and batchable[a]:
            top, ratio = maxh[a], _ratio(rlen, tw, a)
            if top > best_top or (top == best_top and ratio > best_ratio):
                best, best_top, best_ratio = a, top, ratio
    return best


@njit(cache=True)
def _top(k, rlen, maxh, batchable):  # type: ignore[no-untyped-def]
    top = -1
    for a in range(k):
        if rlen[a] and batchable[a] and maxh[a] > top:
            top = maxh[a]
    return top


@njit(cache=True)
def key_expert(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``6 * a + 2 * min(top - maxh[a], 2) + (|F(a)| >= T(a))`` per ready type."""
    top = _top(k, rlen, maxh, batchable)
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            gap = min(top - maxh[a], 2)
            out[n] = EXPERT_FEATURES * a + 2 * gap + (1 if rlen[a] >= tw[a] else 0)
            n += 1
    return n


@njit(cache=True)
def _gap_class(gap):  # type: ignore[no-untyped-def]
    """0 on the critical path, 1 for 1-2 below it, 2 for 3-9, 3 for 10 or more."""
    if gap <= 0:
        return 0
    if gap <= 2:
        return 1
    return 2 if gap <= 9 else 3


@njit(cache=True)
def key_rich(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``16 * a + 4 * gap_class + 2 * complete + half`` per ready type."""
    top = _top(k, rlen, maxh, batchable)
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            full = 1 if rlen[a] >= tw[a] else 0
            half = 1 if 2 * rlen[a] >= tw[a] else 0
            out[n] = RICH_FEATURES * a + 4 * _gap_class(top - maxh[a]) + 2 * full + half
            n += 1
    return n


@njit(cache=True)
def _fill_gap_class(gap):  # type: ignore[no-untyped-def]
    """0 on the critical path, 1 for 1-9 below it, 2 for 10 or more."""
    if gap <= 0:
        return 0
    return 1 if gap <= 9 else 2


@njit(cache=True)
def key_fill(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``9 * a + 3 * gap_class + fill`` per ready type: ``fill`` 0 | 1 | 2 for less than
    half of ``T(a)`` ready | at least half | complete."""
    top = _top(k, rlen, maxh, batchable)
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            if rlen[a] >= tw[a]:
                fill = 2
            elif 2 * rlen[a] >= tw[a]:
                fill = 1
            else:
                fill = 0
            out[n] = FILL_FEATURES * a + 3 * _fill_gap_class(top - maxh[a]) + fill
            n += 1
    return n


@njit(cache=True)
def key_crit(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``7 * a + feature`` per ready type: on the critical path (gap 0) ``feature`` is the
    fill class 0 | 1 | 2 (less than half of ``T(a)`` ready | at least half | complete),
    below it ``3 + 2 * (min(gap, 2) - 1) + complete`` (as ``expert``)."""
    top = _top(k, rlen, maxh, batchable)
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            full = 1 if rlen[a] >= tw[a] else 0
            gap = min(top - maxh[a], 2)
            if gap == 0:
                feat = 2 if full else (1 if 2 * rlen[a] >= tw[a] else 0)
            else:
                feat = 1 + 2 * gap + full
            out[n] = CRIT_FEATURES * a + feat
            n += 1
    return n


@njit(cache=True)
def key_tie(k, rlen, tw, maxh, rem, remd, batchable, out):  # type: ignore[no-untyped-def]
    """``8 * a + 2 * tier + complete`` per ready type: ``tier`` 0 for critical path's pick,
    1 for the other types at gap 0, 2 + (min(gap, 2) - 1) below."""
    top = _top(k, rlen, maxh, batchable)
    pick = _critical(k, rlen, tw, maxh, batchable)
    n = 0
    for a in range(k):
        if rlen[a] and batchable[a]:
            gap = min(top - maxh[a], 2)
            tier = (0 if a == pick else 1) if gap == 0 else gap + 1
            out[n] = TIE_FEATURES * a + 2 * tier + (1 if rlen[a] >= tw[a] else 0)
            n += 1
    return n
