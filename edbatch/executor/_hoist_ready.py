"""Readiness of hoisted batches (:mod:`~edbatch.executor._hoist`): per batch the last batch
producing one of its hoisted operands, from the plan's operands (:func:`ready`) or, for a
fixed-arity op type, straight from the graph (:func:`ready_nodes`); the projection groups
those readinesses give (:func:`groups`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edbatch.executor._reads import merged
from edbatch.graph import Graph
from edbatch.memory.plan import MemoryPlan, Operand, Region
from edbatch.schedule.compiled import resolve_backend
from edbatch.schedule.schedule import Schedule

__all__ = ["groups", "projection_operands", "ready", "ready_nodes", "row_parts"]


def groups(batches: list[int], ready: dict[int, int]) -> list[list[int]]:
    """Partition ``batches`` (schedule order) into projection groups: at the first batch not
    grouped yet, every ungrouped batch whose hoisted operands are ready before it."""
    left = list(batches)
    groups = []
    while left:
        first = left[0]
        group = [b for b in left if ready[b] < first]
        groups.append(group)
        taken = set(group)
        left = [b for b in left if b not in taken]
    return groups


def row_parts(operands: Sequence[Operand], base: np.ndarray  # type: ignore[type-arg]
               ) -> list[np.ndarray]:  # type: ignore[type-arg]
    """Each operand's arena rows (``Operand.rows()``): a view's as a slice of ``base`` (an
    ``arange`` covering every arena, shared) instead of a new ``arange`` per operand."""
    return [base[v.start:v.stop] if (v := o.view) is not None else o.gather
            for o in operands]


def projection_operands(plan: MemoryPlan, group: list[int], slots: tuple[int, ...],
                        base: np.ndarray, graph: Graph | None = None,  # type: ignore[type-arg]
                        nodes: np.ndarray | None = None  # type: ignore[type-arg]
                        ) -> tuple[Operand, ...]:
    """Per slot of ``slots`` one read of every ``group`` batch's operand rows, batch after
    batch (:func:`~edbatch.executor._reads.merged`): from the plan's operands (``base``: see
    :func:`row_parts`) or, given a fixed-arity op type's ``graph`` and the group's ``nodes``
    in row order, straight from the graph: the rows of each node's ``k``-th operand (one
    numpy pass; the plan's way where a slot's rows lie in more than one arena)."""
    ops = plan.operands
    out = []
    compiled = graph is not None and nodes is not None and resolve_backend() == "compiled"
    for k in slots:
        arena = ops[group[0]][k].arena
        if compiled:  # (the numpy form below is its twin)
            from edbatch.executor._hoist_ready_compiled import slot_rows

            rows, consecutive = slot_rows(graph.operand_ptr, graph.operand_ids,  # type: ignore[union-attr]
                                          np.asarray(nodes, np.int64), k, plan.node_arena,
                                          plan.node_row, arena)
            if len(rows):  # merged's rule; the loop knows `consecutive` (np.diff: +60 us)
                out.append(Operand.of_view(Region(arena, int(rows[0]), int(rows[-1]) + 1))
                           if consecutive else Operand.of_gather(arena, rows))
                continue
        elif graph is not None and nodes is not None:
            src = graph.operand_ids[graph.operand_ptr[nodes] + k]
            if bool((plan.node_arena[src] == arena).all()):
                out.append(merged(arena, plan.node_row[src].astype(np.int64, copy=False)))
                continue
        out.append(merged(arena, np.concatenate(row_parts([ops[b][k] for b in group], base))))
    return tuple(out)


def ready(plan: MemoryPlan, batch_of: list[np.ndarray], batches: list[int],  # type: ignore[type-arg]
           slots: tuple[int, ...], base: np.ndarray | None = None  # type: ignore[type-arg]
           ) -> dict[int, int]:
    """Batch -> the last batch producing one of its ``slots`` operands (-1: none), in one
    numpy pass per arena read rather than one per batch (``base``: see :func:`row_parts`;
    ``None``: built here)."""
    if base is None:
        base = np.arange(max(rows for rows, _ in plan.arenas), dtype=np.int64)
    late = np.full(len(batches), -1, dtype=np.int64)
    for k in slots:
        operands = [plan.operands[b][k] for b in batches]
        arenas = [o.arena for o in operands]
        parts = row_parts(operands, base)
        distinct = set(arenas)
        for arena in distinct:
            pick = list(range(len(arenas))) if len(distinct) == 1 else \
                [j for j, a in enumerate(arenas) if a == arena]
            rows = [parts[j] for j in pick]
            sizes = np.fromiter(map(len, rows), np.int64, len(rows))
            some = sizes > 0
            if not some.any():
                continue
            producers = batch_of[arena][np.concatenate(rows)]
            last = np.full(len(rows), -1, np.int64)  # per read: its latest producer
            last[some] = np.maximum.reduceat(producers, (np.cumsum(sizes) - sizes)[some])
            idx = np.asarray(pick)
            late[idx] = np.maximum(late[idx], last)
    return dict(zip(batches, late.tolist(), strict=True))


def ready_nodes(graph: Graph, schedule: Schedule, step: np.ndarray,  # type: ignore[type-arg]
                 batches: list[int], slots: tuple[int, ...]) -> dict[int, int]:
    """:func:`ready` of a fixed-arity op type's ``batches`` from the graph: the producer of
    slot ``k`` of a node is the batch that runs its ``k``-th operand (``step``: each node's
    batch), the rows the plan reads being those nodes' rows; one compiled loop
    (:func:`~edbatch.executor._hoist_ready_compiled.late_batches`) or, under
    ``EDBATCH_BACKEND=python``, a few numpy passes over every batch at once (its twin); no
    plan operand or row locator visited."""
    _, bptr, nodes, _ = schedule.flat()
    if resolve_backend() == "compiled":
        from edbatch.executor._hoist_ready_compiled import late_batches

        late = late_batches(bptr, nodes, graph.operand_ptr, graph.operand_ids, step,
                            np.asarray(batches, np.int64), np.asarray(slots, np.int64))
        return dict(zip(batches, late.tolist(), strict=True))
    b = np.asarray(batches, np.int64)
    sizes = bptr[b + 1] - bptr[b]
    starts = np.cumsum(sizes) - sizes  # each batch's first position among the picked nodes
    mine = nodes[np.repeat(bptr[b] - starts, sizes) + np.arange(int(sizes.sum()))]
    first = graph.operand_ptr[mine]
    late = np.full(len(b), -1, np.int64)
    for k in slots:
        late = np.maximum(late, np.maximum.reduceat(step[graph.operand_ids[first + k]],
                                                    starts))
    return dict(zip(batches, late.tolist(), strict=True))
