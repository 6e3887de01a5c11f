"""FSMPolicy: ED-Batch's finite-state-machine batching policy and its JSON artifact.

The FSM maps an encoded frontier state (see :mod:`envs.encoding`) to the op type to batch;
states missing from the table go to a fallback policy. The artifact is a JSON file with a
schema version, the op-type names of the workload it was trained on, the encoding, the table,
the fallback and training metadata. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.errors import ConfigError, PolicyFileError, UnknownNameError, did_you_mean
from edbatch.graph import Vocab
from edbatch.schedule import (
    AgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    FrontierView,
    MaxFrontierPolicy,
    Policy,
    PolicyScheduler,
    Scheduler,
    TypewiseGreedyPolicy,
)
from edbatch.schedule.compiled import (
    CompiledFsmScheduler,
    fsm_supported,
    resolve_backend,
)
from edbatch.schedule.op_types import check_op_types
from edbatch.schedule.replay import (
    ReplayFsmScheduler,
    ReplayPolicy,
    replay_fsm_supported,
    replay_heuristic,
    replay_names,
)
from edbatch.schedule.rollout import RolloutScheduler
from edbatch.schedule.search import SearchScheduler
from envs.encoding import (
    ENCODINGS,
    NEEDS_TYPEWISE,
    StateKey,
    encode_state,
    fallback_action,
    key_actions,
)
from policies._header import op_names, strict_int, write_json

__all__ = ["FALLBACKS", "FORMAT", "LOOKAHEADS", "SCHEMA_VERSION", "FSMPolicy", "FSMScheduler",
           "check_fallback", "check_fallback_config", "fallback_names", "make_fallback"]

FORMAT = "edbatch.fsm"
SCHEMA_VERSION = 1


class _EdBatchFallback:
    """ED-Batch's rule for unseen states: the last element of the state vector."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.needs_typewise = encoding in NEEDS_TYPEWISE

    def choose(self, view: FrontierView) -> int:
        return fallback_action(encode_state(view, self.encoding), self.encoding)


#: fallback name -> factory(encoding) -> Policy
FALLBACKS: dict[str, Callable[[str], Policy]] = {
    "ed_batch": _EdBatchFallback,
    "typewise_greedy": lambda _enc: TypewiseGreedyPolicy(),
    "dynet_agenda": lambda _enc: DynetAgendaPolicy(),
    "ed_batch_agenda": lambda _enc: AgendaPolicy(),
    "max_frontier": lambda _enc: MaxFrontierPolicy(),
    "critical_path": lambda _enc: CriticalPathPolicy(),
}


#: How an FSM schedules a whole graph: ``none`` follows its decisions; ``rollout`` improves on
#: them by fortified rollout (:mod:`edbatch.schedule.rollout`) with the FSM as base policy:
#: never more batches, at the price of one FSM rollout per (decision, ready op type);
#: ``rollout2`` nests it (each candidate completed by a level-1 rollout, budget
#: :data:`ROLLOUT2_BUDGET` batches): never more batches than ``rollout``, ~100x its cost;
#: ``search`` improves the ``rollout`` schedule by local search over its op-type sequence
#: (:mod:`edbatch.schedule.search`): never more batches than ``rollout``, ~10 s per
#: 64-lattice graph.
LOOKAHEADS = ("none", "rollout", "rollout2", "search")

#: ``rollout2``'s budgets in popped batches (outer, per candidate completion): about 30 s of
#: compiled search per 64-lattice graph of ~8,000 nodes on this project's 2-core VM.
ROLLOUT2_BUDGET, ROLLOUT2_INNER_BUDGET = 10_000_000, 30_000


def fallback_names() -> tuple[str, ...]:
    """Every valid fallback name: :data:`FALLBACKS` and ``replay:<heuristic>``
    (:mod:`edbatch.schedule.replay`)."""
    return (*FALLBACKS, *replay_names())


def check_fallback(name: str) -> None:
    """Raise :class:`UnknownNameError` naming ``name`` and the valid fallbacks if invalid."""
    if name not in FALLBACKS and not name.startswith("replay:"):
        raise UnknownNameError(f"unknown fallback {name!r}; choose one of "
                               f"{list(fallback_names())}." + did_you_mean(name, fallback_names()))
    replay_heuristic(name)  # a replay: name must follow a known heuristic


def check_fallback_config(key: str, name: str) -> None:
    """A trainer's ``fallback`` option: ``auto`` or a valid fallback name, else
    :class:`ConfigError` naming the key, the value and the valid choices."""
    if name == "auto":
        return
    try:
        check_fallback(name)
    except UnknownNameError:
        raise ConfigError(key, name, f"auto or one of {list(fallback_names())}",
                          "pick one of those names, e.g. replay:typewise_greedy_backward"
                          ) from None


def make_fallback(name: str, encoding: str) -> Policy:
    """The fallback policy called ``name`` (for states the table does not know): one of
    :data:`FALLBACKS` or ``replay:<heuristic>`` (:class:`ReplayPolicy`)."""
    check_fallback(name)
    heuristic = replay_heuristic(name)
    if heuristic is not None:
        return ReplayPolicy(heuristic)
    return FALLBACKS[name](encoding)


