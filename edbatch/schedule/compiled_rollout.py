"""The fortified rollout on the compiled core: base policies mapped to the core's rules and
FSM tables, the graph to its flat arrays, the result to a :class:`Schedule`.

:func:`edbatch.schedule.rollout.rollout_schedule` calls :func:`compiled_rollout` whenever the
objective is the batch count, every base is one the core runs (:func:`compiled_bases`) and the
backend (``$EDBATCH_BACKEND``) is ``compiled``; the Python search is the oracle it equals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from edbatch.graph.ir import Graph
from edbatch.schedule._compiled import ENC_NONE
from edbatch.schedule._compiled_rollout import REPLAY_RULE, run_rollout
from edbatch.schedule.bounds import lower_bound
from edbatch.schedule.compiled import (
    _EMPTY_I,
    COMPILED_ENCODINGS,
    FsmTable,
    _read_only,
    core_graph,
    core_ids,
    core_schedule,
    fsm_encoding,
    fsm_supported,
)
from edbatch.schedule.heuristics import (
    AgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    MaxFrontierPolicy,
    TypewiseGreedyPolicy,
)
from edbatch.schedule.policy import Policy
from edbatch.schedule.replay import (
    PREFIX,
    ReplayPolicy,
    replay_fsm_supported,
    replay_heuristic,
    replay_ranks,
)
from edbatch.schedule.schedule import Schedule

__all__ = ["CompiledBase", "compiled_bases", "compiled_rollout"]

#: heuristic policy classes the core runs, by their rule name
_RULES: dict[type, str] = {CriticalPathPolicy: "critical_path",
                           TypewiseGreedyPolicy: "typewise_greedy",
                           MaxFrontierPolicy: "max_frontier", DynetAgendaPolicy: "dynet_agenda",
                           AgendaPolicy: "ed_batch_agenda"}

#: a base on the core: (rule name or ``replay:<heuristic>``, FSM encoding or None, FSM
#: table or None)
CompiledBase = tuple[str, str | None, FsmTable | None]


def _one(policy: object) -> CompiledBase | None:
    rule = _RULES.get(type(policy))  # exact class: a subclass may decide otherwise
    if rule is not None:
        return rule, None, None
    if type(policy) is ReplayPolicy:
        return PREFIX + policy.heuristic, None, None
    enc, fallback = getattr(policy, "encoding", None), getattr(policy, "fallback_name", None)
    table = getattr(policy, "table", None)
    if isinstance(enc, str) and isinstance(fallback, str) and isinstance(table, dict) \
            and (fsm_supported(enc, fallback) or replay_fsm_supported(enc, fallback)):
        core_table = FsmTable(table)
        return fallback, fsm_encoding(core_table, fallback, enc), core_table
    return None


def compiled_bases(bases: Sequence[Policy | Callable[[], Policy]]) -> list[CompiledBase] | None:
    """The core's form of the base policies (instances, or factories called once each), or
    ``None`` if any base is one the core does not run (another class, an FSM with an
    encoding or fallback it lacks)."""
    out = []
    for base in bases:
        factory = isinstance(base, type) or not hasattr(base, "choose")
        one = _one(base() if factory else base)  # type: ignore[operator]
        if one is None:
            return None
        out.append(one)
    return out


def _cat(xs: list[np.ndarray]) -> np.ndarray:  # type: ignore[type-arg]
    return _read_only(np.ascontiguousarray(np.concatenate(xs), np.int64)) if xs else _EMPTY_I


def _ranks(graph: Graph, replayed: dict[str, int]) -> np.ndarray:  # type: ignore[type-arg]
    """``int64[R, N]``: the node ranks of each replayed heuristic (row by ``replayed``)."""
    out = np.zeros((len(replayed), graph.num_nodes), np.int64)
    for heuristic, row in replayed.items():
        out[row] = replay_ranks(graph, heuristic)
    return out


def compiled_rollout(graph: Graph, bases: Sequence[CompiledBase], *, budget: int,
                     name: str = "rollout", retry_planned: bool = False, level: int = 1,
                     inner_budget: int = 0, plan_budget: int = 0) -> tuple[Schedule, int]:
    """Fortified rollout (batch count) on the compiled core; ``(schedule, batches popped in
    rollouts)``. ``level`` 2 completes each candidate by a level-1 rollout (see
    :mod:`edbatch.schedule._compiled_rollout`) searching at most ``inner_budget`` batches,
    after a first plan by a level-1 rollout searching ``plan_budget``."""
    t0 = time.perf_counter()
    need_tw = need_h = False
    rules, encs, hashes, acts, ptr = [], [], [], [], [0]
    replayed: dict[str, int] = {}  # replayed heuristic -> its row of ranks
    for rule, enc, table in bases:
        heuristic = replay_heuristic(rule)
        if heuristic is not None:  # (a replay rule: its FSM encoding's needs alone)
            enc_id, tw, h = COMPILED_ENCODINGS[enc] if enc is not None else \
                (ENC_NONE, False, False)
            rule_id = REPLAY_RULE + replayed.setdefault(heuristic, len(replayed))
        else:
            rule_id, enc_id, tw, h = core_ids(rule, enc)
        need_tw, need_h = need_tw or tw, need_h or h
        rules.append(rule_id)
        encs.append(enc_id)
        if table is not None:
            hashes.append(table.hashes)
            acts.append(table.actions)
        ptr.append(ptr[-1] + (table.size if table is not None else 0))
    arr, height, tw_pred, tw_ptr, tw_ids = core_graph(graph, need_tw, need_h)
    bop, bforced, bptr, nodes, spent = run_rollout(
        arr.op, arr.depth, arr.arity, arr.uptr, arr.uids, arr.batchable, height, tw_pred,
        tw_ptr, tw_ids, arr.mean, arr.cplx, np.array(rules, np.int64), np.array(encs, np.int64),
        np.array(ptr, np.int64), _cat(hashes), _cat(acts), int(budget),
        float(lower_bound(graph)), bool(retry_planned), int(level), int(inner_budget),
        int(plan_budget), _ranks(graph, replayed))
    return core_schedule(bop, bforced, bptr, nodes, name, t0), int(spent)
