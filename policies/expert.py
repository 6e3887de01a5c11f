"""Expert iteration and direct table search: an FSM batching policy that beats its fallback.

Two stages, both producing an :class:`~policies.fsm.FSMPolicy` table over a graph-size-free
key (``expert`` by default: ready types with their critical-path gap and whether their
type-wise frontier is complete), so keys recur across graphs:

1. **Teacher** (``rounds`` > 0): fortified rollout (:func:`edbatch.schedule.rollout.
   rollout_schedule`) with a large budget over the current student and, on small graphs,
   the exact solver (:func:`edbatch.schedule.exact.exact_schedule`) where it proves
   optimality, label the first ``teacher_graphs`` training graphs. Each teacher schedule is
   replayed through a frontier; every decision becomes a vote ``key -> op type``. Per key
   the majority is kept when the key was seen ``min_count`` times and the majority holds
   ``confidence`` of the votes; keys are pruned on the validation graphs. The student
   becomes the next round's rollout base; votes accumulate over rounds (as DAgger does).
2. **Search** (``search_sweeps`` > 0, :mod:`policies.table_search`): coordinate descent on
   the table itself, starting from the teacher's table (or the empty one): one state's
   action changes at a time, kept when the training graphs need fewer batches and held-out
   check graphs (resampled mini-batches) need no more.

On lattices the teacher's votes alone schedule *worse* than the fallback (the rollout
deviates from the critical path in a few decisions per graph, at keys that also cover the
many decisions where it agrees), while the search improves on it; hence the defaults:
``rounds=0``, ``search_sweeps=3`` (docs/learning.md has the measurements).

The table is kept only if it needs no more batches than the fallback alone on the
validation graphs. Deterministic: the same seed and graphs give the same table bytes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.errors import ConfigError, GraphError, InvalidActionError
from edbatch.graph import Graph
from edbatch.schedule import Frontier, lower_bound
from edbatch.schedule.exact import exact_schedule
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.rollout import rollout_schedule
from edbatch.schedule.schedule import Schedule
from edbatch.schedule.search import improve_schedule
from envs.encoding import StateKey, encode_state
from policies.fallback_search import resolve_fallback
from policies.fsm import FSMPolicy, check_fallback_config, make_fallback
from policies.pair_search import pair_search
from policies.q_learning import TrainResult
from policies.resample import resample_graphs
from policies.table_search import SearchStats, complete_table, search_table, table_batches

__all__ = ["ExpertConfig", "ExpertTrainer", "fit_table", "resample_graphs", "teacher_samples",
           "train_expert"]

log = logging.getLogger(__name__)
Votes = dict[StateKey, Counter[int]]
#: Teachers of the expert rounds (``ExpertConfig.teacher``).
TEACHERS = ("rollout", "search")


@dataclass(frozen=True)
class ExpertConfig:
    """Hyper-parameters of expert iteration."""

    rounds: int = 0
    """Teacher/student rounds (round 0's teacher rolls out the fallback alone; 0: no
    teacher, the search starts from the empty table)."""
    teacher_graphs: int = 4
    """Training graphs the teacher labels per round (the first ones: the given graphs,
    then resampled ones)."""
    budget: int = 300_000
    """Rollout budget per graph (batches popped inside rollouts)."""
    teacher: str = "rollout"
    """``rollout``: the fortified rollout's schedule; ``search``: that schedule improved by
    the sequence search (:func:`edbatch.schedule.search.improve_schedule`, 200k mutants)."""
    exact_max_nodes: int = 400
    """Graphs with at most this many nodes are also labelled by the exact solver."""
    exact_node_budget: int = 50_000
    """Search nodes of the exact solver per graph (labels only when it proves optimality)."""
    min_count: int = 1
    """Least teacher decisions in a state before it may enter the table."""
    confidence: float = 0.5
    """Least share of the teacher's votes the majority action needs."""
    prune: bool = True
    """Drop keys whose removal lowers the validation batches."""
    max_prune_evals: int = 200
    """Most validation evaluations spent pruning per round."""
    encoding: str = "expert"
    """State key (see :mod:`envs.encoding`)."""
    fallback: str = "auto"
    """Policy for states not in the table, or ``auto``: each of
    :data:`~policies.q_learning.AUTO_FALLBACKS` gets its own table search, the one whose
    searched table needs the fewest batches on the validation graphs (not the resampled
    check graphs) wins (:mod:`policies.fallback_search`; the best heuristic alone when
    ``search_sweeps`` is 0)."""
    auto_probe_evals: int = 200
    """``fallback=auto``: candidate tables of each fallback's short first search."""
    auto_finalists: int = 2
    """``fallback=auto``: fallbacks whose probed table is best go on to the full search."""
    lookahead: str = "none"
    """How the trained FSM schedules graphs: ``none`` or ``rollout``."""
    augment: int = 32
    """Extra graphs resampled (seeded, with replacement) from the independent parts of the
    training graphs (a mini-batch's instances); half join the training graphs, half are the
    check graphs of the search and join the selection graphs."""
    search_sweeps: int = 3
    """Passes of the table search (:mod:`policies.table_search`); 0: no search."""
    search_max_evals: int = 2000
    """Most candidate tables the search schedules."""
    search_min_visits: int = 1
    """States the FSM visits fewer times on the training graphs are left to the fallback
    by the search (a guard against setting rare states from few samples)."""
    search_pairs: int = 0
    """After the search, pair moves over this many most visited states
    (:func:`~policies.pair_search.pair_search`: two states changed at once); 0: off."""
    search_pair_evals: int = 2000
    """Most candidate tables the pair moves schedule."""
    complete_min_visits: int = 2
    """After the search, states the FSM visits this often on the training and check graphs,
    always with the same action, enter the table (:func:`~policies.table_search.
    complete_table`; 0: off)."""
    seed: int = 0
    """Seed of the resampling (the rest is deterministic)."""
    n_jobs: int = 1
    """Processes labelling the teacher's graphs (joblib; -1: every core)."""

    def __post_init__(self) -> None:
        check_fallback_config("trainer.fallback", self.fallback)
        if self.teacher not in TEACHERS:
            raise ConfigError("trainer.teacher", self.teacher, f"one of {list(TEACHERS)}",
                              "pass trainer.teacher=search (or rollout, the default)")