class FSMPolicy:
    """A table ``state key -> op id`` plus a fallback; counts table hits and misses.

    Args:
        table: encoded state -> op id to batch.
        encoding: name of the state encoding (a key of :data:`envs.encoding.ENCODINGS`).
        op_names: op-type names of the vocabulary the table's ids refer to.
        fallback: name of the fallback policy (:data:`FALLBACKS` or ``replay:<heuristic>``).
        metadata: free-form training metadata saved with the artifact.
        lookahead: how :meth:`scheduler` schedules whole graphs (:data:`LOOKAHEADS`).
    """

    def __init__(self, table: Mapping[StateKey, int], encoding: str, op_names: tuple[str, ...],
                 fallback: str = "ed_batch", metadata: Mapping[str, Any] | None = None,
                 lookahead: str = "none") -> None:
        if encoding not in ENCODINGS:
            raise UnknownNameError(f"unknown encoding {encoding!r}; choose one of "
                                   f"{list(ENCODINGS)}." + did_you_mean(encoding, ENCODINGS))
        if lookahead not in LOOKAHEADS:
            raise UnknownNameError(f"unknown lookahead {lookahead!r}; choose one of "
                                   f"{list(LOOKAHEADS)}." + did_you_mean(lookahead, LOOKAHEADS))
        self.lookahead = lookahead
        self.table = dict(table)
        self.encoding, self.op_names = encoding, tuple(op_names)
        self.fallback_name = fallback
        self.fallback = make_fallback(fallback, encoding)
        self.metadata = dict(metadata or {})
        self.needs_typewise = encoding in NEEDS_TYPEWISE or getattr(self.fallback,
                                                                    "needs_typewise", False)
        self.hits = self.misses = 0

    @property
    def num_states(self) -> int:
        """Number of states in the table."""
        return len(self.table)

    @property
    def hit_rate(self) -> float:
        """Share of decisions since the last reset whose state was in the table."""
        total = self.hits + self.misses
        return self.hits / total if total else float("nan")

    def reset_stats(self) -> None:
        """Zero the hit and miss counters."""
        self.hits = self.misses = 0

    def choose(self, view: FrontierView) -> int:
        """The table's action for this state, or the fallback's (an empty table skips the
        state encoding: every decision is the fallback's)."""
        if self.table:
            action = self.table.get(encode_state(view, self.encoding))
            if action is not None and view.mask[action]:
                self.hits += 1
                return action
        self.misses += 1
        return self.fallback.choose(view)

    def fork(self) -> FSMPolicy:
        """A policy with the same table and fallback rule and its own counters (and
        fallback state), e.g. for rollouts that must not count as this policy's decisions."""
        return FSMPolicy(self.table, self.encoding, self.op_names, self.fallback_name,
                         self.metadata, self.lookahead)

    def scheduler(self, name: str = "fsm", backend: str | None = None) -> Scheduler:
        """This policy as a whole-graph scheduler, with its :attr:`lookahead`.

        ``none``: this policy's decisions (its hit and miss counters count them), on the
        compiled core (:mod:`edbatch.schedule.compiled`) when it knows the encoding and
        fallback and ``backend`` (default ``$EDBATCH_BACKEND`` or ``compiled``) allows.
        ``rollout``: fortified rollout over forks of this policy (counters untouched);
        ``rollout2``: its level-2 form. Both run compiled when the FSM does (``backend``).
        ``search``: the ``rollout`` schedule improved by :func:`improve_schedule`.
        """
        if self.lookahead in ("rollout", "search"):
            rollout = RolloutScheduler([self.fork], name=name, backend=backend)
            return rollout if self.lookahead == "rollout" else SearchScheduler(rollout, name=name)
        if self.lookahead == "rollout2":
            return RolloutScheduler([self.fork], name=name, backend=backend, level=2,
                                    budget=ROLLOUT2_BUDGET, inner_budget=ROLLOUT2_INNER_BUDGET)
        return self.runtime_scheduler(name, backend)

    def runtime_scheduler(self, name: str = "fsm", backend: str | None = None) -> Scheduler:
        """This policy's own decisions, one table lookup each, whatever :attr:`lookahead`
        says (the deployed run-time path): compiled when the core knows the encoding and
        fallback and ``backend`` allows, else the Python :class:`PolicyScheduler`."""
        if resolve_backend(backend) == "compiled" and fsm_supported(self.encoding,
                                                                    self.fallback_name):
            return CompiledFsmScheduler(self, name)
        if resolve_backend(backend) == "compiled" and replay_fsm_supported(self.encoding,
                                                                           self.fallback_name):
            return ReplayFsmScheduler(self, name)
        return PolicyScheduler(self, name)

    # ------------------------------------------------------------------ artifact
    def to_json(self) -> dict[str, Any]:
        """The artifact as a JSON-ready dict."""
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "encoding": self.encoding,
                "op_types": list(self.op_names), "fallback": self.fallback_name,
                "lookahead": self.lookahead,
                "table": [[list(k), int(a)] for k, a in sorted(self.table.items())],
                "metadata": self.metadata}

    def save(self, path: str | Path) -> Path:
        """Write the artifact atomically: a crash never leaves a half-written file.

        Raises:
            PolicyFileError: ``path`` is a folder (was a raw ``IsADirectoryError``).
        """
        return write_json(path, self.to_json(), default=None)

    @classmethod
    def load(cls, path: str | Path, vocab: Vocab | None = None) -> FSMPolicy:
        """Read an artifact; check it against ``vocab`` (the workload's) if given.

        Raises:
            PolicyFileError: missing, corrupt, wrong format or version, or trained on a
                workload with other op types.
        """
        path = Path(path)
        if not path.is_file():
            raise PolicyFileError(path, "no such policy file",
                                  "train one with `python -m experiments.train` or fix the path")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PolicyFileError(path, f"not valid JSON ({e})",
                                  "the file is corrupt; re-train or restore it") from None
        return cls._from_json(path, data, vocab)

    @classmethod
    def _from_json(cls, path: Path, data: Any, vocab: Vocab | None) -> FSMPolicy:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PolicyFileError(path, f"not an edbatch FSM policy (format field is "
                                  f"{data.get('format') if isinstance(data, dict) else None!r})",
                                  "pass a file written by FSMPolicy.save")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise PolicyFileError(path, f"schema version {data.get('schema_version')!r}, this "
                                  f"edbatch reads version {SCHEMA_VERSION}", "re-train the policy")
        try:
            names, table, encoding, fallback, lookahead = _fields(data)
        except (KeyError, TypeError, ValueError) as e:
            raise PolicyFileError(path, f"malformed field ({type(e).__name__}: {e})",
                                  "the file is corrupt; re-train or restore it") from None
        if encoding not in ENCODINGS:
            raise PolicyFileError(path, f"encoding {encoding!r} is not one of "
                                  f"{list(ENCODINGS)}", "the file is corrupt or from a newer "
                                  "edbatch; re-train it")
        if vocab is not None:
            check_op_types(names, vocab.names, path,
                           "load the policy with the workload (and granularity) it was "
                           "trained on, or re-train it on this one")
        bad = [(k, a) for k, a in table.items() if not 0 <= a < len(names)]
        if bad:
            raise PolicyFileError(path, f"table entry {bad[0]} names op id {bad[0][1]} outside "
                                  f"0..{len(names) - 1}", "the file is corrupt; re-train it")
        if lookahead not in LOOKAHEADS:
            raise PolicyFileError(path, f"lookahead {lookahead!r} is not one of "
                                  f"{list(LOOKAHEADS)}", "the file is corrupt; re-train it")
        try:
            check_fallback(fallback)
        except UnknownNameError:
            raise PolicyFileError(path, f"fallback {fallback!r} is not one of "
                                  f"{list(fallback_names())}",
                                  "the file is corrupt or from a newer edbatch; re-train it"
                                  ) from None
        return cls(table, encoding, names, fallback, data.get("metadata", {}), lookahead)


