"""The afterstate priority policy: the priority score plus a learned one-step afterstate value.

Each ready op type ``a`` is scored ``w . f_a + u . g_a``: ``f_a`` the priority policy's row
(:mod:`policies.priority`), ``g_a`` features of the state running ``a`` leads to, read off
the remaining lower bound (:mod:`edbatch.schedule._compiled_afterstate`: is ``a`` *tight*,
does the next decision still have a tight type, ...). It is a **one-step lookahead** on the
bound: each ready type's batch is applied to the frontier (the nodes it releases), no
rollout, no second decision. ``u = 0`` is the priority policy; critical path's weights
with ``u = 0`` are critical path (the trainer's start, :mod:`policies.afterstate_train`).

Run time: one numba call per schedule (:func:`run_afterstate`). :class:`AfterstateTwin` is
the Python oracle over :class:`~edbatch.schedule.FrontierView`.

Artifact: JSON ``{"format": "edbatch.afterstate", "version": 1, "features": [...],
"after_features": [...], "weights": [...], "fallback": "critical_path", "learned": bool,
"metadata": {...}}`` (``weights``: the priority features' then the afterstate features').
A bad file raises :class:`~edbatch.errors.PolicyFileError` naming it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import GraphError, PolicyFileError
from edbatch.graph import Graph
from edbatch.schedule import FrontierView, Schedule
from edbatch.schedule._compiled_afterstate import (
    AFTER_FEATURES,
    BASE_AFTER,
    MAX_TWO_STEP_TYPES,
    run_afterstate,
    run_afterstate_counts,
)
from edbatch.schedule.bounds import type_chain_lengths
from edbatch.schedule.compiled import core_schedule
from policies._header import check_header, metadata_of, numbers, write_json
from policies.priority import (
    FEATURES,
    PriorityTwin,
    WeightStats,
    critical_path_weights,
    graph_inputs,
)

__all__ = ["AFTER_FEATURES", "EXTRA_FEATURES", "FORMAT", "VERSION", "AfterstatePolicy",
           "AfterstateTwin", "MAX_TYPES", "after_mask", "afterstate_inputs", "afterstate_start",
           "population_afterstate"]

#: Most op types (the graph's vocabulary) the afterstate loop takes: its release counts are
#: ``k^3`` (400 types: 0.5 GB per run; the two-step columns stop at ``MAX_TWO_STEP_TYPES``).
MAX_TYPES = 400

FORMAT = "edbatch.afterstate"
VERSION = 1
NUM_WEIGHTS = len(FEATURES) + len(AFTER_FEATURES)
#: The afterstate columns after the first six (two-step, margins): 0 weights unless chosen.
EXTRA_FEATURES = AFTER_FEATURES[BASE_AFTER:]


def after_mask(extra: Sequence[str] = ()) -> NDArray[np.bool_]:
    """Which afterstate columns a trainer sets: the first six and the ``extra`` ones
    (names of :data:`EXTRA_FEATURES`, or ``["all"]``); a bad name raises ``ValueError``."""
    names = list(EXTRA_FEATURES) if list(extra) == ["all"] else list(extra)
    bad = [x for x in names if x not in EXTRA_FEATURES]
    if bad:
        raise ValueError(f"unknown extra afterstate features {bad}; choose from "
                         f"{list(EXTRA_FEATURES)} or 'all'")
    return np.array([i < BASE_AFTER or f in names for i, f in enumerate(AFTER_FEATURES)])


def afterstate_start() -> NDArray[np.float64]:
    """Critical path's weights, afterstate weights 0: the policy that is critical path."""
    return np.concatenate([critical_path_weights(0), np.zeros(len(AFTER_FEATURES))])


def afterstate_inputs(graph: Graph) -> tuple:  # type: ignore[type-arg]
    """:func:`~policies.priority.graph_inputs` plus the type chain lengths ``down``.

    Raises:
        GraphError: the vocabulary has more than :data:`MAX_TYPES` op types.
    """
    k = len(graph.vocab)
    if k > MAX_TYPES:
        raise GraphError(
            f"the afterstate policy keeps k^3 release counts per run: {k} op types need "
            f"{8 * k ** 3 / 2 ** 30:.1f} GiB; it runs on vocabularies of at most {MAX_TYPES} "
            f"op types. Fix: use the priority policy (trainer=priority), which has no such "
            f"limit")
    down = np.ascontiguousarray(type_chain_lengths(graph), dtype=np.int64)
    return (*graph_inputs(graph), down)


def population_afterstate(inputs: Sequence[tuple], ws: NDArray[np.float64]  # type: ignore[type-arg]
                          ) -> NDArray[np.int64]:
    """``int64[len(ws), len(inputs)]``: batches of each graph under each weight vector."""
    ws = np.ascontiguousarray(ws, dtype=np.float64)
    return np.stack([run_afterstate_counts(*g, ws)  # type: ignore[call-arg]
                     for g in inputs], axis=1)


