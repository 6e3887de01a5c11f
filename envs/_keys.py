"""The finer FSM state keys of the expert-iteration learner (``rich``, ``fill``, ``crit``,
``tie``, ``cand``): pure functions of per-type arrays, described in :mod:`envs.encoding`, which
re-exports them; compiled twins in ``edbatch.schedule._compiled_keys``."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["CAND_FEATURES", "CAND_TOP", "CRIT_FEATURES", "FILL_FEATURES", "RICH_FEATURES",
           "TIE_FEATURES", "cand_key", "crit_key", "fill_key", "rich_key", "tie_key"]

StateKey = tuple[int, ...]

#: Features per ready type in the ``rich`` key (``16 * a + feature``).
RICH_FEATURES = 16


def rich_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
             max_height: NDArray[np.int64]) -> StateKey:
    """The ``rich`` state key from per-type arrays (arguments as :func:`expert_key`).

    Returns:
        ``(16 * a + 4 * gap_class + 2 * complete + half, ...)`` over ready types ``a``
        ascending: ``gap_class`` 0 | 1 | 2 | 3 for a gap (as in :func:`expert_key`, uncapped)
        of 0 | 1-2 | 3-9 | 10+, ``complete`` as there, ``half`` is ``2 * |F(a)| >= T(a)``.
    """
    counts = np.asarray(ready_count)
    ready = np.flatnonzero(counts > 0)
    if not len(ready):
        return ()
    h = np.asarray(max_height)[ready]
    gap = np.searchsorted(np.array([0, 2, 9]), h.max() - h, side="left")
    c, t = counts[ready], np.asarray(typewise_count)[ready]
    return tuple((RICH_FEATURES * ready + 4 * gap + 2 * (c >= t) + (2 * c >= t)).tolist())


#: Features per ready type in the ``fill`` key (``9 * a + feature``).
FILL_FEATURES = 9


def fill_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
             max_height: NDArray[np.int64]) -> StateKey:
    """The ``fill`` state key from per-type arrays (arguments as :func:`expert_key`).

    Returns:
        ``(9 * a + 3 * gap_class + fill, ...)`` over ready types ``a`` ascending:
        ``gap_class`` 0 | 1 | 2 for a gap (as in :func:`expert_key`, uncapped) of 0 | 1-9 |
        10+; ``fill`` 0 | 1 | 2 for ``2 * |F(a)| < T(a)`` | ``|F(a)| < T(a) <= 2 * |F(a)|``
        | ``|F(a)| >= T(a)``.
    """
    counts = np.asarray(ready_count)
    ready = np.flatnonzero(counts > 0)
    if not len(ready):
        return ()
    h = np.asarray(max_height)[ready]
    gap = np.searchsorted(np.array([0, 9]), h.max() - h, side="left")
    c, t = counts[ready], np.asarray(typewise_count)[ready]
    fill = np.where(c >= t, 2, np.where(2 * c >= t, 1, 0))
    return tuple((FILL_FEATURES * ready + 3 * gap + fill).tolist())


#: Features per ready type in the ``crit`` key (``7 * a + feature``).
CRIT_FEATURES = 7


def crit_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
             max_height: NDArray[np.int64]) -> StateKey:
    """The ``crit`` state key from per-type arrays (arguments as :func:`expert_key`).

    Returns:
        ``(7 * a + feature, ...)`` over ready types ``a`` ascending: at gap 0 the fill
        class (as :func:`fill_key`), else ``1 + 2 * min(gap, 2) + complete``.
    """
    counts = np.asarray(ready_count)
    ready = np.flatnonzero(counts > 0)
    if not len(ready):
        return ()
    h = np.asarray(max_height)[ready]
    gap = np.minimum(h.max() - h, 2)
    c, t = counts[ready], np.asarray(typewise_count)[ready]
    full = (c >= t).astype(np.int64)
    fill = np.where(c >= t, 2, np.where(2 * c >= t, 1, 0))
    feat = np.where(gap == 0, fill, 1 + 2 * gap + full)
    return tuple((CRIT_FEATURES * ready + feat).tolist())


#: Features per ready type in the ``tie`` key (``8 * a + feature``).
TIE_FEATURES = 8


def tie_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
            max_height: NDArray[np.int64]) -> StateKey:
    """The ``tie`` state key from per-type arrays (arguments as :func:`expert_key`).

    Returns:
        ``(8 * a + 2 * tier + complete, ...)`` over ready types ``a`` ascending: ``tier`` 0
        for critical path's pick (highest ready height, then the largest
        ``|F(a)| / max(T(a), 1)``, then the smallest id), 1 for the other types at gap 0,
        ``1 + min(gap, 2)`` below; ``complete`` as in :func:`expert_key`.
    """
    counts, tw = np.asarray(ready_count), np.asarray(typewise_count)
    ready = np.flatnonzero(counts > 0)
    if not len(ready):
        return ()
    h = np.asarray(max_height)
    pick, best = -1, (-1, -1.0)
    for a in ready.tolist():  # the compiled rule's order and strict comparisons
        cand = (int(h[a]), float(counts[a]) / max(int(tw[a]), 1))
        if cand[0] > best[0] or (cand[0] == best[0] and cand[1] > best[1]):
            pick, best = a, cand
    gap = np.minimum(h[ready].max() - h[ready], 2)
    tier = np.where(gap == 0, (ready != pick).astype(np.int64), gap + 1)
    full = counts[ready] >= tw[ready]
    return tuple((TIE_FEATURES * ready + 2 * tier + full).tolist())


#: Features per candidate in the ``cand`` key (``8 * a + feature``) and candidates kept.
CAND_FEATURES = 8
CAND_TOP = 3


def cand_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
             max_height: NDArray[np.int64]) -> StateKey:
    """The ``cand`` state key from per-type arrays (arguments as :func:`expert_key`).

    Returns:
        ``(8 * a + 2 * min(gap, 3) + complete, ...)`` over critical path's best
        :data:`CAND_TOP` ready types, best first.
    """
    counts, tw, h = np.asarray(ready_count), np.asarray(typewise_count), np.asarray(max_height)
    ready = np.flatnonzero(counts > 0).tolist()
    if not ready:
        return ()
    ratio = {a: float(counts[a]) / max(int(tw[a]), 1) for a in ready}
    order = sorted(ready, key=lambda a: (-int(h[a]), -ratio[a], a))[:CAND_TOP]
    top = int(h[order[0]])
    return tuple(CAND_FEATURES * a + 2 * min(top - int(h[a]), 3) + int(counts[a] >= tw[a])
                 for a in order)