def _replay(graph: Graph, schedule: Schedule, encoding: str, votes: Votes) -> int:
    """Follow ``schedule``'s decisions on a fresh frontier and vote ``key -> op``; returns
    the number of samples (0 if the schedule is not an MDP trajectory)."""
    decisions = [b.op_id for b in schedule.batches if not b.forced]
    keys: list[StateKey] = []
    it = iter(decisions)

    def choose(f: Frontier) -> int:
        keys.append(encode_state(f.view(), encoding))
        return next(it)

    try:
        drive(Frontier(graph, typewise=True), choose)
    except (InvalidActionError, StopIteration):
        return 0
    for key, a in zip(keys, decisions):
        votes.setdefault(key, Counter())[a] += 1
    return len(keys)


def _teach(graph: Graph, bases: Sequence[Callable[[], Policy]], cfg: ExpertConfig
           ) -> tuple[Schedule, Schedule | None]:
    """The teacher's rollout schedule of ``graph`` and, where the exact solver proves one
    optimal (small graphs), that one too."""
    sched = rollout_schedule(graph, bases, budget=cfg.budget, name="teacher")
    if cfg.teacher == "search":
        sched = improve_schedule(graph, sched, name="teacher")
    if graph.num_nodes <= cfg.exact_max_nodes:
        res = exact_schedule(graph, node_budget=cfg.exact_node_budget, initial=sched)
        if res.status == "optimal" and res.num_batches <= sched.num_batches:
            return sched, res.schedule
    return sched, None


def teacher_samples(graphs: Sequence[Graph], bases: Sequence[Callable[[], Policy]],
                    cfg: ExpertConfig, votes: Votes) -> dict[str, float]:
    """Label every graph with the teacher (rollout, plus exact on small graphs) into
    ``votes``; returns the teacher's batches/LB and sample counts. With ``cfg.n_jobs``
    other than 1 the graphs are labelled in parallel (joblib); the votes do not depend on
    it (each graph's teacher is deterministic, votes are replayed in graph order)."""
    if cfg.n_jobs == 1 or len(graphs) < 2:
        labels = [_teach(g, bases, cfg) for g in graphs]
    else:
        from joblib import Parallel, delayed
        labels = Parallel(n_jobs=cfg.n_jobs)(delayed(_teach)(g, bases, cfg) for g in graphs)
    batches = lb = samples = exact = 0
    for g, (sched, best) in zip(graphs, labels):
        n = _replay(g, best, cfg.encoding, votes) if best is not None else 0
        if n:
            exact += 1
            sched = best
        else:
            n = _replay(g, sched, cfg.encoding, votes)
        samples += n
        batches += sched.num_batches
        lb += lower_bound(g)
    return {"teacher_ratio": batches / max(lb, 1), "samples": samples, "exact_graphs": exact}


