"""The priority policy: one learned weight vector scores every ready op type, compiled.

Where an FSM table looks a decision up by a key (and on module networks, with about 17 of
41 types ready per decision, keys never repeat), the priority policy *generalises across
keys*: each ready type gets a feature row (:data:`FEATURES`: critical path's height gap,
its fill ``|F|/T``, completeness, counts, ...; see
:mod:`edbatch.schedule._compiled_priority`) and the score ``w . f``; the type with the
highest score runs. The same weights score every type, so the policy is equivariant to the
order of op types and reads any vocabulary (a mini-batch with op types it never saw is
fine). ``w = critical_path_weights()`` *is* critical path (the fallback and the trainer's
start, :mod:`policies.priority_train`).

Run time: the whole schedule in one numba call (:func:`run_priority`), the features and
the score computed per decision inside the compiled loop. :class:`PriorityTwin` is the
Python oracle (a :class:`~edbatch.schedule.Policy` over
:class:`~edbatch.schedule.FrontierView`): same rows, same schedules.

Artifact: JSON ``{"format": "edbatch.priority", "version": 4, "features": [...],
"hidden": nh, "weights": [...], "fallback": "critical_path", "learned": bool,
"metadata": {...}}`` (``weights``: the flat parameters of
:func:`~edbatch.schedule._compiled_priority.num_params`; ``hidden`` 0 is linear). Versions 1
(15 features, linear, no ``hidden``) and 2 (22 features) still load: the newer features
get weight 0 (:func:`widen`); so does version 3 (23, no context features).
``batch.run(policy)`` takes a :class:`PriorityPolicy` (it is a ``graph -> Schedule``
callable); ``experiments.evaluate scheduler=[priority] scheduler.priority.path=...``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import PolicyFileError
from edbatch.graph import Graph
from edbatch.schedule import CriticalPathPolicy, FrontierView, Schedule
from edbatch.schedule._compiled_priority import (
    PRIORITY_FEATURES,
    V1_FEATURES,
    V2_FEATURES,
    V3_FEATURES,
    critical_path_weights,
    num_params,
    run_priority,
    run_priority_counts,
)
from edbatch.schedule._compiled_priority_ctx import CONTEXT_SOURCES
from edbatch.schedule.bounds import height_list
from edbatch.schedule.compiled import core_graph, core_schedule
from policies._header import artifact_format, check_header, metadata_of, numbers, write_json

__all__ = ["FEATURES", "FORMAT", "VERSION", "PriorityPolicy", "PriorityScheduler", "widen",
           "PriorityTwin", "WeightStats", "critical_path_weights", "graph_inputs",
           "is_priority_file", "num_params", "population_batches"]

FORMAT = "edbatch.priority"
VERSION = 4
FEATURES = PRIORITY_FEATURES
FALLBACK = "critical_path"


def graph_inputs(graph: Graph, counts: bool = True) -> tuple:  # type: ignore[type-arg]
    """The compiled core's inputs for ``graph`` (cached flat arrays, heights, ``T(a)``
    graph, nodes per type), all but the weights of :func:`run_priority`. ``counts``
    false: nodes per type left empty (:func:`run_priority` counts them)."""
    arr, height, tw_pred, tw_ptr, tw_ids = core_graph(graph, True, True)
    total = (np.ascontiguousarray(graph.type_counts, dtype=np.int64) if counts
             else np.empty(0, np.int64))
    return (arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height, tw_pred,
            tw_ptr, tw_ids, total)


def population_batches(inputs: Sequence[tuple], ws: NDArray[np.float64],  # type: ignore[type-arg]
                       hidden: int = 0) -> NDArray[np.int64]:
    """``int64[len(ws), len(inputs)]``: batches of each graph (its :func:`graph_inputs`)
    under each parameter vector (rows of ``ws``, ``hidden`` hidden units)."""
    ws = np.ascontiguousarray(ws, dtype=np.float64)
    return np.stack([run_priority_counts(*g, ws, hidden)  # type: ignore[call-arg]
                     for g in inputs], axis=1)


def _check_hidden(hidden: Any, where: str) -> int:
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)) or hidden < 0:
        raise ValueError(f"{where}: hidden units must be an integer >= 0, got {hidden!r}")
    return int(hidden)


def _check_weights(w: Any, where: str, hidden: int = 0) -> NDArray[np.float64]:
    arr = numbers(w)
    n = num_params(hidden)
    if arr.shape != (n,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: need {n} finite weights ({len(FEATURES)} features "
                         f"{list(FEATURES)}, {hidden} hidden units), got shape {arr.shape}")
    return np.ascontiguousarray(arr)


class WeightStats:
    """What a weight-vector policy reports: ``num_states`` (the artifact's size: its learned
    weights, 0 for the fallback's), ``hit_rate`` (``hits`` / decisions counted)."""

    weights: NDArray[np.float64]
    learned: bool
    hits: int
    misses: int

    @property
    def num_states(self) -> int:
        """The artifact's size: the number of learned weights (0: critical path alone)."""
        return len(self.weights) if self.learned else 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def reset_stats(self) -> None:
        self.hits = self.misses = 0


class PriorityPolicy(WeightStats):
    """A weight vector as a batching policy, compiled (a ``graph -> Schedule`` callable).

    Args:
        weights: the flat parameters (:func:`num_params` of ``hidden``; with ``hidden=0``
            one float per :data:`FEATURES` entry).
        hidden: hidden units of the scorer (0: linear ``w . f``).
        learned: whether the weights are the trainer's (``False``: critical path's, the
            guard kept the fallback); ``num_states`` is the number of weights, 0 if not.
        metadata: free-form training metadata (saved with the weights).

    Counters: ``hits`` counts decisions whose choice differs from critical path's (where
    the learned score overrides the fallback), ``misses`` the others; ``hit_rate`` is the
    share of overriding decisions.
    """

    fallback_name = FALLBACK
    encoding = "priority"

    def __init__(self, weights: Any, *, hidden: int = 0, learned: bool = True,
                 metadata: dict[str, Any] | None = None) -> None:
        self.hidden = _check_hidden(hidden, "PriorityPolicy")
        self.weights = _check_weights(weights, "PriorityPolicy weights", self.hidden)
        self.learned = bool(learned)
        self.metadata = dict(metadata or {})
        self.hits = self.misses = 0
        self.name = "priority"

    # ------------------------------------------------------------------ reporting
    def fallback_alone(self) -> PriorityPolicy:
        """Critical path as a priority policy (the weights the trainer starts from)."""
        return PriorityPolicy(critical_path_weights(), learned=False)

    def count_hits(self, graphs: Sequence[Graph]) -> None:
        """Advance the counters over ``graphs`` (for ``experiments._learned.score_unseen``)."""
        for g in graphs:
            self(g)

    # ------------------------------------------------------------------ scheduling
    def __call__(self, graph: Graph) -> Schedule:
        t0 = time.perf_counter()
        bop, bforced, bptr, nodes, over, dec = run_priority(  # type: ignore[call-arg]
            *graph_inputs(graph, False), self.weights, self.hidden, True)  # lean given: numba's
        # dispatch of an omitted default cost ~2 us a call (measured)
        self.hits += int(over)
        self.misses += int(dec - over)
        return core_schedule(bop, bforced, bptr, nodes, self.name, t0)

    def scheduler(self, name: str = "priority") -> PriorityPolicy:
        """This policy under ``name`` (a scheduler sharing the weights and counters)."""
        s = PriorityPolicy.__new__(PriorityPolicy)
        s.__dict__.update(self.__dict__)
        s.name = name
        return s

    runtime_scheduler = scheduler

    def twin(self) -> PriorityTwin:
        """The Python oracle of this policy (a :class:`~edbatch.schedule.Policy`)."""
        return PriorityTwin(self.weights, self.hidden)

    fork = twin  # a fresh Policy per run, as policies.frontier_net.distill_fsm expects

    def __repr__(self) -> str:
        return f"PriorityPolicy({self.name}, hidden={self.hidden}, learned={self.learned})"

    # ------------------------------------------------------------------ artifact
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "features": list(FEATURES),
                "hidden": self.hidden, "weights": [float(x) for x in self.weights],
                "fallback": FALLBACK,
                "learned": self.learned, "metadata": self.metadata}

    def save(self, path: str | Path) -> Path:
        """Write the JSON artifact (atomically: a temporary file, then renamed)."""
        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> PriorityPolicy:
        """Read an artifact written by :meth:`save` (version 4; 3: 23 features, 2: 22,
        1: linear over the first 15; the newer features weighted 0).

        Raises:
            PolicyFileError: missing, not JSON, another format or version, other features,
                a bad ``hidden`` or weights that are not :func:`num_params` finite numbers.
        """
        path = Path(path)
        fix = "retrain with python -m experiments.train trainer=priority or pass the right file"
        if not path.is_file():
            raise PolicyFileError(path, "no such priority-policy file", fix)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise PolicyFileError(path, f"not a JSON priority-policy file ({e})", fix) from None
        header = data if isinstance(data, dict) else None
        version = header.get("version") if header is not None else None
        old = {1: V1_FEATURES, 2: V2_FEATURES, 3: V3_FEATURES}.get(  # type: ignore[call-overload]
            version) if type(version) is int else None
        check_header(path, header, FORMAT, version if old else VERSION,  # type: ignore[arg-type]
                     old or FEATURES, fix)
        assert header is not None
        try:
            hidden = 0 if version == 1 else _check_hidden(header.get("hidden", 0), "hidden")
            raw = header.get("weights")
            if old:  # an older feature list: its weights, the newer features' 0
                w1 = np.asarray(raw, dtype=np.float64) if isinstance(raw, list) else raw
                f = len(old)
                if np.shape(w1) != (f + hidden * (f + 2),):
                    raise ValueError(f"weights: version {version} needs "
                                     f"{f + hidden * (f + 2)} weights, got shape "
                                     f"{np.shape(w1)}")
                raw = widen(w1, f, hidden)
            w = _check_weights(raw, "weights", hidden)
            metadata, learned = metadata_of(header), header.get("learned", True)
            if not isinstance(learned, bool):
                raise TypeError(f"learned is {learned!r}, not true or false")
        except (TypeError, ValueError) as e:
            raise PolicyFileError(path, str(e), fix) from None
        return cls(w, hidden=hidden, learned=learned, metadata=metadata)


