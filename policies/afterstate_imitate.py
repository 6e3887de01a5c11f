"""Imitating the critical-path rollout teacher with the afterstate features.

The afterstate policy (:mod:`policies.afterstate`) scores each ready type by
``w . [f_a, g_a]``: the priority row and features of the state running ``a`` leads to. This
module fits ``w`` to a lookahead teacher instead of searching it on the batch count:

1. **Label** the states critical path visits on the training graphs: at every decision with
   two or more ready types each type is tried and the schedule completed by critical path
   (:func:`~edbatch.schedule._compiled_priority_q.priority_q_base`, the rollout lookahead's
   first level); the types of fewest batches are the teacher's choices, decisions where all
   tie carry no label. The rows are the afterstate policy's own (its compiled trace with
   critical path's weights, which visits the same states, checked row for row).
2. **Fit** a linear score by cross-entropy (per decision, minus the log of the softmax mass
   on the teacher's choices; :func:`policies.priority_dagger.choice_loss`), Adam from 0 on
   features scaled to O(1); the weights after each of ``steps`` optimiser steps are the
   candidates, the one with the fewest training batches wins (never more than critical
   path's: else critical path's weights).

With the priority rows alone the same imitation does not beat critical path (the teacher's
choices are not separable by them, docs/learning_alternatives.md); the afterstate columns
are what a one-step lookahead sees, and the fit beats the CEM on unseen graphs
(docs/learning.md). Deterministic (torch on one thread, no random start).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from edbatch.graph import Graph
from edbatch.schedule._compiled_afterstate import afterstate_trace
from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, critical_path_weights
from edbatch.schedule._compiled_priority_q import priority_q_base
from policies.afterstate import (
    NUM_WEIGHTS,
    after_mask,
    afterstate_inputs,
    afterstate_start,
    population_afterstate,
)
from policies.priority import graph_inputs
from policies.priority_dagger import _fit

__all__ = ["IMITATE_STEPS", "contested", "contested_values", "imitate", "keep_fewest",
           "label_critical_path", "lean_mask"]

#: Adam steps after which the fit's weights are candidates.
IMITATE_STEPS = (300, 1000, 3000, 10000)


def label_critical_path(graphs: Sequence[Graph], inputs: Sequence[tuple] | None = None  # type: ignore[type-arg]
                        ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_],
                                   int]:
    """The teacher's labels on critical path's states: ``(rows, seg, target, decisions)``,
    the afterstate rows of the ready types of every contested decision (decision index
    ``seg``, numbered across graphs), which rows are the teacher's choices (fewest batches
    of the rollout over critical path), the number of contested decisions. ``inputs``: the
    graphs' :func:`~policies.afterstate.afterstate_inputs`, if the caller has them."""
    cp = critical_path_weights(0)
    if inputs is None:
        inputs = [afterstate_inputs(g) for g in graphs]

    def traced() -> Iterator[tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]]:
        for g, ai in zip(graphs, inputs, strict=True):
            gi = graph_inputs(g)
            cap = len(gi[0]) * 8 + 64
            rows, ids, ptr, q, _ = priority_q_base(*gi, cp, 0, cp, 0, cap)  # type: ignore[call-arg]
            arows, aids = afterstate_trace(*ai, afterstate_start(), cap)  # type: ignore[call-arg]
            if not (np.array_equal(aids, ids)
                    and np.array_equal(arows[:, :NUM_PRIORITY_FEATURES], rows)):
                raise RuntimeError("the afterstate trace left critical path's states: "
                                   "afterstate_start() must be critical path")
            yield arows, ptr, q

    return contested(traced())


def contested_values(traces: Iterable[tuple[NDArray[np.float64], NDArray[np.int64],
                                            NDArray[np.int64]]]
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], int]:
    """``(rows, segment, value, segments)`` of the *contested* decisions of traces
    ``(rows, ptr, q)`` (decision ``t`` owns ``rows[ptr[t]:ptr[t + 1]]``, ``q`` each row's
    batches): those with two or more ready types whose values differ; a row's value is its
    batches minus its decision's fewest (the teacher's choices are 0)."""
    xs, segs, vs, nseg = [], [], [], 0
    for rows, ptr, q in traces:
        for t in range(len(ptr) - 1):
            lo, hi = int(ptr[t]), int(ptr[t + 1])
            qt = q[lo:hi]
            if hi - lo < 2 or qt.min() == qt.max():
                continue
            xs.append(rows[lo:hi])
            segs.append(np.full(hi - lo, nseg, np.int64))
            vs.append((qt - qt.min()).astype(np.float64))
            nseg += 1
    if not xs:
        return np.zeros((0, NUM_WEIGHTS)), np.zeros(0, np.int64), np.zeros(0), 0
    return np.concatenate(xs), np.concatenate(segs), np.concatenate(vs), nseg


