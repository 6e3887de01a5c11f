"""Approximate policy iteration for the priority policy: rollout values, then a ranking fit.

The cross-entropy method (:mod:`policies.priority_train`) only sees each candidate's total
batch count. This stage also asks *where* the policy loses batches: for every decision of
the current weights on the training graphs and every ready type there, the rollout value
``Q(s_t, b)`` (the schedule's batches when decision ``t`` takes ``b`` and the policy makes
the rest, :func:`edbatch.schedule._compiled_priority_q.priority_q`). On the lattice dumps
about 9-10 decisions per graph have a type better than the chosen one (mostly by one
batch, a few by 4: a type 20-70 levels below the critical one). The next weights minimise
the expected regret of a softmax over each decision's scores,
``sum_t sum_b p_t(b) (Q(s_t, b) - min_b' Q(s_t, b'))``, plus an L2 pull to the current
weights (classification-based policy iteration, Lagoudakis and Parr 2003; the states of
every round are kept, as DAgger keeps them). Each fit yields candidates (temperatures x
optimiser steps x step sizes along the fitted change), scored by their real batch counts
on the training graphs; the best replaces the current weights only if it needs fewer
batches. Deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES
from edbatch.schedule._compiled_priority_q import priority_q
from policies.priority import population_batches

__all__ = ["ApiRound", "adam_path", "decision_data", "improve", "regret_loss", "segment_exp",
           "stack_rounds"]


@dataclass
class ApiRound:
    """One round's record: training batches before and after, decisions with a spread."""

    before: int
    after: int
    decisive: int
    candidates: int


def decision_data(inputs: Sequence[tuple], w: NDArray[np.float64], nh: int  # type: ignore[type-arg]
                  ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], int]:
    """``(rows, decision index, regret, batches)`` of the decisions of ``w`` on the graphs
    (their :func:`~policies.priority.graph_inputs`) whose ready types' rollout values
    differ: every ready type's feature row, the index of its decision (0, 1, ... across
    the graphs) and its regret (its value minus the decision's best); ``batches``: the
    policy's own total."""
    xs, segs, regs, total, nseg = [], [], [], 0, 0
    for g in inputs:
        cap = len(g[0]) * 8 + 64
        rows, _, ptr, q, base = priority_q(*g, w, nh, cap)  # type: ignore[call-arg]
        total += int(base)
        for t in range(len(ptr) - 1):
            lo, hi = int(ptr[t]), int(ptr[t + 1])
            if hi - lo < 2 or q[lo:hi].min() == q[lo:hi].max():
                continue
            xs.append(rows[lo:hi])
            segs.append(np.full(hi - lo, nseg, np.int64))
            regs.append((q[lo:hi] - q[lo:hi].min()).astype(np.float64))
            nseg += 1
    if not xs:
        return (np.zeros((0, NUM_PRIORITY_FEATURES)), np.zeros(0, np.int64), np.zeros(0),
                total)
    return np.concatenate(xs), np.concatenate(segs), np.concatenate(regs), total


def _scores(x: torch.Tensor, w: torch.Tensor, nh: int) -> torch.Tensor:
    """The compiled scorer (:func:`~edbatch.schedule._compiled_priority._best`) in torch."""
    f = x.shape[1]
    s = x @ w[:f]
    if nh:
        hid = w[f:f + nh * (f + 1)].reshape(nh, f + 1)
        s = s + torch.relu(x @ hid[:, :f].T + hid[:, f]) @ w[f + nh * (f + 1):]
    return s


def regret_loss(x: torch.Tensor, seg: torch.Tensor, regret: torch.Tensor, w: torch.Tensor,
                nh: int, temperature: float) -> torch.Tensor:
    """Mean over decisions of the softmax-expected regret of the scores ``w`` gives."""
    e, z = segment_exp(_scores(x, w, nh) / temperature, seg)
    return (e / z[seg] * regret).sum() / len(z)


def segment_exp(s: torch.Tensor, seg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e, z)``: ``exp`` of the scores ``s`` less their decision's maximum (decision
    ``seg``, numbered from 0) and each decision's sum of ``e``: a softmax over each
    decision's ready types is ``e / z[seg]``."""
    nseg = int(seg.max()) + 1
    m = torch.full((nseg,), -torch.inf, dtype=s.dtype).scatter_reduce(
        0, seg, s.detach(), "amax", include_self=True)
    e = torch.exp(s - m[seg])
    return e, torch.zeros(nseg, dtype=s.dtype).index_add(0, seg, e)


def stack_rounds(data: Sequence[tuple[NDArray[Any], ...]]) -> tuple[list[NDArray[Any]], int]:
    """Every round's decision data (tuples whose second array is the decision index, from 0
    per round) as one set of arrays, the rounds' decisions numbered apart; and the number of
    decisions."""
    off, parts = 0, []
    for d in data:
        parts.append((d[0], d[1] + off, *d[2:]))
        off += int(d[1].max()) + 1
    return [np.concatenate(col) for col in zip(*parts, strict=True)], off


