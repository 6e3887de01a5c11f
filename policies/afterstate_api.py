"""Approximate policy iteration for the imitated afterstate policy: a stronger teacher.

:mod:`policies.afterstate_imitate` fits the afterstate weights to the rollout over critical
path (the teacher of round 0). A rollout over a better base policy is a better teacher, so
each further round labels the contested decisions of the current student ``w_k`` on its own
states by the rollout over ``w_k`` itself (``base="student"``: ``Q^{w_k}(s, b)``,
:func:`~edbatch.schedule._compiled_afterstate_q.afterstate_q`) or over the better of
critical path and ``w_k`` (``base="both"``: per type the fewer batches of the two
rollouts), fits a new linear score by the same cross-entropy (from 0, on this round's
labels, or on every round's so far with ``aggregate``) and takes the candidate with the
fewest training batches as ``w_{k+1}`` (``warm``: the fit starts from ``w_k``). The result
is the best weights of every round on the training graphs (never worse than the start).
Deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import NDArray

from edbatch.schedule._compiled_afterstate_q import afterstate_q
from policies.afterstate import NUM_WEIGHTS, afterstate_start, population_afterstate
from policies.afterstate_imitate import contested
from policies.priority_dagger import _fit

__all__ = ["BASES", "api_rounds", "label_rollout"]

#: The rollout bases a round may label with.
BASES = ("student", "both")

Labels = tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_], int]


def label_rollout(inputs: Sequence[tuple], w: NDArray[np.float64],  # type: ignore[type-arg]
                  base: str = "student") -> Labels:
    """``(rows, seg, target, decisions)`` on the states of ``w`` over the graphs ``inputs``
    (:func:`~policies.afterstate.afterstate_inputs`): the afterstate rows of the ready types
    of every contested decision (decision index ``seg`` across graphs), which are the
    teacher's choices (fewest batches of the rollout over ``base``: ``"student"`` = ``w``,
    ``"both"`` = the fewer of ``w``'s and critical path's), how many decisions."""
    if base not in BASES:
        raise ValueError(f"base must be one of {list(BASES)}, got {base!r}")
    w = np.ascontiguousarray(w, dtype=np.float64)
    if w.shape != (NUM_WEIGHTS,):
        raise ValueError(f"w must hold {NUM_WEIGHTS} weights, got shape {w.shape}")
    cp = afterstate_start()

    def traced() -> Iterator[tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]]:
        for gi in inputs:
            cap = len(gi[0]) * 8 + 64
            rows, _, ptr, q, _ = afterstate_q(*gi, w, w, cap)  # type: ignore[call-arg]
            if base == "both":
                q = np.minimum(q, afterstate_q(*gi, w, cp, cap)[3])  # type: ignore[call-arg]
            yield rows, ptr, q

    return contested(traced())


def _merge(a: Labels, b: Labels) -> Labels:
    return (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1] + a[3]]),
            np.concatenate([a[2], b[2]]), a[3] + b[3])


def api_rounds(inputs: Sequence[tuple], w: NDArray[np.float64], batches: int,  # type: ignore[type-arg]
               rounds: int, active: NDArray[np.bool_], steps: Sequence[int], lr: float = 0.01,
               base: str = "student", aggregate: bool = False,
               first: Labels | None = None, warm: bool = False, progress: bool = False,
               ) -> tuple[NDArray[np.float64], int, list[dict[str, object]]]:
    """``rounds`` rounds from the student ``w`` (``batches``: its training batches) on the
    graphs ``inputs`` (module doc): ``(best weights, their training batches, one record per
    round)``. ``active``: the weights a fit may set; ``first``: the labels ``w`` was fitted
    to (with ``aggregate``, round 1 adds its labels to them); ``warm``: each fit starts
    from the current student (a fine-tune) instead of 0."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if not steps or min(steps) < 1:
        raise ValueError(f"steps must be positive Adam step counts, got {list(steps)}")
    best_w, best = np.ascontiguousarray(w, dtype=np.float64), int(batches)
    cur, data = best_w, first
    records: list[dict[str, object]] = []
    for k in range(rounds):
        lab = label_rollout(inputs, cur, base)
        data = _merge(data, lab) if (aggregate and data is not None) else lab
        rec: dict[str, object] = {"round": k + 1, "base": base, "contested_decisions": lab[3],
                                  "fitted_decisions": data[3]}
        if data[3] == 0:
            records.append(rec)
            break
        x, seg, target, _ = data
        start = np.where(active, cur, 0.0) if warm else np.zeros(NUM_WEIGHTS)
        ws = np.vstack(_fit(x * active, seg, target, None, start, 0, steps, 0.0, lr, active))
        scores = population_afterstate(inputs, ws).sum(axis=1)
        i = int(np.argmin(scores))
        cur = np.ascontiguousarray(ws[i])
        rec.update({"candidates": scores.tolist(), "steps_kept": int(steps[i]),
                    "batches": int(scores[i]), "weights": cur.tolist()})
        records.append(rec)
        if progress:
            print(f"API round {k + 1}: {lab[3]} contested decisions, candidates "
                  f"{scores.tolist()}", flush=True)
        if scores[i] < best:
            best_w, best = cur, int(scores[i])
    return best_w, best, records
