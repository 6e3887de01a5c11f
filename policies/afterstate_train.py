"""Training the afterstate priority policy by the cross-entropy method on the batch count.

The same search as :mod:`policies.priority_train` (a Gaussian over the weights, its mean
starting at critical path's, the ``elite`` best of each ``population`` refit it, a noise
floor), over the priority features' weights *and* the afterstate features' of
:mod:`policies.afterstate`; each candidate is scored by the batches the compiled scheduler
needs on the training graphs. With ``imitate`` the search starts from the weights fitted to
the critical-path rollout teacher (:mod:`policies.afterstate_imitate`) instead of critical
path's (``iterations=0``: the imitation alone). Guarded like the priority trainer: the best weights
are kept only if they beat critical path on the training graphs and do not lose on the
validation graphs, else the artifact is critical path (``learned: false``) and says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from policies.afterstate import (
    AFTER_FEATURES,
    AfterstatePolicy,
    after_mask,
    afterstate_inputs,
    afterstate_start,
    population_afterstate,
)
from policies.afterstate_api import BASES, api_rounds
from policies.afterstate_imitate import IMITATE_STEPS, lean_mask
from policies.afterstate_imitate import imitate as imitate_teacher
from policies.afterstate_values import fit_values
from policies.priority import FEATURES
from policies.priority_train import cem_generation, searched

__all__ = ["IMITATE_TARGETS", "AfterstateResult", "AfterstateTrainer"]

#: What the fit to the rollout teacher fits (``imitate_target``): its rollout values or its
#: choices.
IMITATE_TARGETS = ("values", "choices")


@dataclass
class AfterstateResult:
    """What :meth:`AfterstateTrainer.fit` returns (the fields of
    :class:`~policies.priority_train.PriorityResult`)."""

    policy: AfterstatePolicy
    best_ratio: float          # validation batches / LB of the deployed policy
    episodes: int              # schedules run (candidates x training graphs)
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


class AfterstateTrainer:
    """CEM over the afterstate policy's weights (module doc).

    Args:
        iterations, population, elite, sigma, sigma_floor, seed: the CEM's, as
            :class:`~policies.priority_train.PriorityTrainer`'s.
        far: also search feature ``far``'s weight (else held at 0).
        context: also search the context features' weights (else held at 0).
        imitate: start from the imitation of the critical-path rollout teacher (module doc;
            it fits every weight, ``far`` and the context ones included); ``imitate_steps``:
            its candidates' Adam step counts; ``imitate_priority_features``: the
            imitation fits only the first that many priority features (``15``: the cheap
            variant, :func:`policies.afterstate_imitate.lean_mask`; ``None``: all).
        imitate_rounds: approximate policy-iteration rounds after the imitation
            (:mod:`policies.afterstate_api`: the student's states labelled by the rollout
            over ``imitate_base``, ``student`` or ``both``; ``imitate_aggregate``: fit every
            round's labels so far, the critical-path teacher's included; ``imitate_warm``:
            fit from the current student). 0: none.
        imitate_target: what the imitation fits: ``"choices"`` (the teacher's choices,
            cross-entropy) or ``"values"`` (the rollout values regressed,
            :mod:`policies.afterstate_values`; no policy-iteration rounds).
    """

    name = "afterstate"

    def __init__(self, iterations: int = 30, population: int = 32, elite: int = 6,
                 sigma: float = 0.5, sigma_floor: float = 0.05, seed: int = 0,
                 far: bool = False, context: bool = True, imitate: bool = False,
                 imitate_steps: Sequence[int] = IMITATE_STEPS,
                 imitate_priority_features: int | None = None,
                 extra_features: Sequence[str] = (), imitate_rounds: int = 0,
                 imitate_base: str = "student", imitate_aggregate: bool = False,
                 imitate_warm: bool = False, imitate_target: str = "choices") -> None:
        if population < 2 or not 1 <= elite <= population or iterations < 0:
            raise ValueError(f"need population >= 2, 1 <= elite <= population and "
                             f"iterations >= 0; got population={population}, elite={elite}, "
                             f"iterations={iterations}")
        self.iterations, self.population, self.elite = iterations, population, elite
        self.sigma, self.sigma_floor, self.seed = sigma, sigma_floor, seed
        self.far, self.context, self.imitate = bool(far), bool(context), bool(imitate)
        self.imitate_steps = tuple(imitate_steps)
        self.imitate_priority_features = imitate_priority_features
        after_mask(extra_features)  # a bad name fails here
        self.extra_features = tuple(extra_features)
        if imitate_rounds < 0 or imitate_base not in BASES:
            raise ValueError(f"need imitate_rounds >= 0 and imitate_base in {list(BASES)}; "
                             f"got {imitate_rounds!r}, {imitate_base!r}")
        self.imitate_rounds, self.imitate_base = int(imitate_rounds), imitate_base
        self.imitate_aggregate, self.imitate_warm = bool(imitate_aggregate), bool(imitate_warm)
        if imitate_target not in IMITATE_TARGETS or (
                imitate_target == "values" and imitate_rounds):
            raise ValueError(f"need imitate_target in {list(IMITATE_TARGETS)} ('values' "
                             f"without imitate_rounds); got {imitate_target!r}, "
                             f"imitate_rounds={imitate_rounds!r}")
        self.imitate_target = imitate_target

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: Any = None, progress: bool = False,
            callback: Callable[[dict[str, float]], None] | None = None,
            metadata: dict[str, Any] | None = None) -> AfterstateResult:
        """Search the weights on ``train_graphs``; guard on both sets (see module doc)."""
        t0 = time.perf_counter()
        train = [afterstate_inputs(g) for g in train_graphs]
        val = [afterstate_inputs(g) for g in val_graphs] or train
        lb_train = max(sum(lower_bound(g) for g in train_graphs), 1)
        lb_val = max(sum(lower_bound(g) for g in val_graphs), 1) if val_graphs else lb_train
        rng = np.random.default_rng(self.seed)
        w0 = afterstate_start()
        active = np.concatenate([searched(0, self.far, self.context),
                                 after_mask(self.extra_features)])
        base = int(population_afterstate(train, w0[None]).sum())
        best_w, best, imitation = w0.copy(), base, None
        if self.imitate and self.imitate_target == "values":
            wi, bi, imitation = fit_values(
                train, lean_mask(self.imitate_priority_features, self.extra_features))
        elif self.imitate:
            first: list[tuple] = []  # type: ignore[type-arg]
            wi, bi, imitation = imitate_teacher(train_graphs, self.imitate_steps,
                                                priority_features=self.imitate_priority_features,
                                                extra=self.extra_features, labels=first)
            if self.imitate_rounds:
                wi, bi, imitation["api_rounds"] = api_rounds(
                    train, wi, bi, self.imitate_rounds,
                    lean_mask(self.imitate_priority_features, self.extra_features),
                    self.imitate_steps, base=self.imitate_base,
                    aggregate=self.imitate_aggregate, first=first[0], warm=self.imitate_warm,
                    progress=progress)
        if imitation is not None and bi < best:
            best_w, best = wi, bi
            active = lean_mask(self.imitate_priority_features,  # the weights the fit set
                               self.extra_features)
        mean, std = best_w.copy(), np.where(active, self.sigma, 0.0)
        history: list[dict[str, float]] = []
        episodes = len(train)
        for it in range(self.iterations):
            ws, scores, order, mean, std = cem_generation(
                rng, mean, std, active, self.population, self.elite, self.sigma_floor,
                lambda ws: population_afterstate(train, ws).sum(axis=1))
            episodes += len(ws) * len(train)
            if scores[order[0]] < best:
                best, best_w = int(scores[order[0]]), ws[order[0]].copy()
            row = {"episode": float(it + 1), "train/best_ratio_to_lb": best / lb_train,
                   "train/mean_ratio_to_lb": float(scores[0]) / lb_train,
                   "train/fallback_ratio_to_lb": base / lb_train}
            history.append(row)
            if callback is not None:
                callback(row)
            if progress:
                print(f"afterstate CEM {it + 1}/{self.iterations}: best {best} batches "
                      f"({best / lb_train:.4f} x LB), critical path {base}")
        val_new, val_base = population_afterstate(val, np.vstack([best_w, w0])).sum(
            axis=1).tolist()
        learned = best < base and val_new <= val_base
        meta = dict(metadata or {})
        fitted = "value fit" if self.imitate_target == "values" else "imitation"
        meta.update({"learner": (f"{fitted}, then " if self.imitate else "")
                     + "cross-entropy method", "lookahead": "one step (afterstate)",
                     "iterations": self.iterations, "population": self.population,
                     "elite": self.elite, "seed": self.seed, "far": self.far,
                     "context": self.context, "train_batches": best,
                     "train_fallback_batches": base, "val_batches": val_new,
                     "val_fallback_batches": val_base, "num_train_graphs": len(train),
                     "num_val_graphs": len(val_graphs), "features": list(FEATURES),
                     "after_features": list(AFTER_FEATURES),
                     "extra_features": list(self.extra_features),
                     "train_seconds": round(time.perf_counter() - t0, 3)})
        if imitation is not None:
            meta["imitation"] = imitation
        if not learned:
            meta["learned_nothing"] = (
                "no weights beat critical path on the training graphs" if best >= base else
                f"the best weights ({best} vs {base} training batches) lost on validation "
                f"({val_new} vs {val_base}); kept critical path")
        policy = AfterstatePolicy(best_w if learned else w0, learned=learned, metadata=meta)
        ratio = (val_new if learned else val_base) / lb_val
        return AfterstateResult(policy, float(ratio), episodes, time.perf_counter() - t0,
                              history)
