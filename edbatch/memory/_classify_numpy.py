"""The planner's read classification in vectorised numpy: the oracle of
:mod:`edbatch.memory._classify_compiled` (``tests/memory/test_classify_compiled.py`` compares
them), run by :func:`~edbatch.memory.plan_memory` under ``$EDBATCH_BACKEND=python``.

Operand reads are grouped by ``(batch, slot)`` and each group's rows tested for being
consecutive (a view) or not (a gather). A variadic node alone in its batch reads all its
operands as one slot when they share an arena, else one read per operand (listed first).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph

__all__ = ["classify_numpy"]


def classify_numpy(g: Graph, variadic_op: NDArray[np.bool_], forced: NDArray[np.bool_],
                   cons: NDArray[np.int64], batch: NDArray[np.int64],
                   node_row: NDArray[np.int64], node_arena: NDArray[np.int32]
                   ) -> tuple[Any, ...]:
    """The reads of the row orders ``cons`` (concatenated; ``batch``: each position's batch),
    vectorised numpy: ``(read_start, read_batch, read_view, read_rows, read_arena,
    num_views)``. ``variadic_op[a]``: op type ``a`` has no fixed arity; ``forced[b]``: batch
    ``b`` is forced (its views are not counted)."""
    arity = g.arity[cons]
    edge = np.repeat(g.operand_ptr[cons], arity) + _ranks(arity)
    slot = _ranks(arity)
    variadic = variadic_op[g.op_ids[cons]]
    ebatch = np.repeat(batch, arity)
    # A variadic op's node alone in its batch reads all its operands as one slot (rows
    # in operand order) when they share an arena, else one read per operand. Batched
    # variadic nodes (user cells) read slot k from the nodes that have a k-th operand.
    alone = np.bincount(batch, minlength=len(forced))[batch] == 1
    single = np.repeat(variadic & alone, arity)
    if single.any():  # variadic nodes whose operands span several arenas
        arenas = node_arena[g.operand_ids[edge[single]]].astype(np.int64)
        owner = np.repeat(np.arange(len(cons)), arity)[single]
        first = np.flatnonzero(np.diff(owner, prepend=-1))  # owner is ascending
        same = np.zeros(len(cons), dtype=bool)
        same[owner[first]] = (np.minimum.reduceat(arenas, first)
                              == np.maximum.reduceat(arenas, first))
        merged = np.repeat(same, arity) & single
        slot[merged] = 0
        single &= ~merged
    key = ebatch * (int(slot.max(initial=0)) + 1) + slot
    num_single = int(np.count_nonzero(single))
    key[single] = np.arange(num_single) - num_single  # distinct, negative, ascending
    order = np.argsort(key, kind="stable")
    key, edge, ebatch = key[order], edge[order], ebatch[order]
    rows = node_row[g.operand_ids[edge]]
    read_start = np.flatnonzero(np.diff(key, prepend=-(1 << 62)) != 0)
    read_batch = ebatch[read_start]
    broken = np.flatnonzero((np.diff(rows) != 1) & (np.diff(key) == 0))
    read_view = np.ones(len(read_start), dtype=bool)
    read_view[np.searchsorted(read_start, broken, side="right") - 1] = False
    num_views = int(np.count_nonzero(read_view & ~forced[read_batch]))
    return read_start, read_batch, read_view, rows, node_arena[g.operand_ids[edge]], num_views


def _ranks(sizes: NDArray[np.int64]) -> NDArray[np.int64]:
    """``[0..sizes[0]), [0..sizes[1]), ...`` concatenated."""
    total = int(sizes.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
