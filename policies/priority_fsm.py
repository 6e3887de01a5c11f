"""The priority policy distilled into an FSM table over a ranked-candidate key.

FSM keys that name op types (``envs.encoding``) do not recur on module networks (about 17
of 41 types ready per decision), so their tables miss on unseen graphs. The *rank* key
(:class:`RankKey`) names no type: it ranks the ready types in critical path's order, keeps
the first ``slots`` of them (the candidates; slot 0 is critical path's choice) and describes
each by a few of the priority policy's features cut into classes (e.g. ``wait_gain`` under
or over 0.2). The table maps a key to a slot; an unknown key runs slot 0, i.e. the fallback
is critical path. The key never reads the policy's weights: the table is all there is.

Run time: one numba call per graph (:func:`edbatch.schedule._compiled_priority_fsm.run_rank_fsm`),
the features, key and table lookup (binary search over the sorted packed keys) per
decision; a key reading only :data:`~edbatch.schedule._compiled_priority_fsm.LEAN_FEATURES`
(e.g. *bucket* over ``gap``, ``wait_gain``, ``rel_height``) computes only those columns, and
keeps the release sums only if it reads one (``lean``; the same schedules).
:class:`PriorityFsmTwin` is the Python oracle over a :class:`~edbatch.schedule.FrontierView`
(same keys, same schedules; the tests compare them).
Training: :mod:`policies.priority_distill` (DAgger over the priority policy's labels).

Artifact: JSON ``{"format": "edbatch.priority_fsm", "version": 1, "features": [...], "key":
{"slots", "features", "edges", "type_radix"}, "op_types": [...] | null, "table":
[[[m, c0, ...], slot], ...], "fallback": "critical_path", "metadata": {...}}``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import PolicyFileError
from edbatch.graph import Graph
from edbatch.schedule import FrontierView, Schedule
from edbatch.schedule._compiled_priority import V2_FEATURES
from edbatch.schedule._compiled_priority_fsm import LEAN_FEATURES, LEAN_RELEASE, run_rank_fsm
from edbatch.schedule.compiled import core_schedule
from policies._header import (
    artifact_format,
    check_header,
    metadata_of,
    op_names,
    strict_int,
    write_json,
)
from policies.priority import FEATURES, PriorityTwin, critical_path_weights, graph_inputs

__all__ = ["FORMAT", "KINDS", "VERSION", "PriorityFSM", "PriorityFsmTwin", "RankKey", "act_row",
           "is_priority_fsm_file", "rank_key"]

FORMAT = "edbatch.priority_fsm"
VERSION = 1
#: The feature list its artifact names: the one it was made with (its keys cut these; the
#: policy's newer ``far`` is not among them).
KEY_FEATURES = V2_FEATURES
FALLBACK = "critical_path"
#: Key kinds: ``rank`` (the first ``slots`` types in critical path's order, action = slot)
#: and ``bucket`` (the set of codes present, action = a code).
KINDS = ("rank", "bucket")
_FIX = "distil again with python -m benchmarks.priority_distill or pass the right file"


@dataclass(frozen=True)
class RankKey:
    """The key's definition (module doc).

    Args:
        slots: candidates per key (the table's actions are ``0..slots-1``).
        features: names from :data:`policies.priority.FEATURES`, cut per candidate.
        edges: per feature its ascending thresholds (a value ``v`` gets the class
            ``#{e <= v}``).
        type_radix: 0, or the number of op types when the op id is part of each code (the
            table then belongs to one vocabulary).
    """

    slots: int = 3
    features: tuple[str, ...] = ("wait_gain", "rel_join")
    edges: tuple[tuple[float, ...], ...] = ((0.25,), (0.1, 0.5))
    type_radix: int = 0
    kind: str = "rank"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"RankKey: kind must be one of {list(KINDS)}, got {self.kind!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"RankKey: slots must be an integer >= 1, got {self.slots!r}")
        bad = [f for f in self.features if f not in FEATURES]
        if bad:
            raise ValueError(f"RankKey: unknown feature {bad[0]!r}; choose from "
                             f"{list(FEATURES)}")
        if len(self.edges) != len(self.features):
            raise ValueError(f"RankKey: {len(self.features)} features need as many edge "
                             f"lists, got {len(self.edges)}")
        for f, e in zip(self.features, self.edges):
            if any(not math.isfinite(v) for v in e) or list(e) != sorted(e):
                raise ValueError(f"RankKey: the edges of {f!r} must be finite and ascending, "
                                 f"got {list(e)}")
        if isinstance(self.type_radix, bool) or not isinstance(self.type_radix, int) \
                or self.type_radix < 0:
            raise ValueError(f"RankKey: type_radix must be an integer >= 0, got "
                             f"{self.type_radix!r}")
        if self.kind == "bucket" and self.radix > 62:
            raise ValueError(f"RankKey: a bucket key needs at most 62 codes, these features "
                             f"and edges give {self.radix}; use fewer")
        if self.kind == "rank" and (self.slots + 2) * self.radix ** self.slots >= 2 ** 62:
            raise ValueError(f"RankKey: {self.slots} slots of radix {self.radix} do not fit "
                             f"one int64 key; use fewer slots, features or edges")

    @property
    def radix(self) -> int:
        """Distinct codes of one candidate."""
        r = math.prod(len(e) + 1 for e in self.edges)
        return r * self.type_radix if self.type_radix else r

    def arrays(self) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]:
        """``(feature columns, edges padded with +inf, edge counts)`` for the compiled key."""
        qf = np.array([FEATURES.index(f) for f in self.features], np.int64)
        ne = np.array([len(e) for e in self.edges], np.int64)
        edges = np.full((len(qf), max(1, int(ne.max(initial=0)))), np.inf)
        for q, e in enumerate(self.edges):
            edges[q, :len(e)] = e
        return qf, edges, ne

    @property
    def actions(self) -> int:
        """Table actions: slots (*rank*) or codes (*bucket*)."""
        return self.radix if self.kind == "bucket" else self.slots

    def check(self, key: Sequence[int]) -> None:
        """Raise ``ValueError`` naming ``key`` unless it is a key tuple of this key (what
        :func:`rank_key` makes): *rank* ``(m, codes of min(m, slots) slots)`` with ``m`` in
        ``1..slots + 1``, *bucket* distinct ascending codes; codes in ``0..radix - 1``."""
        r = self.radix
        if self.kind == "bucket":
            ok = len(key) > 0 and list(key) == sorted(set(key)) and 0 <= key[0] and key[-1] < r
        else:
            ok = len(key) > 0 and 1 <= key[0] <= self.slots + 1 and \
                len(key) == 1 + min(key[0], self.slots) and all(0 <= c < r for c in key[1:])
        if not ok:
            raise ValueError(f"table key {tuple(key)} is no {self.kind} key of {self.slots} "
                             f"slots and {r} codes")

    def pack(self, key: Sequence[int]) -> int:
        """The int64 the compiled table stores for a key tuple: *rank* ``(m, c0, c1,
        ...)``, *bucket* the codes present (ascending)."""
        if self.kind == "bucket":
            return sum(1 << int(c) for c in key)
        out = 0
        for i, c in enumerate(key):
            out = out * self.radix + int(c) if i else int(c)
        return out

    def unpack(self, packed: int) -> tuple[int, ...]:
        """The key tuple of a packed key (inverse of :meth:`pack`)."""
        if self.kind == "bucket":
            return tuple(c for c in range(self.radix) if int(packed) >> c & 1)
        r, k = self.radix, self.slots
        for n in range(1, k + 1):
            m, rest = divmod(int(packed), r ** n)
            if m == n or (n == k and m == k + 1):
                codes = []
                for _ in range(n):
                    rest, c = divmod(rest, r)
                    codes.append(c)
                return (m, *reversed(codes))
        raise ValueError(f"{packed} is not a packed key of {self}")

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "features": list(self.features),
                "edges": [list(e) for e in self.edges], "type_radix": self.type_radix,
                "kind": self.kind}

    @classmethod
    def from_json(cls, data: Any) -> RankKey:
        if not isinstance(data, dict):
            raise ValueError(f"key: need an object with slots, features, edges, got {data!r}")
        return cls(strict_int(data["slots"]), tuple(str(f) for f in data["features"]),
                   tuple(tuple(float(v) for v in e) for e in data["edges"]),
                   strict_int(data.get("type_radix", 0)), str(data.get("kind", "rank")))


def rank_key(spec: RankKey, ids: Sequence[int], rows: Sequence[Sequence[float]]
             ) -> tuple[tuple[int, ...], list[int], list[int]]:
    """The key tuple of one decision, the rows in critical path's order and each row's code
    (Python twin of :func:`~edbatch.schedule._compiled_priority_fsm.decision_key`; ``ids``
    ascending, ``rows`` their feature rows)."""
    cols = [FEATURES.index(f) for f in spec.features]
    order = sorted(range(len(ids)), key=lambda i: (-rows[i][0], -rows[i][1], i))
    codes = []
    for i in range(len(ids)):
        code = 0
        for c, e in zip(cols, spec.edges):
            code = code * (len(e) + 1) + sum(1 for v in e if rows[i][c] >= v)
        codes.append(code * spec.type_radix + ids[i] if spec.type_radix else code)
    if spec.kind == "bucket":
        return tuple(sorted(set(codes))), order, codes
    m = len(ids) if len(ids) <= spec.slots else spec.slots + 1
    return (m, *(codes[i] for i in order[:spec.slots])), order, codes


def act_row(spec: RankKey, action: int | None, order: Sequence[int],
            codes: Sequence[int]) -> int:
    """The row a table action names (twin of ``act_index``), critical path's if none."""
    if action is not None:
        if spec.kind == "bucket":
            for i in order:
                if codes[i] == action:
                    return i
        elif action < min(len(order), spec.slots):
            return order[action]
    return order[0]


class PriorityFSM:
    """A rank-key table plus critical path, as a compiled ``graph -> Schedule`` callable.

    Args:
        key: the :class:`RankKey`.
        table: key tuple -> slot (``0 <= slot < key.slots``).
        op_types: the vocabulary's op names when ``key.type_radix`` (else ``None``).
        metadata: free-form training metadata.

    Counters: ``hits`` / ``misses`` count the decisions with two or more ready types whose
    key the table knows / does not know (a single ready type is no decision).
    """

    fallback_name = FALLBACK
    encoding = "rank"

    def __init__(self, key: RankKey, table: Mapping[tuple[int, ...], int],
                 op_types: Sequence[str] | None = None,
                 metadata: Mapping[str, Any] | None = None) -> None:
        self.key = key
        self.table = {tuple(int(c) for c in k): int(a) for k, a in table.items()}
        bad = [(k, a) for k, a in self.table.items() if not 0 <= a < key.actions]
        if bad:
            raise ValueError(f"PriorityFSM: entry {bad[0]} names action {bad[0][1]}, need "
                             f"0..{key.actions - 1}")
        for k in self.table:
            key.check(k)
        self.op_types = tuple(op_types) if op_types is not None else None
        if key.type_radix and (self.op_types is None or len(self.op_types) != key.type_radix):
            raise ValueError(f"PriorityFSM: a key with type_radix {key.type_radix} needs that "
                             f"many op_types, got {None if op_types is None else len(op_types)}")
        self.metadata = dict(metadata or {})
        packed = sorted((key.pack(k), a) for k, a in self.table.items())
        self._keys = np.array([p for p, _ in packed], np.int64)
        self._acts = np.array([a for _, a in packed], np.int64)
        self._arrays = key.arrays()
        qf = set(self._arrays[0].tolist())
        #: Run with the lean rows (the key reads only :data:`LEAN_FEATURES`); tests set it
        #: false to compare against the full rows.
        self.lean = qf <= set(LEAN_FEATURES)
        self._release = bool(qf & set(LEAN_RELEASE))
        self.hits = self.misses = 0
        self.name = "priority_fsm"

    @property
    def num_states(self) -> int:
        return len(self.table)

    @property
    def num_overrides(self) -> int:
        """Entries whose slot is not 0 (the only ones that change critical path's choice)."""
        return sum(1 for a in self.table.values() if a)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def reset_stats(self) -> None:
        self.hits = self.misses = 0

    def fallback_alone(self) -> PriorityFSM:
        """The same key with an empty table: critical path."""
        return PriorityFSM(self.key, {}, self.op_types)

    def count_hits(self, graphs: Sequence[Graph]) -> None:
        for g in graphs:
            self(g)

    def _check_vocab(self, graph: Graph) -> None:
        if self.op_types is not None and tuple(graph.vocab.names) != self.op_types:
            raise PolicyFileError("<priority_fsm>", f"the table's key names op types "
                                  f"{list(self.op_types)[:4]}..., the graph has "
                                  f"{list(graph.vocab.names)[:4]}...",
                                  "distil the table on this workload")

    def run(self, graph: Graph, teacher: Any = None, mode: int = 1,
            record: int = 0) -> tuple[Any, ...]:
        """The compiled run (``mode`` 1: the table; 0: the ``teacher``'s choices), recording
        up to ``record`` ``(packed key, teacher slot)`` pairs; returns the raw result."""
        self._check_vocab(graph)
        w, nh = (teacher.weights, teacher.hidden) if teacher is not None else \
            (critical_path_weights(), 0)
        qf, edges, ne = self._arrays
        rk, rl = np.zeros(record, np.int64), np.zeros(record, np.int64)
        lean = (1 + (self.key.kind == "bucket")) * (self.lean and mode == 1 and record == 0)
        res = run_rank_fsm(*graph_inputs(graph), w, nh, mode, KINDS.index(self.key.kind),
                           self.key.slots, qf, edges, ne,
                           self.key.type_radix > 0, self.key.radix, self._keys, self._acts,
                           rk, rl, lean, self._release or lean == 0)
        return (*res, rk[:res[7]], rl[:res[7]])

    def __call__(self, graph: Graph) -> Schedule:
        t0 = time.perf_counter()
        bop, bforced, bptr, nodes, hits, choices = self.run(graph)[:6]
        self.hits += int(hits)
        self.misses += int(choices - hits)
        return core_schedule(bop, bforced, bptr, nodes, self.name, t0)

    def scheduler(self, name: str = "priority_fsm") -> PriorityFSM:
        """This table under ``name`` (sharing table and counters)."""
        s = PriorityFSM.__new__(PriorityFSM)
        s.__dict__.update(self.__dict__)
        s.name = name
        return s

    runtime_scheduler = scheduler

    def twin(self) -> PriorityFsmTwin:
        return PriorityFsmTwin(self)

    def __repr__(self) -> str:
        return f"PriorityFSM({self.num_states} states, {self.key})"

    # ------------------------------------------------------------------ artifact
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "features": list(KEY_FEATURES),
                "key": self.key.to_json(), "op_types": None if self.op_types is None
                else list(self.op_types),
                "table": [[list(k), a] for k, a in sorted(self.table.items())],
                "fallback": FALLBACK, "metadata": self.metadata}

    def save(self, path: str | Path) -> Path:
        """Write the JSON artifact atomically (temporary file, then renamed)."""
        return write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path, vocab_names: Sequence[str] | None = None) -> PriorityFSM:
        """Read an artifact of :meth:`save`; with ``vocab_names``, check a typed key's
        vocabulary against them.

        Raises:
            PolicyFileError: missing, not JSON, another format, version or feature list, a
                malformed key or table, or (typed key) another vocabulary.
        """
        path = Path(path)
        if not path.is_file():
            raise PolicyFileError(path, "no such priority-FSM file", _FIX)
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise PolicyFileError(path, f"not a JSON priority-FSM file ({e})", _FIX) from None
        check_header(path, data if isinstance(data, dict) else None, FORMAT, VERSION,
                     KEY_FEATURES, _FIX)
        try:
            key = RankKey.from_json(data.get("key"))
            table = {tuple(strict_int(c) for c in k): strict_int(a) for k, a in data["table"]}
            names = data.get("op_types")
            fsm = cls(key, table, None if names is None else op_names(names), metadata_of(data))
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyFileError(path, f"malformed key or table ({type(e).__name__}: {e})",
                                  _FIX) from None
        if vocab_names is not None and fsm.op_types is not None \
                and tuple(vocab_names) != fsm.op_types:
            raise PolicyFileError(path, "its typed key was distilled on other op types",
                                  "load it with the workload it was distilled on")
        return fsm


def is_priority_fsm_file(path: str | Path) -> bool:
    """Whether ``path`` is a JSON file of :data:`FORMAT` (anything else: ``False``)."""
    return artifact_format(path) == FORMAT


class PriorityFsmTwin:
    """The Python oracle of :class:`PriorityFSM`: the rows of :class:`PriorityTwin`, the key
    of :func:`rank_key`, the same lookup (a Policy over a FrontierView)."""

    needs_typewise = True

    def __init__(self, fsm: PriorityFSM) -> None:
        self.fsm = fsm
        self._rows = PriorityTwin(critical_path_weights())

    def choose(self, view: FrontierView) -> int:
        ids, rows = self._rows.rows(view)
        if len(ids) == 1:
            return ids[0]
        key, order, codes = rank_key(self.fsm.key, ids, rows)
        return ids[act_row(self.fsm.key, self.fsm.table.get(key), order, codes)]