def _check_weights(w: Any, where: str) -> NDArray[np.float64]:
    arr = numbers(w)
    if arr.shape != (NUM_WEIGHTS,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: need {NUM_WEIGHTS} finite weights ({len(FEATURES)} "
                         f"priority features, then {list(AFTER_FEATURES)}), got shape "
                         f"{arr.shape}")
    return np.ascontiguousarray(arr)


class AfterstatePolicy(WeightStats):
    """Weights as a batching policy, compiled (a ``graph -> Schedule`` callable).

    ``learned``: the trainer's weights (``False``: critical path's, the guard kept the
    fallback; ``num_states`` is then 0). ``hits`` counts decisions whose choice differs
    from critical path's, ``misses`` the others (``hit_rate``: the overriding share).
    """

    fallback_name = "critical_path"
    encoding = "afterstate"

    def __init__(self, weights: Any, *, learned: bool = True,
                 metadata: dict[str, Any] | None = None, name: str = "afterstate") -> None:
        self.weights = _check_weights(weights, "AfterstatePolicy weights")
        self.learned, self.name = bool(learned), name
        self.metadata = dict(metadata or {})
        self.hits = self.misses = 0

    def fallback_alone(self) -> AfterstatePolicy:
        """Critical path as an afterstate policy (the weights the trainer starts from)."""
        return AfterstatePolicy(afterstate_start(), learned=False)

    def count_hits(self, graphs: Sequence[Graph]) -> None:
        """Add each graph's overriding / other decisions to ``hits`` / ``misses``."""
        for g in graphs:
            res = run_afterstate(*afterstate_inputs(g), self.weights)  # type: ignore[call-arg]
            self.hits += int(res[4])
            self.misses += int(res[5] - res[4])

    def scheduler(self, name: str = "afterstate") -> AfterstatePolicy:
        """This policy under another record name (``experiments`` name its rows)."""
        return AfterstatePolicy(self.weights, learned=self.learned, metadata=self.metadata,
                                name=name)

    def __call__(self, graph: Graph) -> Schedule:
        t0 = time.perf_counter()
        res = run_afterstate(*afterstate_inputs(graph), self.weights)  # type: ignore[call-arg]
        bop, bforced, bptr, nodes = res[:4]
        return core_schedule(bop, bforced, bptr, nodes, self.name, t0)

    def twin(self) -> AfterstateTwin:
        """The Python oracle with these weights."""
        return AfterstateTwin(self.weights)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "features": list(FEATURES),
                "after_features": list(AFTER_FEATURES), "weights": self.weights.tolist(),
                "fallback": "critical_path", "learned": self.learned,
                "metadata": self.metadata}

    def save(self, path: str | Path) -> Path:
        """Write the JSON artifact atomically (was written in place: a crash could cut it)."""
        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> AfterstatePolicy:
        """Read an artifact; a bad file raises :class:`PolicyFileError` naming it."""
        path = Path(path)
        fix = "write one with AfterstatePolicy.save (trainer=afterstate)"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise PolicyFileError(path, f"not a readable JSON file ({e})", fix) from e
        if not isinstance(doc, dict):
            raise PolicyFileError(path, f"a JSON {type(doc).__name__}, not an object", fix)
        check_header(path, doc, FORMAT, VERSION, FEATURES, fix)
        weights = doc.get("weights")
        if (doc.get("after_features") == list(AFTER_FEATURES[:BASE_AFTER])
                and isinstance(weights, list)):  # written before the extra columns: 0 there
            doc["after_features"] = list(AFTER_FEATURES)
            weights = weights + [0.0] * len(EXTRA_FEATURES)
        if doc.get("after_features") != list(AFTER_FEATURES):
            raise PolicyFileError(path, f"made for the afterstate features "
                                  f"{doc.get('after_features')}, this edbatch computes "
                                  f"{list(AFTER_FEATURES)}", fix)
        try:
            w = _check_weights(weights, "weights")
            metadata, learned = metadata_of(doc), doc.get("learned", True)
            if not isinstance(learned, bool):
                raise TypeError(f"learned is {learned!r}, not true or false")
        except (TypeError, ValueError) as e:
            raise PolicyFileError(path, str(e), fix) from None
        return cls(w, learned=learned, metadata=metadata)