def contested(traces: Iterable[tuple[NDArray[np.float64], NDArray[np.int64],
                                     NDArray[np.int64]]]
              ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_], int]:
    """``(rows, segment, target, segments)`` of :func:`contested_values`; a row is a target
    where its value is the decision's fewest."""
    rows, seg, value, nseg = contested_values(traces)
    return rows, seg, value == 0, nseg


def lean_mask(priority_features: int | None, extra: Sequence[str] = ()) -> NDArray[np.bool_]:
    """The weights a fit may set: the first ``priority_features`` priority features (all
    with ``None``) and the afterstate ones of :func:`~policies.afterstate.after_mask`
    (``extra``: which of the extra columns). ``15``: the version-1 features, no release,
    ``far`` or context columns, so the compiled loop skips the context rows (the cheap
    variant: 4.1 against 6.0-6.1 us per decision over critical path, docs/learning.md)."""
    after = after_mask(extra)
    if priority_features is None:
        return np.concatenate([np.ones(NUM_PRIORITY_FEATURES, np.bool_), after])
    if not 1 <= priority_features <= NUM_PRIORITY_FEATURES:
        raise ValueError(f"priority_features must be 1..{NUM_PRIORITY_FEATURES} or None, got "
                         f"{priority_features!r}")
    act = np.zeros(NUM_WEIGHTS, np.bool_)
    act[:priority_features] = True
    act[NUM_PRIORITY_FEATURES:] = after
    return act


def imitate(graphs: Sequence[Graph], steps: Sequence[int] = IMITATE_STEPS, lr: float = 0.01,
            priority_features: int | None = None, extra: Sequence[str] = (),
            labels: list[tuple] | None = None,  # type: ignore[type-arg]
            ) -> tuple[NDArray[np.float64], int, dict[str, object]]:
    """Fit the afterstate weights to the teacher on ``graphs`` (module doc): ``(weights,
    their training batches, a record)``; critical path's weights if no candidate beats it.
    ``priority_features``: fit only the first that many priority features' weights (the
    others stay 0; :func:`lean_mask`); ``extra``: also fit these extra afterstate columns
    (:data:`~policies.afterstate.EXTRA_FEATURES`; else their weights stay 0); ``labels``:
    a list the teacher's labels (:func:`label_critical_path`'s tuple) are appended to."""
    if not steps or min(steps) < 1:
        raise ValueError(f"steps must be positive Adam step counts, got {list(steps)}")
    active = lean_mask(priority_features, extra)
    torch.manual_seed(0)
    inputs = [afterstate_inputs(g) for g in graphs]
    x, seg, target, n = label_critical_path(graphs, inputs)
    if labels is not None:
        labels.append((x, seg, target, n))
    w0 = afterstate_start()
    base = int(population_afterstate(inputs, w0[None]).sum())
    record: dict[str, object] = {"teacher": "critical-path rollout (level 1)",
                                 "contested_decisions": n, "steps": list(steps), "lr": lr,
                                 "critical_path_batches": base,
                                 "priority_features": priority_features,
                                 "extra_features": list(extra)}
    if n == 0:
        record["candidates"] = []
        return w0, base, record
    ws = np.vstack(_fit(x * active, seg, target, None, np.zeros(NUM_WEIGHTS), 0, steps, 0.0,
                        lr, active))
    w, batches, i = keep_fewest(inputs, ws, w0, base, record)
    if i is not None:
        record["steps_kept"] = int(steps[i])
    return w, batches, record


def keep_fewest(inputs: Sequence[tuple], ws: NDArray[np.float64],  # type: ignore[type-arg]
                w0: NDArray[np.float64], base: int, record: dict[str, object]
                ) -> tuple[NDArray[np.float64], int, int | None]:
    """``(weights, batches, index)``: the candidate of ``ws`` with the fewest batches on the
    training graphs ``inputs`` if fewer than ``base`` (critical path's), else ``(w0, base,
    None)``; every candidate's batches go to ``record["candidates"]``."""
    scores = population_afterstate(inputs, ws).sum(axis=1)
    i = int(np.argmin(scores))
    record["candidates"] = scores.tolist()
    if scores[i] >= base:
        return w0, base, None
    return np.ascontiguousarray(ws[i]), int(scores[i]), i
