"""State encodings of a frontier: hashable keys for tabular learners and a fixed-size vector.

ED-Batch's three encodings (docs/architecture.md 3.3), over the batchable op types with ready nodes:

* ``base``: the ready types in ascending id (the set of ready types);
* ``sorted``: the ready types by ready count, largest first (ties: smaller id first);
* ``max``: the ``base`` tuple followed by the type with the most ready nodes.

edbatch adds two richer keys (both need ``T(a)``, i.e. a type-wise frontier):

* ``complete``: ``base`` where each ready type also says whether its batch is already
  complete (``|F(a)| == T(a)``: no later node of the type can join it);
* ``hints``: ``base``, a separator ``-1``, then the critical-path type (the one holding the
  ready node with the longest remaining path) and the type with the best ``|F(a)|/T(a)``.
  The learner then decides, state by state, which signal to follow (or neither).
* ``expert``: one code per ready type (ascending id), ``6 * a + 2 * gap + complete``: ``gap``
  is how far the type's highest ready node (critical-path height) is below the highest ready
  node of all types (0, 1, or 2 for "2 or more"), ``complete`` whether ``|F(a)| == T(a)``.
  Graph-size free, so it generalises to unseen graphs; the key of the expert-iteration
  learner (:mod:`policies.expert`). :func:`expert_key` computes it from per-type arrays and
  :func:`expert_code` packs it into one ``int64`` (a compiled runtime's table key).
* ``rich``: ``16 * a + 4 * gap_class + 2 * complete + half``: the gap in four classes
  (0 | 1-2 | 3-9 | 10+) and ``half`` whether at least half of the type-wise frontier is
  ready (``2 * |F(a)| >= T(a)``) (:func:`rich_key`; compiled twin
  ``edbatch.schedule._compiled_keys``). Measured worse than ``expert`` on lattices.
* ``fill``: ``9 * a + 3 * gap_class + fill``: the gap in three classes (0 | 1-9 | 10+) and
  how full the type's batch is, 0 | 1 | 2 for less than half of ``T(a)`` ready | at least
  half | complete (:func:`fill_key`; compiled twin ``edbatch.schedule._compiled_keys``).
  It tells "the critical type's batch is still mostly empty, a type just below it is nearly
  full" apart from "the critical type's batch is full", which ``expert`` cannot.
* ``crit``: ``expert`` where the types on the critical path (gap 0) say how full their batch
  is instead of only whether it is complete: ``7 * a + feature``, ``feature`` the fill class
  (0 | 1 | 2, as in ``fill``) at gap 0, else ``1 + 2 * min(gap, 2) + complete``
  (:func:`crit_key`; compiled twin ``edbatch.schedule._compiled_keys``).
* ``tie``: ``expert`` where the types on the critical path also say whether critical path
  would pick them: ``8 * a + 2 * tier + complete``, ``tier`` 0 for critical path's pick, 1 for
  the other types at gap 0, 2 | 3 for a gap of 1 | 2+ (:func:`tie_key`). It splits only the
  states with several critical types, so a table can overrule the fallback's tie-break.
* ``cand``: only critical path's three best candidates, in its order (highest ready node,
  then ``|F(a)|/T(a)``, then smallest id): ``8 * a + 2 * min(gap, 3) + complete`` each
  (:func:`cand_key`). With dozens of ready types (module_net: 41 module types, about 17
  ready per decision) the full keys above almost never recur; this one recurs more often.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import UnknownNameError, did_you_mean
from edbatch.schedule import FrontierView
from edbatch.schedule.bounds import height_list
from envs._keys import (
    CAND_FEATURES,
    CRIT_FEATURES,
    FILL_FEATURES,
    RICH_FEATURES,
    TIE_FEATURES,
    cand_key,
    crit_key,
    fill_key,
    rich_key,
    tie_key,
)

__all__ = ["ENCODINGS", "EXPERT_MAX_TYPES", "crit_key", "NEEDS_TYPEWISE", "OBS_HIGH", "StateKey",
           "encode_observation", "encode_state", "expert_code", "expert_key", "expert_key_code",
           "fallback_action", "fill_key", "key_actions", "observation_size", "rich_key",
           "tie_key"]

StateKey = tuple[int, ...]

#: Upper bound of every observation entry (log-scaled counts are clipped to it).
OBS_HIGH = 4.0


def _base(view: FrontierView) -> StateKey:
    return tuple(np.flatnonzero(view.mask).tolist())


def _sorted(view: FrontierView) -> StateKey:
    ready = np.flatnonzero(view.mask)
    order = np.lexsort((ready, -view.ready_count[ready]))
    return tuple(ready[order].tolist())


def _max(view: FrontierView) -> StateKey:
    ready = np.flatnonzero(view.mask)
    top = int(ready[np.argmax(view.ready_count[ready])])
    return (*ready.tolist(), top)


def _complete(view: FrontierView) -> StateKey:
    ready = np.flatnonzero(view.mask)
    if view.typewise_count is None:
        raise UnknownNameError("encoding 'complete' needs T(a); create the frontier with "
                               "typewise=True")
    full = view.ready_count[ready] >= view.typewise_count[ready]
    return tuple((2 * ready + full).tolist())


def _hints(view: FrontierView) -> StateKey:
    ready = view.ready_ops
    if view.typewise_count is None:
        raise UnknownNameError("encoding 'hints' needs T(a); create the frontier with "
                               "typewise=True")
    h = height_list(view.graph)
    ratio = {a: view.count(a) / max(view.typewise(a), 1) for a in ready}
    critical = max(ready, key=lambda a: (view.max_over_ready(a, h), ratio[a], -a))
    complete = max(ready, key=lambda a: (ratio[a], -a))
    return (*ready, -1, critical, complete)


#: Features per ready type in the ``expert`` key (``6 * a + feature``) and the largest
#: vocabulary whose key fits one int64 code (``7 ** 22 < 2 ** 63``).
EXPERT_FEATURES = 6
EXPERT_MAX_TYPES = 22


def expert_key(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
               max_height: NDArray[np.int64]) -> StateKey:
    """The ``expert`` state key from per-type arrays (a pure function).

    Args:
        ready_count: ``|F(a)|`` per op type (0: not ready; unbatchable types must be 0).
        typewise_count: ``T(a)`` per op type.
        max_height: per op type, the largest critical-path height among its ready nodes
            (ignored where ``ready_count`` is 0).

    Returns:
        ``(6 * a + 2 * gap + complete, ...)`` over ready types ``a`` in ascending order.
    """
    ready = np.flatnonzero(np.asarray(ready_count) > 0)
    if not len(ready):
        return ()
    h = np.asarray(max_height)[ready]
    gap = np.minimum(h.max() - h, 2)
    full = np.asarray(ready_count)[ready] >= np.asarray(typewise_count)[ready]
    return tuple((EXPERT_FEATURES * ready + 2 * gap + full).tolist())


def expert_key_code(key: StateKey) -> int:
    """Pack an ``expert`` key into one int: digit ``a`` (base 7) is ``1 + feature`` of
    ready type ``a`` and 0 if ``a`` is not ready (a bijection for up to
    :data:`EXPERT_MAX_TYPES` op types)."""
    code = 0
    for x in key:
        a, feat = divmod(int(x), EXPERT_FEATURES)
        code += (1 + feat) * 7 ** a
    return code


def _expert_code_py(ready_count: NDArray[np.int64], typewise_count: NDArray[np.int64],
                    max_height: NDArray[np.int64]) -> int:
    """Pure-Python reference of :func:`expert_code` (what numba compiles)."""
    k = len(ready_count)
    top = -1
    for a in range(k):
        if ready_count[a] > 0 and max_height[a] > top:
            top = max_height[a]
    code = 0
    power = 1
    for a in range(k):
        if ready_count[a] > 0:
            gap = min(top - max_height[a], 2)
            full = 1 if ready_count[a] >= typewise_count[a] else 0
            code += (1 + 2 * gap + full) * power
        power *= 7
    return code


try:  # numba is optional: the compiled twin for the runtime, else the Python reference
    import numba

    expert_code = numba.njit(cache=False, nogil=True)(_expert_code_py)
except ImportError:  # pragma: no cover - numba is a dependency, but keep the key usable
    expert_code = _expert_code_py
expert_code.__doc__ = """The ``expert`` key of per-type arrays packed into one int64, compiled
with numba (``expert_key_code(expert_key(...)) == expert_code(...)``; int64 arrays, at most
:data:`EXPERT_MAX_TYPES` op types)."""


def _type_arrays(view: FrontierView, name: str
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """(ready count, T(a), max ready height) per op type; unready types count 0."""
    if view.typewise_count is None:
        raise UnknownNameError(f"encoding {name!r} needs T(a); create the frontier with "
                               "typewise=True")
    h = height_list(view.graph)
    ready = view.ready_ops
    heights = np.zeros(len(view.mask), dtype=np.int64)
    for a in ready:
        heights[a] = view.max_over_ready(a, h)
    counts = np.zeros(len(view.mask), dtype=np.int64)
    counts[ready] = view.ready_count[ready]
    return counts, view.typewise_count, heights


def _expert(view: FrontierView) -> StateKey:
    return expert_key(*_type_arrays(view, "expert"))


def _rich(view: FrontierView) -> StateKey:
    return rich_key(*_type_arrays(view, "rich"))


def _fill(view: FrontierView) -> StateKey:
    return fill_key(*_type_arrays(view, "fill"))


def _crit(view: FrontierView) -> StateKey:
    return crit_key(*_type_arrays(view, "crit"))


def _tie(view: FrontierView) -> StateKey:
    return tie_key(*_type_arrays(view, "tie"))


def _cand(view: FrontierView) -> StateKey:
    return cand_key(*_type_arrays(view, "cand"))


#: name -> encoder. Every key is a tuple of small ints (hashable, JSON-friendly).
ENCODINGS: dict[str, Callable[[FrontierView], StateKey]] = {
    "base": _base,
    "sorted": _sorted,
    "max": _max,
    "complete": _complete,
    "hints": _hints,
    "expert": _expert,
    "rich": _rich,
    "fill": _fill,
    "crit": _crit,
    "tie": _tie,
    "cand": _cand,
}

#: Encodings whose keys need the type-wise frontier count T(a).
NEEDS_TYPEWISE = frozenset({"complete", "hints", "expert", "rich", "fill", "crit", "tie",
                            "cand"})


def key_actions(key: StateKey, encoding: str) -> list[int]:
    """The op ids named by a key's entries, in key order (repeats kept, separators dropped).

    Exploration draws uniformly from this list, as ED-Batch draws from the state vector.
    """
    if encoding == "complete":
        return [x // 2 for x in key]
    if encoding == "hints":
        return [x for x in key if x >= 0]
    if encoding == "expert":
        return [x // EXPERT_FEATURES for x in key]
    if encoding == "rich":
        return [x // RICH_FEATURES for x in key]
    if encoding == "fill":
        return [x // FILL_FEATURES for x in key]
    if encoding == "crit":
        return [x // CRIT_FEATURES for x in key]
    if encoding == "tie":
        return [x // TIE_FEATURES for x in key]
    if encoding == "cand":
        return [x // CAND_FEATURES for x in key]
    return list(key)


def encode_state(view: FrontierView, encoding: str) -> StateKey:
    """The hashable state key of ``view`` under ``encoding``."""
    try:
        fn = ENCODINGS[encoding]
    except KeyError:
        raise UnknownNameError(f"unknown encoding {encoding!r}; available: {list(ENCODINGS)}."
                               + did_you_mean(encoding, ENCODINGS)) from None
    return fn(view)


def fallback_action(key: StateKey, encoding: str) -> int:
    """ED-Batch's rule for unseen states: the last element of the state vector
    (docs/architecture.md 3.7)."""
    return key_actions(key, encoding)[-1]


def observation_size(num_ops: int) -> int:
    """Length of :func:`encode_observation`'s vector for a vocabulary of ``num_ops``."""
    return 7 * num_ops


def encode_observation(view: FrontierView) -> NDArray[np.float32]:
    """Fixed-size float vector for deep RL: 7 blocks of one entry per op type.

    Blocks: mask; log1p(ready count)/8; ready/T ratio; log1p(T)/8; remaining fraction of the
    type; mean depth of the type's remaining nodes / (max depth + 1); one-hot of the last op.
    """
    k = len(view.mask)
    graph = view.graph
    total = np.maximum(graph.type_counts, 1)
    tw = view.typewise_count if view.typewise_count is not None else view.ready_count
    mean_depth = view.remaining_depth_sum / np.maximum(view.remaining_count, 1)
    last = np.zeros(k, dtype=np.float64)
    if view.last_op >= 0:
        last[view.last_op] = 1.0
    blocks = (
        view.mask.astype(np.float64),
        np.log1p(view.ready_count) / 8.0,
        np.where(view.mask > 0, view.ready_count / np.maximum(tw, 1), 0.0),
        np.log1p(tw) / 8.0,
        view.remaining_count / total,
        mean_depth / (float(graph.depth.max(initial=0)) + 1.0),
        last,
    )
    return np.minimum(np.concatenate(blocks), OBS_HIGH).astype(np.float32)
