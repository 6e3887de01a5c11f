"""What a schedule costs an executor that runs a run of segment-type batches as one step.

On CPU, :mod:`edbatch.executor.cells_module_net_segment` runs every run of consecutive
attention batches of a module-network schedule as one program step (one compiled call each
way); every other batch is a step of its own. A step costs far more than a batch inside a
segment, so a schedule with fewer batches can still run slower if it splits the attention
run more often. :func:`program_steps` counts the steps of a schedule from its op sequence
and a per-type flag ``seg`` (the executor's own count on module_net's test mini-batches,
checked in the tests); :func:`run_priority_costs` is the priority trainer's inner loop with
the cost ``batches + lam * steps`` (``lam`` 0: the batch count).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edbatch.schedule._compiled_priority import run_priority

__all__ = ["program_steps", "run_priority_costs"]


@njit(cache=True)
def program_steps(batch_op, seg):  # type: ignore[no-untyped-def]
    """Steps of the schedule whose batches run op types ``batch_op`` in order: one per
    batch, except that consecutive batches of types with ``seg`` set share one."""
    steps, prev = 0, False
    for i in range(len(batch_op)):
        s = seg[batch_op[i]]
        if not (s and prev):
            steps += 1
        prev = s
    return steps


@njit(cache=True)
def run_priority_costs(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                       tw_ids, total, ws, nh, seg, lam):  # type: ignore[no-untyped-def]
    """``batches + lam * program steps`` of one graph under each weight vector (rows of
    ``ws``); ``seg``: per op type, whether its batches join a run (:func:`program_steps`)."""
    out = np.empty(len(ws), np.float64)
    for i in range(len(ws)):
        bop = run_priority(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                           tw_ids, total, ws[i], nh)[0]
        out[i] = len(bop) + lam * program_steps(bop, seg)
    return out
