"""Training the priority policy by direct policy search on the batch-count reward.

The learner is the **cross-entropy method** (CEM; Rubinstein 1999, as Szita and Lőrincz
2006 use it for Tetris' linear evaluation weights): a Gaussian over the weight vector ``w``
of :class:`~policies.priority.PriorityPolicy`, its mean starting at critical path's weights
(so the search *starts from the best single heuristic*); each iteration samples
``population`` weight vectors, scores every one by the batches the compiled scheduler needs
on the training graphs (the episode return is minus the batch count: one deterministic
episode per graph), and refits the mean and per-weight spread to the ``elite`` best, with a
noise floor so the search does not collapse early. It is policy search, not value learning:
no gradient and no table, just the policy's own return.

Guard (as :mod:`policies.guard` does for tables): the best weights found are kept only if
they need fewer batches than critical path on the training graphs and no more on the
validation graphs; otherwise the artifact is critical path (``learned: false``) and says why.
Deterministic: the same seed and graphs give the same weights.

**Never worse than the best single heuristic** (``best_heuristic=True``, the default of
``conf/trainer/priority.yaml``, so of ``experiments.train``): critical path is where the search
starts, but on some workloads another heuristic (e.g. type-wise greedy on the character
tagger) needs fewer batches than anything the weights found. Then the trainer deploys that
heuristic alone (an empty FSM table with it as fallback) and says why in ``learned_nothing``.
Off by default in Python, where the benchmarks and the distillation study the weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.executor.cells_module_net_segment import CODES
from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from edbatch.schedule._compiled_priority_steps import run_priority_costs
from policies.fsm import FSMPolicy
from policies.guard import fewest_batches
from policies.priority import (
    FEATURES,
    PriorityPolicy,
    critical_path_weights,
    graph_inputs,
    num_params,
    population_batches,
)
from policies.priority_api import improve
from policies.priority_dagger import TEACHERS, WEIGHTINGS, dagger
from policies.q_learning import AUTO_FALLBACKS
from policies.table_search import table_batches

__all__ = ["PriorityResult", "PriorityTrainer", "cem_generation", "prune_hidden", "searched",
           "segment_types"]


def segment_types(graph: Graph) -> np.ndarray:  # type: ignore[type-arg]
    """Per op type of ``graph``'s vocabulary: whether the CPU executor runs a run of
    consecutive batches of such types as one program step (module_net's attention kinds,
    :data:`edbatch.executor.cells_module_net_segment.CODES`; all false elsewhere)."""
    return np.array([op.kind in CODES for op in graph.vocab], dtype=np.bool_)


def _costs(inputs: Sequence[tuple], segs: Sequence[np.ndarray],  # type: ignore[type-arg]
           ws: np.ndarray, nh: int, lam: float) -> np.ndarray:  # type: ignore[type-arg]
    """Per row of ``ws``: the batches summed over the graphs (``lam`` 0, integers) or
    ``batches + lam * program steps`` (:mod:`edbatch.schedule._compiled_priority_steps`)."""
    if not lam:
        return population_batches(inputs, ws, nh).sum(axis=1)
    ws = np.ascontiguousarray(ws, dtype=np.float64)
    return np.sum([run_priority_costs(*g, ws, nh, seg, float(lam))  # type: ignore[call-arg]
                   for g, seg in zip(inputs, segs, strict=True)], axis=0)


def searched(nh: int, far: bool, context: bool = False, release: bool = True
             ) -> np.ndarray:  # type: ignore[type-arg]
    """Which of the :func:`~policies.priority.num_params` parameters the trainer searches:
    all, or all but the weights (in the linear part and in each hidden unit) of feature
    ``far`` (``far=False``), of the context features (``context=False``) and of the release
    features ``rel_log`` .. ``lead`` (``release=False``: held at 0, so the compiled loop
    skips the release sums' upkeep, :func:`~edbatch.schedule._compiled_priority._uses_release`)."""
    active = np.ones(num_params(nh), np.bool_)
    f = len(FEATURES)
    off = ([FEATURES.index("far")] if not far else []) + (
        [] if context else list(range(FEATURES.index("is_cp"), f))) + (
        [] if release else list(range(FEATURES.index("rel_log"), FEATURES.index("lead") + 1)))
    for j in off:
        active[j] = False
        active[[f + u * (f + 1) + j for u in range(nh)]] = False
    return active


def cem_generation(rng: np.random.Generator, mean: NDArray[Any], std: NDArray[Any],
                   active: NDArray[np.bool_], population: int, elite: int, sigma_floor: float,
                   score: Callable[[NDArray[Any]], NDArray[Any]]) -> tuple[NDArray[Any], ...]:
    """One generation of the cross-entropy method: ``mean`` and ``population`` Gaussian
    samples around it (only the ``active`` coordinates vary), scored by ``score`` (lower is
    better); ``(ws, scores, order, mean, std)``, the last two refitted to the ``elite`` best
    (``std`` at least ``sigma_floor`` where active, 0 elsewhere)."""
    noise = np.zeros((population, len(mean)))
    noise[:, active] = rng.standard_normal((population, int(active.sum())))
    ws = np.vstack([mean, mean + std * noise])
    scores = score(ws)
    order = np.argsort(scores, kind="stable")
    best = ws[order[:elite]]
    return (ws, scores, order, best.mean(axis=0),
            np.where(active, np.maximum(best.std(axis=0), sigma_floor), 0.0))


def prune_hidden(w: np.ndarray, nh: int) -> tuple[np.ndarray, int]:  # type: ignore[type-arg]
    """``(w, nh)`` without the hidden units whose output weight is 0: the same scores, bit for
    bit (such a unit adds ``0 * z``), and no per-decision cost for them; all of them gone
    (the CEM's linear weights kept over an untouched MLP), a linear scorer (``nh`` 0)."""
    f = len(FEATURES)
    out = w[f + nh * (f + 1):]
    keep = [j for j in range(nh) if out[j] != 0.0]
    units = [w[f + j * (f + 1):f + (j + 1) * (f + 1)] for j in keep]
    return np.concatenate([w[:f], *units, out[keep]]), len(keep)


@dataclass
class PriorityResult:
    """What :meth:`PriorityTrainer.fit` returns (``experiments.train`` reads it)."""

    policy: PriorityPolicy
    best_ratio: float          # validation batches / LB of the deployed policy
    episodes: int              # schedules run (candidates x training graphs)
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


class PriorityTrainer:
    """Cross-entropy-method search over the priority policy's weights (see module doc).

    Args:
        iterations: CEM iterations.
        population: weight vectors sampled per iteration (the mean is always re-scored too).
        elite: best vectors the Gaussian is refitted to.
        sigma: initial spread of every weight (features are O(1); the height gap is an
            integer, so 0.5 lets a feature outweigh one level of height).
        sigma_floor: the least spread after a refit (extra noise).
        seed: the sampling seed.
        hidden_units: hidden units of the scorer (0: linear; else a one-hidden-layer MLP added
            to the linear score, its output weights starting at 0, so the start is still
            critical path).
        api_rounds: rounds of rollout-based policy iteration after the CEM, from its best
            weights (:mod:`policies.priority_api`; 0: none).
        far: also search the weights of feature ``far`` (the log gap; ``False``: they stay
            0, and the search draws exactly what it drew before that feature existed).
        dagger_rounds: rounds of DAgger imitation of a rollout teacher
            (:mod:`policies.priority_dagger`; 0: none), after the CEM (from its best
            weights; the CEM then searches the linear weights only, DAgger fits the hidden
            units as a residual) or, with ``dagger_first``, before it (the CEM then starts
            from the DAgger student).
        dagger_teacher: the DAgger teacher's rollout base (``critical_path``, ``student``,
            ``both``).
        weighting: the DAgger loss's per-decision weights (``uniform``, ``spread``).
        dagger_first: run DAgger from critical path before the CEM.
        context: also search / fit the context features' weights
            (:mod:`edbatch.schedule._compiled_priority_ctx`; ``False``: they stay 0).
        step_weight: ``lam`` of the cost ``batches + lam * program steps`` the CEM and the
            guard minimise (a run of consecutive segment-type batches is one step,
            :func:`segment_types`; 0: the batch count alone). Not with DAgger or API rounds
            (their teachers count batches).
        release: also search the release features' weights (``rel_log`` .. ``lead``;
            ``False``: held at 0, a cheaper run-time loop: no release sums kept). Not with
            hidden units (an MLP reads every feature) or ``context`` (it reads them).
    """

    name = "priority"

    def __init__(self, iterations: int = 30, population: int = 32, elite: int = 6,
                 sigma: float = 0.5, sigma_floor: float = 0.05, seed: int = 0,
                 hidden_units: int = 0, api_rounds: int = 0, far: bool = False,
                 dagger_rounds: int = 0, dagger_teacher: str = "critical_path",
                 weighting: str = "uniform", dagger_first: bool = False,
                 context: bool = False, step_weight: float = 0.0,
                 release: bool = True, best_heuristic: bool = False) -> None:
        hidden = hidden_units
        self.best_heuristic = bool(best_heuristic)
        if not release and (hidden_units or context):
            raise ValueError(f"release=False needs a linear scorer without context features "
                             f"(they read the release sums); got hidden_units={hidden_units}, "
                             f"context={context}")
        self.release = bool(release)
        if not step_weight >= 0.0 or (step_weight and (dagger_rounds or api_rounds)):
            raise ValueError(f"need step_weight >= 0, and 0 with dagger_rounds or api_rounds "
                             f"(they count batches); got step_weight={step_weight!r}, "
                             f"dagger_rounds={dagger_rounds}, api_rounds={api_rounds}")
        self.step_weight = float(step_weight)
        if dagger_rounds < 0 or dagger_teacher not in TEACHERS or weighting not in WEIGHTINGS:
            raise ValueError(f"need dagger_rounds >= 0, dagger_teacher in {TEACHERS} and weighting "
                             f"in {WEIGHTINGS}; got dagger_rounds={dagger_rounds}, "
                             f"dagger_teacher={dagger_teacher!r}, weighting={weighting!r}")
        self.dagger_rounds, self.teacher = int(dagger_rounds), dagger_teacher
        self.weighting, self.dagger_first = weighting, bool(dagger_first)
        if population < 2 or not 1 <= elite <= population or iterations < 0 or hidden < 0 \
                or api_rounds < 0:
            raise ValueError(f"need population >= 2, 1 <= elite <= population, iterations "
                             f">= 0, hidden >= 0 and api_rounds >= 0; got "
                             f"population={population}, elite={elite}, "
                             f"iterations={iterations}, hidden_units={hidden}, "
                             f"api_rounds={api_rounds}")
        self.api_rounds, self.far, self.context = int(api_rounds), bool(far), bool(context)
        self.hidden = int(hidden)
        self.iterations, self.population, self.elite = iterations, population, elite
        self.sigma, self.sigma_floor, self.seed = sigma, sigma_floor, seed

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: Any = None, progress: bool = False,
            callback: Callable[[dict[str, float]], None] | None = None,
            metadata: dict[str, Any] | None = None) -> PriorityResult:
        """Search the weights on ``train_graphs``; guard on both sets (see module doc)."""
        t0 = time.perf_counter()
        train = [graph_inputs(g) for g in train_graphs]
        val = [graph_inputs(g) for g in val_graphs] or train
        lb_train = max(sum(lower_bound(g) for g in train_graphs), 1)
        lb_val = max(sum(lower_bound(g) for g in val_graphs), 1) if val_graphs else lb_train
        rng = np.random.default_rng(self.seed)
        nh, lam = self.hidden, self.step_weight
        tsegs = [segment_types(g) for g in train_graphs]
        vsegs = [segment_types(g) for g in val_graphs] or tsegs
        w0 = critical_path_weights(nh)
        base = _costs(train, tsegs, w0[None], nh, lam)[0].item()
        val_base0 = _costs(val, vsegs, w0[None], nh, lam)[0].item()
        active = searched(nh, self.far, self.context, self.release)
        unit = f"batches + {lam:g} x steps" if lam else "batches"
        if self.dagger_rounds and not self.dagger_first:  # DAgger learns the hidden layer
            active[len(FEATURES):] = False
        mean, std = w0.copy(), np.where(active, self.sigma, 0.0)
        best_w, best = w0.copy(), base
        dag: list[dict[str, float]] = []
        if self.dagger_rounds and self.dagger_first:
            best_w, best, dag = self._dagger(train, w0, progress)
            mean = best_w.copy()
        history: list[dict[str, float]] = []
        episodes = len(train)
        for it in range(self.iterations):
            ws, scores, order, mean, std = cem_generation(
                rng, mean, std, active, self.population, self.elite, self.sigma_floor,
                lambda ws: _costs(train, tsegs, ws, nh, lam))
            episodes += len(ws) * len(train)
            if scores[order[0]] < best:
                best, best_w = scores[order[0]].item(), ws[order[0]].copy()
            row = {"episode": float(it + 1), "train/best_ratio_to_lb": best / lb_train,
                   "train/mean_ratio_to_lb": float(scores[0]) / lb_train,
                   "train/mean_batches": float(scores.mean()) / len(train),
                   "train/fallback_ratio_to_lb": base / lb_train}
            v_mean, v_best = _costs(val, vsegs, np.vstack([ws[0], best_w]), nh, lam)
            history.append({  # the learning curve on the validation graphs
                "episode": float(episodes), "eval/ratio_to_lb": v_mean / lb_val,
                "eval/best_ratio_to_lb": v_best / lb_val,
                "eval/fallback_ratio_to_lb": val_base0 / lb_val})
            if callback is not None:
                callback(row)
            if progress:
                print(f"priority CEM {it + 1}/{self.iterations}: best {best} {unit} "
                      f"({best / lb_train:.4f} x LB), critical path {base}")
        if self.dagger_rounds and not self.dagger_first:
            best_w, best, dag = self._dagger(train, best_w, progress)
        api: list[dict[str, int]] = []
        if self.api_rounds:
            cem_best = best
            best_w, best, rounds = improve(train, best_w, nh, self.api_rounds, seed=self.seed,
                                           active=active)
            api = [vars(r) for r in rounds]
            if progress:
                print(f"priority API: {cem_best} -> {best} training batches in {len(api)} "
                      f"rounds")
        val_new, val_base = _costs(val, vsegs, np.vstack([best_w, w0]), nh, lam).tolist()
        learned = best < base and val_new <= val_base
        meta = dict(metadata or {})
        meta.update({"learner": "cross-entropy method", "iterations": self.iterations,
                     "population": self.population, "elite": self.elite, "seed": self.seed,
                     "hidden": nh, "api_rounds": api, "far": self.far,
                     "context": self.context, "release": self.release, "step_weight": lam,
                     "objective": unit,
                     "dagger": {"rounds": dag, "teacher": self.teacher,
                                "weighting": self.weighting, "first": self.dagger_first},
                     "train_batches": best, "train_fallback_batches": base,
                     "val_batches": val_new, "val_fallback_batches": val_base,
                     "num_train_graphs": len(train_graphs),
                     "num_val_graphs": len(val_graphs), "features": list(FEATURES),
                     "train_seconds": round(time.perf_counter() - t0, 3)})
        if not learned:
            meta["learned_nothing"] = (
                "no weights beat critical path on the training graphs" if best >= base else
                f"the best weights ({best} vs {base} training batches) lost on validation "
                f"({val_new} vs {val_base}); kept critical path")
        w, meta["hidden"] = prune_hidden(best_w if learned else w0, nh)
        meta["hidden_searched"] = nh
        policy: Any = PriorityPolicy(w, hidden=meta["hidden"], learned=learned, metadata=meta)
        t_dep, v_dep = _deployed_batches(w, meta["hidden"], lam, train, val,
                                         (best, val_new) if learned else (base, val_base))
        if self.best_heuristic:  # train + val batches (val is train when no val graphs)
            policy, v_dep = _beside_best_heuristic(
                policy, train_graphs, val_graphs, t_dep + v_dep * bool(val_graphs), v_dep)
        return PriorityResult(policy, v_dep / lb_val, episodes, time.perf_counter() - t0,
                              history)

    def _dagger(self, train: list, w: np.ndarray, progress: bool  # type: ignore[type-arg]
                ) -> tuple[np.ndarray, int, list[dict[str, float]]]:  # type: ignore[type-arg]
        """DAgger from ``w`` (:func:`policies.priority_dagger.dagger`): weights, training
        batches, the rounds' records."""
        w, best, rounds = dagger(train, w, self.hidden, self.dagger_rounds,
                                 teacher=self.teacher, weighting=self.weighting,
                                 seed=self.seed,
                                 active=searched(self.hidden, self.far, self.context,
                                                 self.release),
                                 progress=progress)
        return w, best, [vars(r) for r in rounds]