def _fields(data: dict[str, Any]) -> tuple[tuple[str, ...], dict[StateKey, int], str, str,
                                            str]:
    """``(op names, table, encoding, fallback, lookahead)`` of an artifact's JSON; a missing,
    mistyped or repeated field raises ``KeyError`` / ``TypeError`` / ``ValueError``."""
    names = op_names(data["op_types"])
    rows = [(tuple(strict_int(x) for x in k), strict_int(a)) for k, a in data["table"]]
    table = dict(rows)
    if len(table) < len(rows):
        raise ValueError(f"{len(rows) - len(table)} table state(s) listed twice")
    if not isinstance(data.get("metadata", {}), dict):
        raise TypeError(f"metadata is {data['metadata']!r}, not an object")
    lookahead = str(data.get("lookahead", "none"))  # absent in older artifacts
    return names, table, str(data["encoding"]), str(data["fallback"]), lookahead


def greedy_action(q: Mapping[int, float], key: StateKey, encoding: str) -> int:
    """Argmax of a state's Q values; ties go to the first action in key order."""
    best, best_q = -1, -np.inf
    for a in key_actions(key, encoding):
        v = q.get(a, 0.0)
        if v > best_q:
            best, best_q = a, v
    return best


class FSMScheduler:
    """A saved FSM artifact as a :data:`~edbatch.schedule.Scheduler` (for evaluation).

    The artifact is loaded once; every graph's vocabulary is checked against the op types
    the policy was trained on, and a mismatch raises :class:`PolicyFileError`.
    """

    def __init__(self, path: str | Path, name: str = "fsm") -> None:
        self.path, self.name = Path(path), name
        self.policy = FSMPolicy.load(self.path)

    def __call__(self, graph: Any) -> Any:
        check_op_types(self.policy.op_names, graph.vocab.names, self.path)
        return self.policy.scheduler(self.name)(graph)
