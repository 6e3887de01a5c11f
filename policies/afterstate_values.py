"""Fitted action values for the afterstate policy: regress the rollout teacher's values.

The imitation (:mod:`policies.afterstate_imitate`) fits a score to the teacher's *choices*
(which ready types of a contested decision the rollout over critical path found fewest
batches for). The rollout values themselves say more: how many batches each other type
costs. Here they are regressed:

1. **Label** critical path's contested decisions on the training graphs with every ready
   type's rollout value ``v`` (batches of the whole schedule when the decision takes the
   type and critical path makes every later one, minus the decision's fewest: the teacher's
   choices have ``v = 0``), on the afterstate rows (:func:`label_values`; the same states,
   rows and choices as :func:`~policies.afterstate_imitate.label_critical_path`).
2. **Fit** ``v ~ beta . x`` by ridge least squares, per decision centred (a decision's
   constant does not change its argmin), columns standardised (:func:`value_ridge`); the
   policy runs the type of least predicted cost, i.e. the afterstate weights ``-beta``.
   One candidate per ridge strength ``lams``, the fewest training batches kept (never more
   than critical path's: else critical path's weights; :func:`fit_values`).

On the held-out lattice dumps with every column (``extra=["all"]``, all priority features)
this linear value fit needs fewer batches than the imitation of the choices (docs/learning.md;
``benchmarks/afterstate_values_exp.py`` has every variant). Deterministic (closed form).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from edbatch.schedule._compiled_afterstate_q import afterstate_q
from policies.afterstate import afterstate_start, population_afterstate
from policies.afterstate_imitate import contested_values, keep_fewest

__all__ = ["VALUE_LAMS", "centre", "fit_values", "label_values", "value_ridge"]

#: Ridge strengths (per row, on standardised columns) whose fits are the candidates.
VALUE_LAMS = (1e-4, 1e-3, 1e-2, 1e-1)


def label_values(inputs: Sequence[tuple]  # type: ignore[type-arg]
                 ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], int]:
    """``(rows, seg, v, decisions)``: the afterstate rows of critical path's contested
    decisions on the graphs ``inputs`` (:func:`~policies.afterstate.afterstate_inputs`),
    their decision index (numbered across graphs), each row's rollout value minus its
    decision's fewest (module doc), the number of contested decisions."""
    cp = afterstate_start()

    def traces():  # type: ignore[no-untyped-def]
        for gi in inputs:
            rows, _, ptr, q, _ = afterstate_q(*gi, cp, cp, len(gi[0]) * 8 + 64)  # type: ignore[call-arg]
            yield rows, ptr, q
    return contested_values(traces())


def centre(a: NDArray[np.float64], seg: NDArray[np.int64], n: int) -> NDArray[np.float64]:
    """``a`` minus its decision's mean (rows of ``a`` per row of ``seg``)."""
    cnt = np.bincount(seg, minlength=n).astype(np.float64)
    if a.ndim == 1:
        return a - (np.bincount(seg, a, n) / cnt)[seg]
    m = np.stack([np.bincount(seg, a[:, j], n) for j in range(a.shape[1])], axis=1)
    return a - (m / cnt[:, None])[seg]


def value_ridge(x: NDArray[np.float64], seg: NDArray[np.int64], v: NDArray[np.float64],
                n: int, active: NDArray[np.bool_], lams: Sequence[float] = VALUE_LAMS,
                weight: NDArray[np.float64] | None = None) -> list[NDArray[np.float64]]:
    """Per decision centred ridge fits of ``v`` on the ``active`` columns of ``x``: one
    coefficient vector per strength in ``lams`` (inactive columns 0). The loss per row is
    ``weight * (beta . xc - vc)^2 + lam |beta * sd|^2`` (``xc``, ``vc`` centred, ``sd`` the
    centred columns' deviations; ``weight`` 1 unless given, a row weight per row)."""
    if len(x) != len(seg) or len(x) != len(v) or x.ndim != 2:
        raise ValueError(f"need rows, seg and v of one length; got {x.shape}, {seg.shape}, "
                         f"{v.shape}")
    if not lams or min(lams) < 0:
        raise ValueError(f"lams must be ridge strengths >= 0, got {list(lams)}")
    cols = np.flatnonzero(active)
    out = []
    if len(x) == 0 or len(cols) == 0:
        return [np.zeros(x.shape[1]) for _ in lams]
    xc = centre(x[:, cols], seg, n)
    vc = centre(v, seg, n)
    sd = xc.std(axis=0)
    sd[sd == 0] = 1.0
    z = xc / sd
    if weight is None:
        a, b = z.T @ z, z.T @ vc
    else:
        a, b = z.T @ (z * weight[:, None]), z.T @ (vc * weight)
    for lam in lams:
        beta = np.linalg.lstsq(a + lam * len(v) * np.eye(len(cols)), b, rcond=None)[0]
        full = np.zeros(x.shape[1])
        full[cols] = beta / sd
        out.append(full)
    return out


def fit_values(inputs: Sequence[tuple], active: NDArray[np.bool_],  # type: ignore[type-arg]
               lams: Sequence[float] = VALUE_LAMS,
               labels: tuple | None = None,  # type: ignore[type-arg]
               ) -> tuple[NDArray[np.float64], int, dict[str, object]]:
    """The value fit on the training graphs ``inputs`` (module doc): ``(weights, their
    training batches, a record)``; critical path's weights if no candidate beats it.
    ``labels``: :func:`label_values`' tuple, if the caller has it."""
    x, seg, v, n = label_values(inputs) if labels is None else labels
    w0 = afterstate_start()
    base = int(population_afterstate(inputs, w0[None]).sum())
    record: dict[str, object] = {"teacher": "critical-path rollout (level 1)",
                                 "target": "values (ridge regression)",
                                 "contested_decisions": n, "lams": list(lams),
                                 "critical_path_batches": base}
    if n == 0:
        record["candidates"] = []
        return w0, base, record
    ws = -np.vstack(value_ridge(x, seg, v, n, active, lams))
    w, batches, i = keep_fewest(inputs, ws, w0, base, record)
    if i is not None:
        record["lam_kept"] = float(lams[i])
    return w, batches, record