def _deployed_batches(w: np.ndarray, hidden: int, lam: float, train: list,  # type: ignore[type-arg]
                      val: list, counted: tuple[int, int]) -> tuple[int, int]:  # type: ignore[type-arg]
    """The deployed weights' batches on the training and validation graphs: ``counted`` (the
    guard's own counts), or counted again where the guard weighed costs (``lam``)."""
    if not lam:
        return counted
    t, v = (int(population_batches(g, w[None], hidden)[0].sum()) for g in (train, val))
    return t, v


def _beside_best_heuristic(policy: PriorityPolicy, train_graphs: Sequence[Graph],
                           val_graphs: Sequence[Graph], mine: int, mine_val: int
                           ) -> tuple[Any, int]:
    """``policy`` (``mine`` batches on the training and validation graphs together), or the
    best single heuristic of :data:`~policies.q_learning.AUTO_FALLBACKS` alone (an empty FSM
    table) when it needs fewer batches there; with the validation batches of what is kept."""
    graphs = [*train_graphs, *val_graphs]
    name, theirs = fewest_batches(graphs, "hints", AUTO_FALLBACKS)
    if name == "critical_path":  # the search started from it: the guard already compared
        return policy, mine_val
    meta = policy.metadata
    meta["best_heuristic"] = {"name": name, "batches": theirs, "priority_batches": mine}
    if theirs >= mine:
        return policy, mine_val
    meta["learned_nothing"] = (
        f"{name}, the best single heuristic here, needs fewer batches than the searched "
        f"weights on the training and validation graphs ({theirs} vs {mine}): kept {name} "
        f"alone")
    meta["learned"] = False
    fsm = FSMPolicy({}, "hints", graphs[0].vocab.names, name, meta)
    return fsm, table_batches({}, list(val_graphs) or list(train_graphs), "hints", name)
