"""DAgger for the priority policy: imitate a rollout teacher on the states the student visits.

Issue 31 asks for imitation of the rollout / search teacher with a learner that sees the
frontier. The student is the priority policy itself (:mod:`policies.priority`: the linear
score over the compiled features plus, with ``nh`` hidden units, a ReLU MLP), so whatever
is learned runs inside the compiled core at the same cost per decision. Each round
(Ross, Gordon and Bagnell 2011):

1. **Roll out the student** on the training graphs (the compiled core).
2. **Label its states by the teacher**: at every decision with two or more ready types, every
   ready type ``b`` is tried and the schedule completed by the teacher's *base* policies
   (:func:`edbatch.schedule._compiled_priority_q.priority_q_base`): ``critical_path`` (the
   one-step rollout over critical path, the rollout lookahead's first level), ``student``
   (the current student: policy iteration's improved policy) or both (the better value of
   the two, a fortified teacher). The teacher's choices are the types of fewest batches;
   decisions where every type ties carry no label.
3. **Aggregate** the labelled decisions of every round and **fit** the scorer by
   cross-entropy: per decision, minus the log of the softmax mass the scores put on the
   teacher's choices (a classification loss, not the regret the policy-iteration stage of
   :mod:`policies.priority_api` minimises), Adam, features scaled to O(1), an L2 pull to the
   start.
4. The fit's snapshots (after ``steps`` optimiser steps, ``l2`` strengths) and the points
   ``alphas`` of the way to them from the start are the round's candidates; the one with
   the fewest training batches is the next student. The deployed weights are the best
   student of all rounds (fewest training batches; the caller guards them on validation).

Deterministic for a seed (torch on one thread, a seeded hidden-layer start).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, critical_path_weights
from edbatch.schedule._compiled_priority_q import priority_q_base
from policies.priority import population_batches
from policies.priority_api import (
    _scores,
    adam_path,
    best_w_scaled,
    segment_exp,
    stack_rounds,
    unscale,
)

__all__ = ["TEACHERS", "WEIGHTINGS", "DaggerRound", "dagger", "label", "choice_loss"]

#: Teacher names -> which base policies complete the rollouts.
TEACHERS = ("critical_path", "student", "both")
#: Per-decision weights of the loss: ``uniform`` (1) or ``spread`` (the decision's most
#: minus fewest batches over its types: cost-sensitive classification).
WEIGHTINGS = ("uniform", "spread")


@dataclass
class DaggerRound:
    """One round's record."""

    student: int        # training batches of the student the round rolled out
    labelled: int       # contested decisions labelled this round
    aggregated: int     # labelled decisions of all rounds so far
    agree: float        # share of this round's labelled decisions the student already got
    best_candidate: int  # training batches of the round's best fitted candidate
    seconds: float


def label(inputs: Sequence[tuple], w: NDArray[np.float64], nh: int,  # type: ignore[type-arg]
          teacher: str) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_],
                                 NDArray[np.float64], int, int]:
    """The teacher's labels on the states ``w`` visits (its graphs' :func:`graph_inputs`).

    Returns ``(rows, seg, target, spread, batches, agree)``: the feature rows of the ready
    types of every contested decision (decision index ``seg``, numbered across graphs),
    which rows are the teacher's choices (fewest batches), each decision's spread (most
    minus fewest batches of its types), ``w``'s own training batches and the number of
    decisions where ``w``'s choice is among the teacher's.
    """
    if teacher not in TEACHERS:
        raise ValueError(f"teacher must be one of {TEACHERS}, got {teacher!r}")
    w = np.ascontiguousarray(w, dtype=np.float64)
    cp = critical_path_weights(0)
    bases = {"critical_path": [(cp, 0)], "student": [(w, nh)],
             "both": [(cp, 0), (w, nh)]}[teacher]
    xs, segs, tgs, spread, total, nseg, agree = [], [], [], [], 0, 0, 0
    for g in inputs:
        cap = len(g[0]) * 8 + 64
        q = None
        for wb, nb in bases:
            rows, _, ptr, qb, base = priority_q_base(*g, w, nh, wb, nb, cap)  # type: ignore[call-arg]
            q = qb if q is None else np.minimum(q, qb)
        total += int(base)
        s = _scores(torch.from_numpy(rows), torch.from_numpy(w), nh).numpy()
        for t in range(len(ptr) - 1):
            lo, hi = int(ptr[t]), int(ptr[t + 1])
            if hi - lo < 2:
                continue
            qt = q[lo:hi]
            if qt.min() == qt.max():
                continue
            best = qt == qt.min()
            agree += int(best[int(np.argmax(s[lo:hi]))])
            xs.append(rows[lo:hi])
            segs.append(np.full(hi - lo, nseg, np.int64))
            tgs.append(best)
            spread.append(float(qt.max() - qt.min()))
            nseg += 1
    if not xs:
        return (np.zeros((0, NUM_PRIORITY_FEATURES)), np.zeros(0, np.int64),
                np.zeros(0, np.bool_), np.zeros(0), total, 0)
    return (np.concatenate(xs), np.concatenate(segs), np.concatenate(tgs), np.array(spread),
            total, agree)


