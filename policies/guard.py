"""Start from the heuristic, keep only what beats it: the residual guard of the RL learners.

An RL learner (tabular Q-learning, MaskablePPO) proposes table entries ``state key -> op
type`` where its learned values disagree with its fallback heuristic. The deployed FSM starts
as the fallback alone (the empty table) and takes the proposals one at a time, in the
learner's order of confidence: an entry is kept only when the FSM's own schedules need fewer
batches on the training graphs and no more on the validation graphs
(:func:`policies.table_search.improves`, the compiled trace: milliseconds per graph). So the
result is, by construction, never worse than the fallback on either graph set, and what it
learned over the fallback is counted in :class:`GuardReport` (saved in the artifact's
metadata and printed by the entry points).

The guard never invents an entry: every kept one is a learned proposal. An empty result is
a learner that learned nothing over its fallback on these graphs, and says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from envs.encoding import StateKey
from policies.fsm import FSMPolicy
from policies.table_search import GraphPool, decisions, improves, table_batches

__all__ = ["GuardReport", "fallback_choices", "fewest_batches", "guard_table", "pick_fallback",
           "q_proposals", "vote_proposals"]


@dataclass(frozen=True)
class GuardReport:
    """What the guard kept of a learner's proposals, and what it is worth on its graphs."""

    proposals: int
    """Distinct (state, action) entries the learner proposed against its fallback."""
    evaluations: int
    """Proposals scored by rescheduling the graphs that visit their state."""
    kept: int
    """Entries in the final table (each lowered the training batches, kept validation's)."""
    train_fallback: int
    """Batches of the fallback alone on the training graphs."""
    train_table: int
    """Batches of the guarded FSM on the training graphs (<= ``train_fallback``)."""
    val_fallback: int
    """Batches of the fallback alone on the validation graphs."""
    val_table: int
    """Batches of the guarded FSM on the validation graphs (<= ``val_fallback``)."""
    train_lb: int
    val_lb: int
    dropped_by_lookahead: int = 0
    """Entries the guard kept but dropped again because the FSM under its ``rollout``
    lookahead needed more batches with them than the fallback under the same rollout."""

    def as_meta(self) -> dict[str, int]:
        """Plain dict for the artifact's metadata (``guard``)."""
        return asdict(self)

    def reason(self) -> str | None:
        """Why nothing was kept (one phrase), or ``None`` when the table holds entries."""
        if self.kept:
            return None
        if self.dropped_by_lookahead:
            return (f"its {self.dropped_by_lookahead} kept entries cost batches under the "
                    f"rollout lookahead on the train/validation graphs: table dropped "
                    f"(policy.lookahead=none keeps it)")
        if self.train_fallback <= self.train_lb:
            return "its fallback already meets the lower bound on the training graphs"
        if not self.proposals:
            return "its learned values never disagreed with its fallback"
        if not self.evaluations:
            return f"none of its {self.proposals} proposals was scored (guard_max_evals=0)"
        return (f"none of its {self.proposals} proposals lowered the training batches "
                f"without raising validation's")


def fallback_choices(graphs: Sequence[Graph], encoding: str, fallback: str
                     ) -> dict[StateKey, Counter[int]]:
    """Per state key, the actions the fallback alone takes there on ``graphs``."""
    return decisions({}, graphs, encoding, fallback)


def guard_table(proposals: Iterable[tuple[StateKey, int]], train: Sequence[Graph],
                val: Sequence[Graph], encoding: str, fallback: str, *,
                max_evals: int = 2000, lookahead: str = "none"
                ) -> tuple[dict[StateKey, int], GuardReport]:
    """The fallback plus those ``proposals`` (most confident first) that pay.

    Args:
        proposals: ``(state key, op type)`` pairs in the learner's order of confidence;
            a key already decided (kept earlier) is skipped.
        train: graphs whose batches a kept entry must lower.
        val: graphs whose batches a kept entry must not raise.
        encoding, fallback: the FSM's key and fallback rule.
        max_evals: most proposals scored (a time cap that keeps determinism).
        lookahead: the deployed FSM's lookahead. With ``rollout`` the kept table is checked
            once more as a whole under it (a rollout is not monotone in its base policy):
            if it needs more batches than the fallback under the same rollout on the
            training or the validation graphs, the table is dropped.

    Returns:
        The table and its :class:`GuardReport`.
    """
    table: dict[StateKey, int] = {}
    tr = GraphPool(train, table, encoding, fallback)
    va = GraphPool(val, table, encoding, fallback)
    train_fb, val_fb = tr.total, va.total
    seen: set[tuple[StateKey, int]] = set()
    evals = 0
    train_lb = sum(lower_bound(g) for g in train)
    # at the lower bound no entry can lower the training batches: none is scored
    cap = 0 if train_fb <= train_lb else max_evals
    for key, action in proposals:
        entry = (key, int(action))
        if entry in seen:
            continue
        seen.add(entry)
        if key in table or evals >= cap:
            continue
        evals += 1
        trial = {**table, key: int(action)}
        if improves(tr, va, trial, {key}):
            table = trial
    dropped = 0
    if table and lookahead == "rollout" and not _pays_under_lookahead(
            table, train, val, encoding, fallback, lookahead):
        dropped, table = len(table), {}
        tr, va = GraphPool(train, table, encoding, fallback), GraphPool(val, table, encoding,
                                                                        fallback)
    report = GuardReport(len(seen), evals, len(table), train_fb, tr.total, val_fb, va.total,
                         train_lb, sum(lower_bound(g) for g in val), dropped)
    return table, report