def _score_spread(x: NDArray[np.float64], seg: NDArray[np.int64], w: NDArray[np.float64],
                  nh: int) -> float:
    """Median over decisions of the gap between the best and the second-best score of
    ``w`` (at least 1e-3): the scale the softmax temperatures are relative to."""
    s = _scores(torch.from_numpy(x), torch.from_numpy(w), nh).numpy()
    order = np.lexsort((-s, seg))
    ss, sg = s[order], seg[order]
    first = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
    gaps = ss[first] - ss[first + 1]  # every kept decision has two or more types
    return max(float(np.median(gaps)), 1e-3)


def adam_path(loss: Callable[[torch.Tensor], torch.Tensor], w0: torch.Tensor,
              steps: Sequence[int], l2: float, lr: float,
              frozen: torch.Tensor | None = None) -> list[NDArray[np.float64]]:
    """Adam on ``loss(w) + l2 |w - w0|^2`` from ``w0`` (the entries ``frozen`` marks reset
    to ``w0`` after every step); the weights after each of ``steps`` optimiser steps."""
    w = w0.clone().requires_grad_(True)
    opt = torch.optim.Adam([w], lr=lr)
    out = []
    for i in range(1, max(steps) + 1):
        opt.zero_grad()
        total = loss(w) + l2 * ((w - w0) ** 2).sum()
        total.backward()
        opt.step()
        if frozen is not None:
            with torch.no_grad():
                w[frozen] = w0[frozen]
        if i in steps:
            out.append(w.detach().numpy().copy())
    return out


def _fit(x: NDArray[np.float64], seg: NDArray[np.int64], regret: NDArray[np.float64],
         w0: NDArray[np.float64], nh: int, temperature: float, steps: Sequence[int],
         l2: float, lr: float) -> list[NDArray[np.float64]]:
    """Adam on :func:`regret_loss` plus ``l2 |w - w0|^2`` from ``w0``; the weights after
    each of ``steps`` optimiser steps."""
    xt, st, rt = torch.from_numpy(x), torch.from_numpy(seg), torch.from_numpy(regret)
    return adam_path(lambda w: regret_loss(xt, st, rt, w, nh, temperature),
                     torch.from_numpy(w0.copy()), steps, l2, lr)


def improve(inputs: Sequence[tuple], w: NDArray[np.float64], nh: int, rounds: int, *,  # type: ignore[type-arg]
            temperatures: Sequence[float] = (0.3, 1.0, 3.0), steps: Sequence[int] = (20, 60, 150),
            alphas: Sequence[float] = (0.1, 0.25, 0.5, 1.0, 2.0), l2: float = 1e-3,
            lr: float = 0.02, seed: int = 0, active: NDArray[np.bool_] | None = None,
            ) -> tuple[NDArray[np.float64], int, list[ApiRound]]:
    """Up to ``rounds`` rounds of policy iteration from ``w`` on the graphs ``inputs`` (see
    the module doc); ``(best weights, their training batches, one record per round)``.
    Stops early when a round finds nothing better. ``active``: the parameters it may
    change (the others keep their values; default all)."""
    torch.manual_seed(seed)
    best_w = np.ascontiguousarray(w, dtype=np.float64)
    keep = np.zeros(len(best_w), np.bool_) if active is None else ~np.asarray(active)
    best = int(population_batches(inputs, best_w[None], nh)[0].sum())
    data: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = []
    history: list[ApiRound] = []
    for _ in range(rounds):
        x, seg, regret, _ = decision_data(inputs, best_w, nh)
        if len(x):
            data.append((x, seg, regret))
        if not data:
            break
        (xa, sa, ra), _ = stack_rounds(data)  # every round's decisions, numbered apart
        scale = np.maximum(np.abs(xa).max(axis=0), 1e-9)  # features O(1) for the optimiser
        cands = []
        spread = _score_spread(xa, sa, best_w, nh)
        for t in temperatures:  # relative to the current scores' spread per decision
            fitted = _fit(xa / scale, sa, ra, best_w_scaled(best_w, scale, nh), nh,
                          t * spread, steps, l2, lr)
            cands += [best_w + a * np.where(keep, 0.0, unscale(c, scale, nh) - best_w)
                      for c in fitted for a in alphas]
        ws = np.vstack(cands)
        scores = population_batches(inputs, ws, nh).sum(axis=1)
        i = int(np.argmin(scores))
        history.append(ApiRound(best, min(best, int(scores[i])), int(sa.max()) + 1, len(ws)))
        if scores[i] >= best:
            break
        best, best_w = int(scores[i]), np.ascontiguousarray(ws[i])
    return best_w, best, history


def best_w_scaled(w: NDArray[np.float64], scale: NDArray[np.float64], nh: int
                  ) -> NDArray[np.float64]:
    """Weights on features divided by ``scale`` that give the same scores."""
    f = len(scale)
    out = w.copy()
    out[:f] = w[:f] * scale
    for j in range(nh):
        o = f + j * (f + 1)
        out[o:o + f] = w[o:o + f] * scale
    return out


def unscale(w: NDArray[np.float64], scale: NDArray[np.float64], nh: int) -> NDArray[np.float64]:
    """The inverse of :func:`best_w_scaled`."""
    f = len(scale)
    out = w.copy()
    out[:f] = w[:f] / scale
    for j in range(nh):
        o = f + j * (f + 1)
        out[o:o + f] = w[o:o + f] / scale
    return out