def fit_table(votes: Votes, min_count: int, confidence: float) -> dict[StateKey, int]:
    """Majority action per key (ties: smallest op id), kept where it is confident."""
    table = {}
    for key in sorted(votes):
        counter = votes[key]
        total = sum(counter.values())
        a, n = min(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        if total >= min_count and n / total >= confidence:
            table[key] = a
    return table


def _prune(table: dict[StateKey, int], votes: Votes, val: Sequence[Graph],
           cost: Callable[[dict[StateKey, int]], int], max_evals: int
           ) -> tuple[dict[StateKey, int], int]:
    """Backward elimination on the validation graphs, least-supported keys first."""
    best = cost(table)
    order = sorted(table, key=lambda k: (sum(votes[k].values()), k))
    for key in order[:max_evals]:
        trial = {k: a for k, a in table.items() if k != key}
        b = cost(trial)
        if b < best:
            table, best = trial, b
    return table, best


def _round_row(rnd: int, stats: dict[str, float], keys: int, states: int, batches: int,
               fb_batches: int, best_batches: int, lb: int) -> dict[str, float]:
    """The history row of teacher round ``rnd`` (and its log line)."""
    log.info("expert round %d: teacher %.4f x LB, %d samples, %d keys, %d in table, "
             "validation %.4f x LB (fallback %.4f)", rnd, stats["teacher_ratio"],
             stats["samples"], keys, states, batches / max(lb, 1), fb_batches / max(lb, 1))
    return {"episode": rnd + 1, "train/teacher_ratio": stats["teacher_ratio"],
            "train/samples": stats["samples"], "train/exact_graphs": stats["exact_graphs"],
            "train/keys_seen": keys, "train/num_states": states,
            "eval/ratio_to_lb": batches / max(lb, 1),
            "eval/fallback_ratio_to_lb": fb_batches / max(lb, 1),
            "eval/best_ratio_to_lb": best_batches / max(lb, 1)}


def _teacher_rounds(train: Sequence[Graph], val: Sequence[Graph], cfg: ExpertConfig,
                    make: Callable[[dict[StateKey, int]], FSMPolicy],
                    cost: Callable[[dict[StateKey, int]], int],
                    emit: Callable[[dict[str, float]], None], fb_batches: int, lb: int
                    ) -> tuple[dict[StateKey, int], int, float | None]:
    """``cfg.rounds`` of expert iteration: (best table, its validation batches, the last
    teacher's batches / LB); the empty table (the fallback alone) unless a round beats it."""
    best_table: dict[StateKey, int] = {}
    best_batches, teacher_ratio = fb_batches, None
    votes: Votes = {}
    student = make({})
    fallback = student.fallback_name
    for rnd in range(cfg.rounds):
        base = student.fork if student.table else (lambda: make_fallback(fallback,
                                                                         cfg.encoding))
        stats = teacher_samples(train[:cfg.teacher_graphs], [base], cfg, votes)
        teacher_ratio = stats["teacher_ratio"]
        table = fit_table(votes, cfg.min_count, cfg.confidence)
        if cfg.prune and table:
            table, batches = _prune(table, votes, val, cost, cfg.max_prune_evals)
        else:
            batches = cost(table)
        student = make(table)
        if batches < best_batches or (batches == best_batches
                                      and len(table) > len(best_table)):
            best_table, best_batches = table, batches
        emit(_round_row(rnd, stats, len(votes), len(table), batches, fb_batches,
                        best_batches, lb))
    return best_table, best_batches, teacher_ratio


def _search_stage(start: dict[StateKey, int], train: Sequence[Graph], check: Sequence[Graph],
                  cfg: ExpertConfig, fallback: str,
                  cost: Callable[[dict[StateKey, int]], int]
                  ) -> tuple[dict[StateKey, int], int, dict[str, float]]:
    """The table search from ``start``: (table, validation batches, history row)."""
    table, st = search_table(dict(start), train, check, cfg.encoding, fallback,
                             sweeps=cfg.search_sweeps, max_evals=cfg.search_max_evals,
                             min_visits=cfg.search_min_visits)
    batches = cost(table)
    log.info("table search: %d sweeps, %d tables tried, %d changes, %d states, %d "
             "validation batches", st.sweeps, st.evaluations, st.changes, len(table), batches)
    return table, batches, _search_row(st, cfg, len(table))


def _search_row(st: SearchStats, cfg: ExpertConfig, states: int) -> dict[str, float]:
    """The history row of the table search."""
    return {"episode": cfg.rounds + 1, "train/search_changes": st.changes,
            "train/search_evaluations": st.evaluations, "train/num_states": states}


def train_expert(train_graphs: Sequence[Graph], cfg: ExpertConfig = ExpertConfig(), *,
                 val_graphs: Sequence[Graph] | None = None,
                 callback: Callable[[dict[str, float]], None] | None = None,
                 metadata: dict[str, Any] | None = None) -> TrainResult:
    """Teacher rounds, then table search, over ``train_graphs``; select on ``val_graphs``
    (default: train) plus the resampled check graphs."""
    if not train_graphs:
        raise GraphError("train_expert needs at least one training graph")
    t0 = time.perf_counter()
    val = list(val_graphs) if val_graphs is not None else list(train_graphs)
    extra = resample_graphs(train_graphs, cfg.augment, np.random.default_rng(cfg.seed))
    half = (len(extra) + 1) // 2
    check = extra[half:]
    held_out = val  # fallback=auto chooses on these alone: the check graphs are resampled
    train_graphs, val = [*train_graphs, *extra[:half]], [*val, *check]  # training instances
    fallback, choice = resolve_fallback(
        cfg.fallback, train_graphs, check, held_out, cfg.encoding,
        probe_evals=cfg.auto_probe_evals, finalists=cfg.auto_finalists, sweeps=cfg.search_sweeps,
        min_visits=cfg.search_min_visits, max_evals=cfg.search_max_evals)
    names = train_graphs[0].vocab.names
    meta: dict[str, Any] = {"config": {**asdict(cfg), "fallback": fallback}, **(metadata or {})}
    if choice is not None:
        meta["auto_fallback"] = {"chosen": fallback, "candidates": choice.ratios()}

    def make(table: dict[StateKey, int]) -> FSMPolicy:
        return FSMPolicy(table, cfg.encoding, names, fallback, meta, cfg.lookahead)

    def cost(table: dict[StateKey, int]) -> int:
        return table_batches(table, val, cfg.encoding, fallback)

    fb_batches = cost({})
    lb = sum(lower_bound(g) for g in val)
    history: list[dict[str, float]] = []

    def emit(row: dict[str, float]) -> None:
        history.append(row)
        if callback is not None:
            callback(row)

    best_table, best_batches, teacher_ratio = _teacher_rounds(
        train_graphs, val, cfg, make, cost, emit, fb_batches, lb)
    if cfg.search_sweeps > 0:
        if choice is not None and not cfg.rounds:  # the winner's search is this stage
            table = choice.table
            batches = cost(table)  # choice.batches counts the held-out graphs alone
            row = _search_row(choice.stats, cfg, len(table))
        else:
            table, batches, row = _search_stage(best_table if cfg.rounds else {},
                                                train_graphs, check, cfg, fallback, cost)
        if cfg.search_pairs > 0:
            table, pst = pair_search(table, train_graphs, check, cfg.encoding, fallback,
                                     top=cfg.search_pairs, max_evals=cfg.search_pair_evals)
            batches = cost(table)
            row.update({"train/pair_changes": pst.changes,
                        "train/pair_evaluations": pst.evaluations})
            log.info("pair moves: %d tables tried, %d pairs kept, %d validation batches",
                     pst.evaluations, pst.changes, batches)
        row.update({"eval/ratio_to_lb": batches / max(lb, 1),
                    "eval/fallback_ratio_to_lb": fb_batches / max(lb, 1)})
        if batches <= best_batches:
            best_table, best_batches = table, batches
        row["eval/best_ratio_to_lb"] = best_batches / max(lb, 1)
        meta.update(search_changes=row["train/search_changes"], searched_states=len(table),
                    pair_changes=row.get("train/pair_changes"))
        emit(row)
    if cfg.complete_min_visits > 0:
        n = len(best_table)
        best_table = complete_table(best_table, [*train_graphs, *check], cfg.encoding,
                                    fallback, min_visits=cfg.complete_min_visits)
        meta.update(completed_states=len(best_table) - n)
    seconds = time.perf_counter() - t0
    best_ratio = best_batches / max(lb, 1)
    meta.update(rounds=cfg.rounds, best_ratio=best_ratio, train_seconds=seconds,
                fallback_ratio=fb_batches / max(lb, 1), teacher_ratio=teacher_ratio)
    return TrainResult(make(best_table), best_ratio, len(history), seconds, history)


class ExpertTrainer:
    """Config-friendly wrapper: ``ExpertTrainer(**hparams).fit(train, val, ...)``."""

    name = "expert"

    def __init__(self, **hparams: Any) -> None:
        self.config = ExpertConfig(**hparams)

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: str | Path | None = None,
            callback: Callable[[dict[str, float]], None] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None) -> TrainResult:
        """Train on ``train_graphs``, select on ``val_graphs`` (no checkpoints: rounds are
        short and deterministic)."""
        del checkpoint, progress
        return train_expert(train_graphs, self.config, val_graphs=val_graphs,
                            callback=callback, metadata=metadata)