def choice_loss(x: torch.Tensor, seg: torch.Tensor, target: torch.Tensor, w: torch.Tensor,
                nh: int, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over decisions of ``-log`` (softmax mass of the scores on the teacher's choices),
    weighted per decision by ``weight`` (default 1; the weighted mean)."""
    e, z = segment_exp(_scores(x, w, nh), seg)
    zt = torch.zeros(len(z), dtype=e.dtype).index_add(0, seg, e * target)
    nll = torch.log(z) - torch.log(zt)
    if weight is None:
        return nll.mean()
    return (nll * weight).sum() / weight.sum()


def _fit(x: NDArray[np.float64], seg: NDArray[np.int64], target: NDArray[np.bool_],
         weight: NDArray[np.float64] | None, start: NDArray[np.float64], nh: int,
         steps: Sequence[int], l2: float, lr: float,
         active: NDArray[np.bool_]) -> list[NDArray[np.float64]]:
    """Adam on :func:`choice_loss` + ``l2 |w - start|^2`` (scaled features; the parameters
    not ``active`` keep their start values); the weights (unscaled) after each of ``steps``
    optimiser steps."""
    scale = np.maximum(np.abs(x).max(axis=0), 1e-9)
    xt = torch.from_numpy(x / scale)
    st, tt = torch.from_numpy(seg), torch.from_numpy(target.astype(np.float64))
    wt = None if weight is None else torch.from_numpy(weight)
    w0 = torch.from_numpy(best_w_scaled(start, scale, nh))
    frozen = torch.from_numpy(~np.asarray(active, dtype=np.bool_))
    return [unscale(w, scale, nh) for w in adam_path(
        lambda w: choice_loss(xt, st, tt, w, nh, wt), w0, steps, l2, lr, frozen)]


def _start(w: NDArray[np.float64], nh: int, seed: int,
           active: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``w`` with its hidden layer (if any) given small seeded random input weights where
    they are all 0 (an all-zero hidden layer gets no gradient; inactive ones stay 0); the
    same scores as ``w`` while the output weights are 0."""
    out = np.array(w, dtype=np.float64)
    f = NUM_PRIORITY_FEATURES
    hid = slice(f, f + nh * (f + 1))
    if nh and not np.any(out[hid]):
        rng = np.random.default_rng(seed)
        out[hid] = np.where(active[hid], rng.normal(0.0, 0.3, nh * (f + 1)), 0.0)
    return out


def dagger(inputs: Sequence[tuple], w: NDArray[np.float64], nh: int, rounds: int, *,  # type: ignore[type-arg]
           teacher: str = "critical_path", steps: Sequence[int] = (5, 15, 50, 150, 500, 1500),
           l2s: Sequence[float] = (1e-2, 1e-3), lr: float = 0.01,
           alphas: Sequence[float] = (0.25, 0.5, 1.0), seed: int = 0,
           weighting: str = "uniform", active: NDArray[np.bool_] | None = None,
           progress: bool = False,
           ) -> tuple[NDArray[np.float64], int, list[DaggerRound]]:
    """``rounds`` DAgger rounds from the student ``w`` (see the module doc) on the graphs
    ``inputs``; ``(best weights, their training batches, one record per round)``, never
    more training batches than ``w``. ``active``: the parameters it may change (default
    all; the others keep ``w``'s values)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    torch.manual_seed(seed)
    act = np.ones(len(w), np.bool_) if active is None else np.asarray(active, np.bool_)
    student = _start(w, nh, seed, act)
    best_w = np.ascontiguousarray(w, dtype=np.float64)
    best = int(population_batches(inputs, best_w[None], nh)[0].sum())
    data: list[tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_],
                     NDArray[np.float64]]] = []
    history: list[DaggerRound] = []
    for r in range(rounds):
        t0 = time.perf_counter()
        x, seg, tg, spread, batches, agree = label(inputs, student, nh, teacher)
        n_new = int(seg.max()) + 1 if len(seg) else 0
        if n_new:
            data.append((x, seg, tg, spread))
        if not data:
            break
        (xa, sa, ta, pa), off = stack_rounds(data)
        wa = None if weighting == "uniform" else pa
        cands = []
        w_start = _start(w, nh, seed, act)
        for l2 in l2s:
            cands += [w_start + a * (c - w_start)
                      for c in _fit(xa, sa, ta, wa, w_start, nh, steps, l2, lr, act)
                      for a in alphas]
        ws = np.vstack(cands)
        scores = population_batches(inputs, ws, nh).sum(axis=1)
        i = int(np.argmin(scores))
        student = np.ascontiguousarray(ws[i])
        if scores[i] < best:
            best, best_w = int(scores[i]), student.copy()
        history.append(DaggerRound(batches, n_new, off, agree / max(n_new, 1), int(scores[i]),
                                   round(time.perf_counter() - t0, 2)))
        if progress:
            print(f"DAgger round {r + 1}/{rounds}: student {batches} batches, {n_new} "
                  f"labelled ({agree / max(n_new, 1):.2f} agree), {off} aggregated, best "
                  f"candidate {int(scores[i])}, best so far {best}", flush=True)
    return best_w, best, history