class AfterstateTwin(PriorityTwin):
    """The Python oracle: the priority twin's rows, the afterstate columns recomputed by
    rescanning the ready nodes' users (module doc of
    :mod:`edbatch.schedule._compiled_afterstate`), the same scores and argmax."""

    def __init__(self, weights: Any) -> None:
        w = _check_weights(weights, "AfterstateTwin weights")
        super().__init__(w[:len(FEATURES)])
        self.after = [float(x) for x in w[len(FEATURES):]]

    def _prepare(self, graph: Graph) -> None:
        super()._prepare(graph)
        self._down = type_chain_lengths(graph).tolist()

    def _after_rows(self, view: FrontierView, ready: list[int]) -> list[list[float]]:
        pending = view._frontier._pending
        uptr, uids, op, down = self._uptr, self._uids, self._op, self._down
        k = len(self._batchable)
        d = {b: [max(down[v][t] for v in view.ready_nodes(b).tolist()) for t in range(k)]
             for b in ready}
        # rel[b][t] / rel[(a, b)][t]: the most down over the type-t nodes running b (a and
        # b, a < b, both needed) releases
        rel: dict = {}  # type: ignore[type-arg]
        dec: dict[int, dict[int, int]] = {}
        for b in ready:
            rel[b] = {}
            for v in view.ready_nodes(b).tolist():
                for u in uids[uptr[v]:uptr[v + 1]]:
                    du = dec.setdefault(u, {})
                    du[b] = du.get(b, 0) + 1
        for u, du in dec.items():
            t = op[u]
            if pending[u] == sum(du.values()) and self._batchable[t] and len(du) <= 2:
                rb = rel.setdefault(tuple(sorted(du)) if len(du) == 2 else next(iter(du)), {})
                rb[t] = [max(x, y) for x, y in zip(rb.get(t, [0] * k), down[u])]

        def tight(t: int, rows: dict[int, list[int]]) -> tuple[bool, int]:
            other = _other(t, t, rows)
            return rows[t][t] > other, max(other - rows[t][t], 0)

        out = []
        for a in ready:
            dn = {b: list(r) for b, r in d.items() if b != a}
            for t, row in rel[a].items():
                dn[t] = [max(x, y) for x, y in zip(dn.get(t, [0] * k), row)]
            ta, la = tight(a, d)
            res = [tight(t, dn) for t in dn]
            nt = sum(1 for x, _ in res if x)
            lsum = sum(lt for _, lt in res)
            out.append([1.0 if ta else 0.0, min(la, 16) / 16.0, nt / 4.0,
                        1.0 if (dn and nt == 0) else 0.0, len(dn) / 4.0,
                        min(lsum, 64) / 64.0, *_extra_cols(a, d, rel, dn, k)])
        return out

    def rows(self, view: FrontierView) -> tuple[list[int], list[list[float]]]:
        """(ready batchable op ids ascending, their rows ``f_a + g_a``)."""
        ready, rows = super().rows(view)
        return ready, [r + g for r, g in zip(rows, self._after_rows(view, ready), strict=True)]

    def score(self, row: list[float]) -> float:
        """The compiled ``_pick``'s sum, in its order (priority columns, then afterstate)."""
        s = 0.0
        for x, w in zip(row, self.weights + self.after, strict=True):
            s += x * w
        return s


def _other(t: int, skip: int, rows: dict[int, list[int]]) -> int:
    """The most ``rows[b][t]`` over the rows ``b`` other than ``skip`` (0 if none)."""
    return max([0] + [r[t] for b, r in rows.items() if b != skip])


def _extra_cols(a: int, d: dict[int, list[int]], rel: dict, dn: dict[int, list[int]],  # type: ignore[type-arg]
                k: int) -> list[float]:
    """The twin's :data:`~edbatch.schedule._compiled_afterstate_x.EXTRA_FEATURES` of ``a``
    (``d``: ready types' rows, ``rel``: their releases' rows, ``dn``: the rows after ``a``)."""
    owns = sum(1 for t in range(k) if t != a and d[a][t] > 0 and d[a][t] > _other(t, a, d))
    margin = d[a][a] - _other(a, a, d)
    wait = 0.0
    for b in d if margin <= 0 else ():
        if b == a:
            continue
        own = max(d[a][a], rel[b].get(a, [0] * k)[a])
        best = max([0] + [max(d[c][a] if (c in d and c != b) else 0,
                              rel[b].get(c, [0] * k)[a]) for c in range(k) if c != a])
        if own > best:
            wait = 1.0
            break
    miss, best_nt = 2, 0
    for b in dn:
        tb = dn[b][b] > _other(b, b, dn)
        d2 = {t: list(r) for t, r in dn.items() if t != b}
        if b in d and b != a:  # ready before a ran: its release (alone, with a) is known
            for t, row in [*rel[b].items(), *rel.get((min(a, b), max(a, b)), {}).items()]:
                d2[t] = [max(x, y) for x, y in zip(d2.get(t, [0] * k), row)]
        nt2 = sum(1 for t in d2 if d2[t][t] > _other(t, t, d2))
        miss = min(miss, (0 if tb else 1) + (1 if (d2 and nt2 == 0) else 0))
        best_nt = max(best_nt, nt2)
    if k > MAX_TWO_STEP_TYPES:  # (not computed: see MAX_TWO_STEP_TYPES)
        miss, best_nt = 0, 0
    return [owns / 4.0, (miss if dn else 0) / 2.0, best_nt / 4.0,
            min(margin, 8) / 8.0 if margin > 0 else 0.0, wait]