def _pays_under_lookahead(table: dict[StateKey, int], train: Sequence[Graph],
                          val: Sequence[Graph], encoding: str, fallback: str,
                          lookahead: str) -> bool:
    """Whether the FSM under ``lookahead`` needs no more batches than its fallback under
    the same lookahead, on the training and on the validation graphs."""
    names = train[0].vocab.names
    fsm = FSMPolicy(table, encoding, names, fallback, lookahead=lookahead).scheduler("fsm")
    alone = FSMPolicy({}, encoding, names, fallback, lookahead=lookahead).scheduler("fb")
    for graphs in (train, val):
        if sum(fsm(g).num_batches for g in graphs) > sum(alone(g).num_batches for g in graphs):
            return False
    return True


def meets_lower_bound(graphs: Sequence[Graph], encoding: str, fallback: str) -> bool:
    """Whether the fallback alone needs only the lower bound's batches on ``graphs`` (then
    a guarded learner has nothing to learn there: no entry can lower them)."""
    return table_batches({}, graphs, encoding, fallback) <= sum(lower_bound(g) for g in graphs)


def pick_fallback(graphs: Sequence[Graph], encoding: str, names: Sequence[str]) -> str:
    """The heuristic of ``names`` whose schedules need the fewest batches on ``graphs``
    (ties: the earlier name): the best single heuristic the learner starts from."""
    return fewest_batches(graphs, encoding, names)[0]


def fewest_batches(graphs: Sequence[Graph], encoding: str, names: Sequence[str]
                   ) -> tuple[str, int]:
    """:func:`pick_fallback`'s heuristic and its batches summed over ``graphs``."""
    scores = {n: table_batches({}, graphs, encoding, n) for n in names}
    name = min(names, key=lambda n: scores[n])
    return name, scores[name]


def q_proposals(q: dict[StateKey, dict[int, float]], fallback: dict[StateKey, Counter[int]],
                *, margin: float = 0.0, untried: tuple[float, ...] = (0.0, -0.01)
                ) -> list[tuple[StateKey, int]]:
    """A Q-table's disagreements with its fallback, largest learned advantage first.

    At a state the fallback visits (``fallback``: its actions there), every action whose
    Q value exceeds that of the fallback's usual action by more than ``margin`` is proposed,
    ranked by the difference. At a state it never visits (reachable only after a change),
    the greedy action is proposed, ranked by its lead over the runner-up, after all of the
    former. Actions whose Q value is still a warm-start initial value (``untried``) were
    never updated, so they carry no learned value and are not proposed.
    """
    ranked: list[tuple[int, float, StateKey, int]] = []
    for key, qs in q.items():
        tried = {a: v for a, v in qs.items() if v not in untried}
        if key in fallback:
            b = fallback[key].most_common(1)[0][0]
            ref = qs.get(b)
            if ref is None:
                continue
            for a, v in tried.items():
                if a != b and v > ref + margin:
                    ranked.append((0, v - ref, key, a))
        elif len(tried) >= 2:
            (a, v), (_, v2) = sorted(tried.items(), key=lambda av: (-av[1], av[0]))[:2]
            if v > v2 + margin:
                ranked.append((1, v - v2, key, a))
    ranked.sort(key=lambda r: (r[0], -r[1], r[2], r[3]))
    return [(key, a) for _, _, key, a in ranked]


def vote_proposals(votes: dict[StateKey, Counter[int]],
                   fallback: dict[StateKey, Counter[int]]) -> list[tuple[StateKey, int]]:
    """A network's majority actions per state where they differ from the fallback's usual
    action there, most voted first (how often the network took it)."""
    ranked = []
    for key, c in votes.items():
        a, n = sorted(c.items(), key=lambda an: (-an[1], an[0]))[0]
        fb = fallback.get(key)
        if fb is not None and fb.most_common(1)[0][0] == a and len(fb) == 1:
            continue  # the fallback always does this here: nothing learned
        ranked.append((-n, key, a))
    ranked.sort()
    return [(key, a) for _, key, a in ranked]
