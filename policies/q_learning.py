"""Tabular n-step Q-learning of an FSM batching policy, as ED-Batch does it.

See docs/architecture.md 3.6.

ED-Batch trains on one graph. :func:`train_q_table` trains on any list of graphs (one
sampled per episode) and selects the best snapshot on validation graphs, so the FSM can be
evaluated on graphs it has never seen. With one training graph and ``clip_bootstrap=True``
it is ED-Batch's learner: alpha 0.4, gamma 1, n = 10, epsilon 0.5 -> 0.05 by x0.9 per episode,
best snapshot every 50 episodes, early stop at 1.01 x LB, at most 1000 episodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from edbatch.errors import GraphError
from edbatch.graph import Graph
from edbatch.schedule import Frontier, lower_bound, run_policy
from envs.encoding import StateKey, encode_state, key_actions
from policies._q_checkpoint import HeldCtrlC, QTable, load_checkpoint, save_checkpoint
from policies.fsm import FSMPolicy, check_fallback_config, greedy_action, make_fallback
from policies.guard import fallback_choices, guard_table, pick_fallback, q_proposals
from policies.resample import resample_graphs

__all__ = ["AUTO_FALLBACKS", "QLearningConfig", "QLearningTrainer", "TrainResult",
           "evaluate_policy", "select_fallback", "train_q_table"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QLearningConfig:
    """Hyper-parameters of the tabular learner (defaults: ED-Batch's constants)."""

    encoding: str = "sorted"
    """State encoding: base | sorted | max | complete."""
    alpha: float = 0.4
    """Learning rate."""
    gamma: float = 1.0
    """Discount."""
    n_step: int = 10
    """Length of the n-step return."""
    eps_start: float = 0.5
    """Initial exploration rate."""
    eps_min: float = 0.05
    """Exploration floor."""
    eps_decay: float = 0.9
    """Multiplier of epsilon after every episode."""
    max_episodes: int = 1000
    """Episode budget."""
    eval_every: int = 50
    """Greedy evaluation (and snapshot, checkpoint) period in episodes."""
    early_stop_ratio: float = 1.01
    """Stop once the best greedy batches / LB on the validation graphs is below this."""
    clip_bootstrap: bool = True
    """ED-Batch's quirk: bootstrap with max(0, max Q), which is always 0 (no bootstrap)."""
    fallback: str = "ed_batch"
    """Policy for states not in the table (ed_batch rule or a heuristic name), or ``auto``:
    the heuristic fallback with the fewest batches on the validation graphs."""
    warm_start: bool = False
    """Initialise a new state's Q values so that the greedy choice is the fallback's
    action (others start slightly lower); exploration then tries to improve on it."""
    fallback_snapshot: bool = False
    """Count the empty table (the fallback alone) as the first snapshot, so the result is
    never worse than the fallback on the validation graphs (not in ED-Batch)."""
    guard: bool = False
    """Residual form (not in ED-Batch): the deployed table starts empty (the fallback alone)
    and takes the learned Q-table's disagreements with the fallback, largest advantage first,
    each only if it lowers the training batches without raising the validation batches
    (:mod:`policies.guard`): never worse than the fallback on those graphs. With
    ``fallback="auto"`` the fallback is the heuristic with the fewest batches on the
    training and validation graphs together."""
    guard_margin: float = 0.0
    """Q-value lead over the fallback's action a proposal needs."""
    guard_max_evals: int = 2000
    """Most proposals the guard scores."""
    guard_check: int = 0
    """Mini-batches resampled (seeded) from the training graphs' instances that join the
    guard's validation graphs: a kept entry must not raise their batches either. With one
    training graph validated on itself (the dump protocol) nothing else is held out."""
    lookahead: str = "none"
    """How the trained FSM schedules whole graphs: ``none`` or ``rollout`` (fortified rollout
    over the FSM; see :data:`policies.fsm.LOOKAHEADS`). Training and snapshot selection use
    the FSM's own decisions either way."""
    seed: int = 0
    """Seed of the exploration and graph-sampling generator."""

    def __post_init__(self) -> None:
        check_fallback_config("trainer.fallback", self.fallback)


@dataclass
class TrainResult:
    """Outcome of :func:`train_q_table`."""

    policy: FSMPolicy
    best_ratio: float
    episodes: int
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


def evaluate_policy(policy: FSMPolicy, graphs: Sequence[Graph]) -> tuple[float, int, int]:
    """Greedy batches on ``graphs``: (sum batches / sum LB, sum batches, sum LB)."""
    batches = sum(run_policy(g, policy).num_batches for g in graphs)
    lb = sum(lower_bound(g) for g in graphs)
    return batches / max(lb, 1), batches, lb


#: Heuristic fallbacks ``fallback="auto"`` chooses from: the forward rules, then the replays
#: of the two whole-graph heuristics that are no forward rule (:mod:`edbatch.schedule.replay`);
#: ties go to the earlier name.
AUTO_FALLBACKS = ("critical_path", "typewise_greedy", "dynet_agenda", "ed_batch_agenda",
                  "replay:typewise_greedy_backward", "replay:dynet_level_agenda")


def select_fallback(graphs: Sequence[Graph], encoding: str) -> str:
    """The heuristic (of :data:`AUTO_FALLBACKS`) with the fewest batches on ``graphs``."""
    scores = {name: evaluate_policy(FSMPolicy({}, encoding, graphs[0].vocab.names, name),
                                    graphs)[1] for name in AUTO_FALLBACKS}
    return min(AUTO_FALLBACKS, key=lambda n: scores[n])


def _to_policy(q: QTable, cfg: QLearningConfig, names: tuple[str, ...],
               meta: dict[str, Any]) -> FSMPolicy:
    table = {s: greedy_action(qs, s, cfg.encoding) for s, qs in q.items()}
    return FSMPolicy(table, cfg.encoding, names, cfg.fallback, meta, cfg.lookahead)


def _episode(graph: Graph, q: QTable, cfg: QLearningConfig, rng: np.random.Generator,
             eps: float, fallback: Any = None) -> tuple[list[StateKey], list[int], list[float],
                                                     int]:
    """One epsilon-greedy rollout with ED-Batch's reward -1 + |F(a)|/T(a)."""
    f = Frontier(graph, typewise=True)
    states: list[StateKey] = []
    actions: list[int] = []
    rewards: list[float] = []
    while True:
        while f.pop_forced() is not None:
            pass
        if f.done:
            return states, actions, rewards, f.num_batches
        view = f.view()
        key = encode_state(view, cfg.encoding)
        qs = q.get(key)
        actions_in_key = key_actions(key, cfg.encoding)
        if qs is None:
            qs = q[key] = dict.fromkeys(actions_in_key, 0.0)
            if fallback is not None:
                for a in qs:
                    qs[a] = -0.01
                qs[fallback.choose(view)] = 0.0
        if rng.random() < eps:  # uniform over the state vector's entries, as ED-Batch
            a = actions_in_key[int(rng.integers(len(actions_in_key)))]
        else:
            a = greedy_action(qs, key, cfg.encoding)
        assert f.typewise_count is not None
        rewards.append(-1.0 + float(f.ready_count[a]) / float(max(f.typewise_count[a], 1)))
        states.append(key)
        actions.append(a)
        f.pop(a)


def _update(q: QTable, states: list[StateKey], actions: list[int], rewards: list[float],
            cfg: QLearningConfig) -> None:
    """n-step targets, updated in episode order (docs/architecture.md 3.6)."""
    n, steps = cfg.n_step, len(rewards)
    for i in range(steps):
        j_end = min(i + n, steps)
        target = 0.0
        for j in range(i, j_end):
            target += cfg.gamma ** (j - i) * rewards[j]
        if j_end < steps:
            v = max(q[states[j_end]].values())
            target += cfg.gamma ** (j_end - i) * (max(0.0, v) if cfg.clip_bootstrap else v)
        qs = q[states[i]]
        qs[actions[i]] += cfg.alpha * (target - qs[actions[i]])


def train_q_table(train_graphs: Sequence[Graph], cfg: QLearningConfig = QLearningConfig(), *,
                  val_graphs: Sequence[Graph] | None = None,
                  checkpoint: str | Path | None = None,
                  callback: Callable[[dict[str, float]], None] | None = None,
                  progress: bool = False, metadata: dict[str, Any] | None = None
                  ) -> TrainResult:
    """Learn an FSM by tabular n-step Q-learning over ``train_graphs``.

    Args:
        train_graphs: graphs to learn on; one is sampled (seeded) per episode.
        cfg: hyper-parameters.
        val_graphs: graphs for snapshot selection and early stopping (default: train).
        checkpoint: JSON file written every ``eval_every`` episodes; if it exists and was
            written with the same config, training resumes from it.
        callback: receives each episode's metrics (``train/...``, ``eval/...`` keys).
        progress: show a progress bar.
        metadata: extra fields saved in the policy artifact.
    """
    if not train_graphs:
        raise GraphError("train_q_table needs at least one training graph")
    vocab = train_graphs[0].vocab
    val = list(val_graphs) if val_graphs is not None else list(train_graphs)
    cfg = _resolve_fallback(cfg, train_graphs, val)
    names = vocab.names
    meta = {"config": asdict(cfg), **(metadata or {})}
    rng = np.random.default_rng(cfg.seed)
    q: QTable = {}
    best_q: QTable = {}
    best_ratio, episode, eps, seconds = float("inf"), 0, cfg.eps_start, 0.0
    history: list[dict[str, float]] = []
    if checkpoint is not None and Path(checkpoint).is_file():
        q, best_q, best_ratio, episode, eps, seconds = load_checkpoint(checkpoint, cfg, rng)
        log.info("resuming from checkpoint %s at episode %d", checkpoint, episode)
    # the empty table is the fallback policy alone: its level is the learning curve's line
    fallback_ratio, _, _ = evaluate_policy(_to_policy({}, cfg, names, meta), val)
    if cfg.fallback_snapshot and episode == 0 and not best_q:
        best_ratio = fallback_ratio  # the first snapshot to beat
    warm = make_fallback(cfg.fallback, cfg.encoding) if cfg.warm_start else None
    t0 = time.perf_counter() - seconds
    bar = tqdm(total=cfg.max_episodes, initial=episode, disable=not progress, desc="q-learning")
    # Ctrl-C (SIGINT) stops inside an episode (undone) or after its bookkeeping, never in a
    # table update or a checkpoint write
    held = HeldCtrlC()
    try:
        while episode < cfg.max_episodes and best_ratio >= cfg.early_stop_ratio:
            graph = train_graphs[int(rng.integers(len(train_graphs)))]
            rng_state = rng.bit_generator.state
            try:
                with held.released():
                    states, actions, rewards, batches = _episode(graph, q, cfg, rng, eps, warm)
            except KeyboardInterrupt:  # keep every finished episode, then stop
                rng.bit_generator.state = rng_state  # as before the unfinished episode
                save_checkpoint(checkpoint, cfg, q, best_q, best_ratio, episode, eps,
                                 time.perf_counter() - t0, rng)
                raise
            _update(q, states, actions, rewards, cfg)
            episode += 1
            log.debug("episode %d: %d batches", episode, batches)
            row = {"episode": episode, "train/epsilon": eps,
                   "train/episode_return": sum(rewards), "train/num_batches": batches,
                   "train/num_states": len(q)}
            eps = max(cfg.eps_min, eps * cfg.eps_decay)
            if episode % cfg.eval_every == 0 or episode == cfg.max_episodes:
                ratio, _, _ = evaluate_policy(_to_policy(q, cfg, names, meta), val)
                row["eval/ratio_to_lb"] = ratio
                row["eval/fallback_ratio_to_lb"] = fallback_ratio
                if ratio < best_ratio:
                    best_ratio, best_q = ratio, {s: dict(qs) for s, qs in q.items()}
                row["eval/best_ratio_to_lb"] = best_ratio
                save_checkpoint(checkpoint, cfg, q, best_q, best_ratio, episode, eps,
                                 time.perf_counter() - t0, rng)
            history.append(row)
            if callback is not None:
                callback(row)
            bar.update(1)
        if held.caught:  # Ctrl-C during the last episode's bookkeeping
            save_checkpoint(checkpoint, cfg, q, best_q, best_ratio, episode, eps,
                             time.perf_counter() - t0, rng)
            raise KeyboardInterrupt
    finally:
        held.close()
        bar.close()
    if cfg.guard:
        policy, best_ratio = _guarded(q, cfg, train_graphs, val, names, meta, episode)
    else:
        if not best_q:
            meta["learned_nothing"] = _why_empty(cfg, episode)
        policy = _to_policy(best_q, cfg, names, meta)
    seconds = time.perf_counter() - t0
    policy.metadata.update(episodes=episode, best_ratio=best_ratio, train_seconds=seconds)
    return TrainResult(policy, best_ratio, episode, seconds, history)


def _resolve_fallback(cfg: QLearningConfig, train: Sequence[Graph], val: Sequence[Graph]
                      ) -> QLearningConfig:
    """``fallback="auto"``: the best heuristic on the validation graphs, or with the guard
    on the training and validation graphs together (the best single heuristic it starts from)."""
    if cfg.fallback != "auto":
        return cfg
    if cfg.guard:
        cfg = replace(cfg, fallback=pick_fallback([*train, *val], cfg.encoding, AUTO_FALLBACKS))
        log.info("fallback chosen on the training and validation graphs: %s", cfg.fallback)
        return cfg
    cfg = replace(cfg, fallback=select_fallback(val, cfg.encoding))
    log.info("fallback chosen on the validation graphs: %s", cfg.fallback)
    return cfg


def _why_empty(cfg: QLearningConfig, episodes: int) -> str:
    """One phrase: why the unguarded learner's best snapshot is the empty table."""
    if not episodes:
        return (f"the fallback ({cfg.fallback}) alone met early_stop_ratio "
                f"{cfg.early_stop_ratio} on validation before the first episode")
    if cfg.fallback_snapshot:
        return (f"no snapshot of the Q-table beat its fallback ({cfg.fallback}) on the "
                f"validation graphs, so the table was dropped")
    return "the best snapshot is the empty table"


def _guarded(q: QTable, cfg: QLearningConfig, train: Sequence[Graph], val: Sequence[Graph],
             names: tuple[str, ...], meta: dict[str, Any], episodes: int
             ) -> tuple[FSMPolicy, float]:
    """The residual FSM: the fallback plus the Q-table's disagreements that pay."""
    if cfg.guard_check:  # held-out check graphs resampled from the training instances
        val = [*val, *resample_graphs(train, cfg.guard_check,
                                      np.random.default_rng(cfg.seed + 1))]
    choices = fallback_choices(train, cfg.encoding, cfg.fallback)
    proposals = q_proposals(q, choices, margin=cfg.guard_margin)
    table, report = guard_table(proposals, train, val, cfg.encoding, cfg.fallback,
                                max_evals=cfg.guard_max_evals, lookahead=cfg.lookahead)
    meta.update(guard=report.as_meta(), q_states=len(q))
    reason = report.reason()
    if reason is not None:
        early = not episodes and report.train_fallback > report.train_lb
        meta["learned_nothing"] = (
            f"training stopped before the first episode: the fallback ({cfg.fallback}) alone "
            f"met early_stop_ratio {cfg.early_stop_ratio} on validation" if early
            else reason)
    log.info("guard: kept %d of %d proposals (%d scored, %d dropped under the lookahead): "
             "training batches %d -> %d, validation %d -> %d", report.kept, report.proposals,
             report.evaluations, report.dropped_by_lookahead, report.train_fallback,
             report.train_table, report.val_fallback, report.val_table)
    policy = FSMPolicy(table, cfg.encoding, names, cfg.fallback, meta, cfg.lookahead)
    return policy, report.val_table / max(report.val_lb, 1)


class QLearningTrainer:
    """Config-friendly wrapper: ``QLearningTrainer(**hparams).fit(train, val, ...)``.

    Every trainer of :mod:`policies` has this shape, so the training entry point can call
    any of them the same way.
    """

    name = "q_learning"

    def __init__(self, **hparams: Any) -> None:
        self.config = QLearningConfig(**hparams)

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: str | Path | None = None,
            callback: Callable[[dict[str, float]], None] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None) -> TrainResult:
        """Train on ``train_graphs``, select on ``val_graphs``."""
        result = train_q_table(train_graphs, self.config, val_graphs=val_graphs,
                               checkpoint=checkpoint, callback=callback, progress=progress,
                               metadata=metadata)
        if result.history:  # the deployed FSM's validation ratio ends the learning curve
            result.history[-1]["eval/fsm_ratio_to_lb"] = result.best_ratio
        return result