def widen(w: NDArray[np.float64], f: int, hidden: int = 0) -> NDArray[np.float64]:
    """Parameters over the first ``f`` features as parameters over all of :data:`FEATURES`
    (the others weighted 0 in the linear part and in every hidden unit): same scores."""
    n = len(FEATURES)
    out = np.zeros(num_params(hidden), np.float64)
    out[:f] = w[:f]
    for j in range(hidden):
        src, dst = f + j * (f + 1), n + j * (n + 1)
        out[dst:dst + f] = w[src:src + f]
        out[dst + n] = w[src + f]
    out[n + hidden * (n + 1):] = w[f + hidden * (f + 1):]
    return out


def is_priority_file(path: str | Path) -> bool:
    """Whether ``path`` is a JSON file of :data:`FORMAT` (anything else: ``False``)."""
    return artifact_format(path) == FORMAT


class PriorityScheduler(PriorityPolicy):
    """A saved priority artifact as a scheduler (``conf/scheduler/priority.yaml``)."""

    def __init__(self, path: str | Path, name: str = "priority") -> None:
        p = PriorityPolicy.load(path)
        super().__init__(p.weights, hidden=p.hidden, learned=p.learned, metadata=p.metadata)
        self.name = name


class PriorityTwin:
    """The Python oracle of the compiled priority policy: the same feature rows from a
    :class:`~edbatch.schedule.FrontierView` (the release features read the live frontier's
    pending operand counts), the same scores, the same argmax (first on ties)."""

    needs_typewise = True

    def __init__(self, weights: Any, hidden: int = 0) -> None:
        self.hidden = _check_hidden(hidden, "PriorityTwin")
        self.weights = [float(x) for x in _check_weights(weights, "PriorityTwin weights",
                                                          self.hidden)]
        self._graph: Graph | None = None
        self._cp = CriticalPathPolicy()
        self._hist: list[int] = []  # this twin's decisions on the current schedule

    def _prepare(self, graph: Graph) -> None:
        self._graph = graph
        self._h = height_list(graph)
        self._hmax = float(max(self._h, default=0)) + 1.0
        self._total = graph.type_counts.tolist()
        self._op = graph.op_ids.tolist()
        uptr, uids = graph.users
        self._uptr, self._uids = uptr.tolist(), uids.tolist()
        self._batchable = graph.vocab.batchable.tolist()

    def _release(self, view: FrontierView, ready: list[int]
                 ) -> tuple[dict[int, dict[int, int]], dict[int, int]]:
        """Per ready type ``b``: released nodes per type, and users left waiting."""
        pending = view._frontier._pending  # the live frontier's unexecuted operand counts
        uptr, uids, op = self._uptr, self._uids, self._op
        rel: dict[int, dict[int, int]] = {}
        part: dict[int, int] = {}
        for b in ready:
            dec: dict[int, int] = {}
            for v in view.ready_nodes(b).tolist():
                for u in uids[uptr[v]:uptr[v + 1]]:
                    dec[u] = dec.get(u, 0) + 1
            row: dict[int, int] = {}
            part[b] = 0
            for u, d in dec.items():
                if pending[u] == d:
                    if self._batchable[op[u]]:
                        row[op[u]] = row.get(op[u], 0) + 1
                else:
                    part[b] += 1
            rel[b] = row
        return rel, part

    def rows(self, view: FrontierView) -> tuple[list[int], list[list[float]]]:
        """(ready batchable op ids ascending, their feature rows)."""
        if view.graph is not self._graph:
            self._prepare(view.graph)
        if view.last_op == -1:
            self._hist = []
        h = self._h
        ready = view.ready_ops
        tops = [view.max_over_ready(a, h) for a in ready]
        top = max(tops)
        n_ready = sum(view.count(a) for a in ready)
        rel, part = self._release(view, ready)
        cp = self._cp.choose(view)
        rows = []
        for a, mh in zip(ready, tops):
            c, t = view.count(a), view.typewise(a)
            rem = view.remaining(a)[0]
            hs = [h[v] for v in view.ready_nodes(a).tolist()]
            gap = mh - top
            mg = mh - sum(hs) / c
            tot = sum(rel[a].values())
            join = sum(m for b, m in rel[a].items() if b != a and view.count(b) > 0)
            others = [(b, o) for b, o in zip(ready, tops) if b != a]
            wait = max([0] + [rel[b].get(a, 0) for b, _ in others])
            ld = mh - max(o for _, o in others) if others else 16
            pc = part[a] / c
            rows.append([
                float(gap), c / (t if t > 1 else 1), 1.0 if c >= t else 0.0,
                math.log1p(c) / 4.0, c / rem, math.log1p(t - c if t > c else 0) / 4.0,
                math.log1p(rem - c) / 8.0, 1.0 if a == view.last_op else 0.0,
                (mg if mg < 16.0 else 16.0) / 16.0, sum(1 for x in hs if x == mh) / c,
                mh / self._hmax, 1.0 if gap == -1 else 0.0, 1.0 if gap == 0 else 0.0,
                rem / self._total[a], c / n_ready, math.log1p(tot) / 4.0, join / c,
                rel[a].get(a, 0) / c, wait / c, rel[cp].get(a, 0) / c if cp != a else 0.0,
                (pc if pc < 4.0 else 4.0) / 4.0,
                (ld if ld < 16 else 16) / 16.0 if ld > -16 else -1.0,
                math.log1p(-gap) / 4.0])
        last2 = self._hist[-2] if len(self._hist) > 1 else -1
        for i, (a, row) in enumerate(zip(ready, rows)):  # context (_compiled_priority_ctx)
            row += [1.0 if a == cp else 0.0, 1.0 if a == last2 else 0.0,
                    math.log1p(len(ready) - 1) / 4.0]
            row += [max((o[j] for k, o in enumerate(rows) if k != i), default=0.0)
                    for j in CONTEXT_SOURCES]
        return ready, rows

    def score(self, row: list[float]) -> float:
        """The compiled scorer's arithmetic, in its order."""
        w, f, nh = self.weights, len(row), self.hidden
        s = 0.0
        for m in range(f):
            s += row[m] * w[m]
        for j in range(nh):
            o = f + j * (f + 1)
            z = w[o + f]
            for m in range(f):
                z += row[m] * w[o + m]
            if z > 0.0:
                s += w[f + nh * (f + 1) + j] * z
        return s

    def choose(self, view: FrontierView) -> int:
        ready, rows = self.rows(view)
        best, best_s = 0, -math.inf
        for i, row in enumerate(rows):
            s = self.score(row)
            if s > best_s:
                best, best_s = i, s
        self._hist.append(ready[best])
        return ready[best]
