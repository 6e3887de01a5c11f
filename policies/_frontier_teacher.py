"""The rollout teacher's labels at the states a trajectory visits (compiled).

For a trajectory (the op ids chosen at each decision of a graph), :func:`teacher_q` returns,
at every decision, the batches of the whole schedule if each ready type were popped now and
the rest completed by a base rule (critical path by default): the one-step rollout's
Q-values, the decision function that :func:`edbatch.schedule.rollout.rollout_schedule`
improves on. DAgger asks it at the student's own states. It runs on the compiled core's state
arrays (:mod:`edbatch.schedule._compiled_rollout`): one numba call per graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit
from numpy.typing import NDArray

from edbatch.graph import Graph
from edbatch.schedule._compiled_rollout import _copy, _drive, _new_state, _pop, _pop_forced, _start
from edbatch.schedule.compiled import core_graph, core_ids
from edbatch.schedule.schedule import Schedule

__all__ = ["decisions_of", "teacher_q"]


@njit(cache=True)
def _q_run(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr, tw_ids, mean,
           cplx, rule, enc, decisions):  # type: ignore[no-untyped-def]
    """``int64[D, K]``: batches of the schedule that pops type ``a`` at decision ``i`` (the
    decisions before it as given) and completes with ``rule``; -1 where ``a`` is not ready."""
    n, k = len(op), len(batchable)
    g, real, track = _start(op, depth, arity, uptr, uids, batchable, height, tw_pred, tw_ptr,
                            tw_ids, mean, cplx, np.zeros((0, n), np.int64))
    work = _new_state(op, arity, batchable, k, tw_pred, track)
    key = np.empty(4 * k + 8, np.int64)
    buf = np.empty(n, np.int64)
    dec = np.empty(n + 1, np.int64)
    th = np.empty(0, np.int64)
    q = np.full((len(decisions), k), -1, np.int64)
    prefix = 0
    for i in range(len(decisions)):
        while real[9][0] > 0:
            _pop_forced(real, buf, g)
            prefix += 1
        if real[9][1] == n:
            return q[:i]
        for a in range(k):
            if real[1][a] > 0 and batchable[a]:
                _copy(real, work)
                _pop(work, a, buf, g)
                nb, _ = _drive(work, g, rule, enc, th, th, key, buf, dec)
                q[i, a] = prefix + 1 + nb
        a = decisions[i]
        if not (real[1][a] > 0 and batchable[a]):
            return q[:i]
        _pop(real, a, buf, g)
        prefix += 1
    return q


def teacher_q(graph: Graph, decisions: Sequence[int], rule: str = "critical_path"
              ) -> NDArray[np.int64]:
    """The one-step rollout's Q-values along ``decisions`` (see the module doc).

    Returns:
        ``int64[D, K]`` with ``D <= len(decisions)`` (shorter when a decision was not a
        ready type); ``-1`` marks types that were not ready.
    """
    rule_id, enc_id, need_tw, need_h = core_ids(rule)
    arr, height, tw_pred, tw_ptr, tw_ids = core_graph(graph, need_tw, need_h)
    return _q_run(arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height,
                  tw_pred, tw_ptr, tw_ids, arr.mean, arr.cplx, rule_id, enc_id,
                  np.asarray(list(decisions), dtype=np.int64))


def decisions_of(schedule: Schedule) -> list[int]:
    """The op ids a schedule chose at its decisions (forced steps skipped)."""
    return [b.op_id for b in schedule.batches if not b.forced]
