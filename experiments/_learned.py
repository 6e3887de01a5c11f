"""What a learner learned over its fallback, on unseen mini-batches: the honest report line.

Shared by ``experiments.train`` and ``experiments.compare``: per learner the table size, the
hit rate (share of the FSM's own decisions its table answers) and the gain over its fallback
alone (same lookahead, empty table) on graphs it never saw; a learner that learned nothing
(empty table, a table never visited, a table that changes no schedule or only adds batches)
says so in one line with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edbatch.graph import Graph
from edbatch.schedule import lower_bound, run_policy

__all__ = ["Unseen", "best_heuristic", "learned_nothing", "score_unseen", "unseen_line",
           "worse_than_best"]


@dataclass(frozen=True)
class Unseen:
    """A learned FSM and its fallback alone on unseen graphs (sums over the graphs)."""

    graphs: int
    lower_bound: int
    fsm_batches: int
    fallback_batches: int
    states: int
    hit_rate: float
    fallback: str

    @property
    def ratio(self) -> float:
        return self.fsm_batches / max(self.lower_bound, 1)

    @property
    def fallback_ratio(self) -> float:
        return self.fallback_batches / max(self.lower_bound, 1)

    @property
    def gain(self) -> float:
        """Share of the fallback's batches the table removes (negative: it adds)."""
        return 1.0 - self.fsm_batches / max(self.fallback_batches, 1)


def fallback_alone(policy: Any) -> Any:
    """The FSM's fallback with the same lookahead and an empty table (a policy with its own
    ``fallback_alone``, e.g. the priority policy, makes it)."""
    if hasattr(policy, "fallback_alone"):
        return policy.fallback_alone()
    return type(policy)({}, policy.encoding, policy.op_names, policy.fallback_name,
                        lookahead=policy.lookahead)


def score_unseen(policy: Any, graphs: Sequence[Graph], fsm_batches: int | None = None,
                 fallback_batches: int | None = None) -> Unseen:
    """Score ``policy`` (an :class:`~policies.fsm.FSMPolicy`) and its fallback alone on
    ``graphs``; the hit rate counts the FSM's own decisions (no lookahead). Batches already
    counted by the caller may be passed in."""
    graphs = list(graphs)
    if fsm_batches is None:
        sched = policy.scheduler("fsm")
        fsm_batches = sum(sched(g).num_batches for g in graphs)
    if fallback_batches is None:
        if policy.num_states:
            alone = fallback_alone(policy).scheduler("fallback_only")
            fallback_batches = sum(alone(g).num_batches for g in graphs)
        else:  # an empty table is the fallback alone
            fallback_batches = fsm_batches
    policy.reset_stats()
    if hasattr(policy, "count_hits"):  # a compiled policy that counts its own decisions
        policy.count_hits(graphs)
    else:
        for g in graphs:
            run_policy(g, policy)
    return Unseen(len(graphs), sum(lower_bound(g) for g in graphs), int(fsm_batches),
                  int(fallback_batches), int(policy.num_states), float(policy.hit_rate),
                  str(policy.fallback_name))


def learned_nothing(name: str, policy: Any, u: Unseen) -> str | None:
    """One line naming why ``name`` learned nothing over its fallback, or ``None``."""
    if not u.states:
        why = policy.metadata.get("learned_nothing", "its trainer kept an empty table")
        return f"{name} learned nothing: 0 states, {u.fallback} alone; {why}"
    if u.hit_rate == 0.0:
        return (f"{name} learned nothing that applies here: its {u.states} states are never "
                f"visited on the {u.graphs} unseen mini-batches ({u.fallback} decides all)")
    if u.fsm_batches == u.fallback_batches:
        return (f"{name} learned nothing that shows here: its {u.states} states (hit rate "
                f"{u.hit_rate:.3f}) change no batch count against {u.fallback} alone on the "
                f"{u.graphs} unseen mini-batches")
    if u.fsm_batches > u.fallback_batches:
        return (f"{name} learned nothing that helps here: its {u.states} states (hit rate "
                f"{u.hit_rate:.3f}) add {u.fsm_batches - u.fallback_batches} batches "
                f"({-100 * u.gain:+.2f}%) against {u.fallback} alone on the {u.graphs} "
                f"unseen mini-batches")
    return None


def unseen_line(name: str, u: Unseen, split: str) -> str:
    """``name`` on the unseen graphs: ratio, fallback alone, gain, table size, hit rate."""
    return (f"{name} on {u.graphs} unseen {split} mini-batches: {u.ratio:.4f} x LB "
            f"({u.fsm_batches} batches), its fallback {u.fallback} alone {u.fallback_ratio:.4f}"
            f" x LB, gain {100 * u.gain:+.2f}%; table {u.states} states, hit rate "
            f"{u.hit_rate:.3f}")


def best_heuristic(records: Sequence[Any], names: Sequence[str]) -> tuple[str, int]:
    """The single heuristic of ``names`` with the fewest batches summed over ``records``
    (:class:`edbatch.evaluation.Record`; ties: the earlier name), and that sum."""
    totals = dict.fromkeys(names, 0)
    for r in records:
        if r.scheduler in totals:
            totals[r.scheduler] += r.num_batches
    name = min(names, key=lambda n: totals[n])
    return name, totals[name]


def worse_than_best(name: str, u: Unseen, best: str, best_batches: int) -> str | None:
    """One line when the learned FSM needs more batches than the best single heuristic on
    the unseen graphs (the goal every learner must meet), else ``None``."""
    if u.fsm_batches <= best_batches:
        return None
    return (f"{name} is WORSE than the best single heuristic {best} on the {u.graphs} unseen "
            f"mini-batches: {u.fsm_batches} vs {best_batches} batches "
            f"({u.ratio:.4f} vs {best_batches / max(u.lower_bound, 1):.4f} x LB; its "
            f"fallback {u.fallback} alone {u.fallback_ratio:.4f})")
