"""Vectorised graph construction for binary trees at cell granularity.

:func:`build_binary_cells` builds with numpy, from each instance's cached ``int64`` rows, the
graph :func:`~edbatch.workloads._trees.emit_cells` would build node by node (~10x faster;
:meth:`TreeWorkload.build_graph <edbatch.workloads._trees.TreeWorkload.build_graph>` uses it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from edbatch.graph import Graph, Vocab

if TYPE_CHECKING:
    from edbatch.workloads._trees import TreeInstance

__all__ = ["build_binary_cells"]


def build_binary_cells(instances: Sequence[TreeInstance], vocab: Vocab,
                       cell_ops: tuple[int, int, int], sum_op: int | None) -> Graph:
    """Vectorised :func:`emit_cells` over binary trees: node ``2k`` is tree node ``k``'s state
    and ``2k + 1`` its loss (offset per tree), then the optional ``loss_sum``."""
    leaf, internal, loss = cell_ops
    cols = [t._columns for t in instances]
    sizes = np.array([len(r) for r, _ in cols], dtype=np.int64)
    rows = np.concatenate([r for r, _ in cols]) if cols else np.zeros((0, 4), np.int64)
    height = np.concatenate([h for _, h in cols]) if cols else np.zeros(0, np.int32)
    n = len(rows)
    base = np.repeat(2 * (np.cumsum(sizes) - sizes), sizes)  # first node id of each tree
    is_leaf = rows[:, 1] < 0
    op_ids = np.empty(2 * n, dtype=np.int32)
    op_ids[0::2] = np.where(is_leaf, leaf, internal)
    op_ids[1::2] = loss
    attrs = np.empty(2 * n, dtype=np.int64)
    attrs[0::2] = np.where(is_leaf, rows[:, 0], -1)
    attrs[1::2] = rows[:, 3]
    depth = np.empty(2 * n, dtype=np.int32)
    depth[0::2], depth[1::2] = height, height + 1
    arity = np.empty(2 * n, dtype=np.int64)
    arity[0::2], arity[1::2] = np.where(is_leaf, 0, 2), 1
    ptr = np.zeros(2 * n + 1, dtype=np.int64)
    np.cumsum(arity, out=ptr[1:])
    operands = np.empty(int(ptr[-1]), dtype=np.int64)
    state = 2 * np.arange(n, dtype=np.int64)
    inner = np.flatnonzero(~is_leaf)
    first = ptr[2 * inner]
    operands[first] = base[inner] + 2 * rows[inner, 1]
    operands[first + 1] = base[inner] + 2 * rows[inner, 2]
    operands[ptr[state + 1]] = state
    instance = np.repeat(np.arange(len(instances), dtype=np.int32), 2 * sizes)
    outputs = state + 1
    if sum_op is not None:
        op_ids = np.append(op_ids, np.int32(sum_op))
        attrs = np.append(attrs, -1)
        depth = np.append(depth, np.int32(depth.max(initial=-1) + 1))
        instance = np.append(instance, np.int32(0))
        operands = np.concatenate([operands, outputs])
        ptr = np.append(ptr, ptr[-1] + n)
        outputs = np.array([2 * n])
    return Graph.from_arrays(vocab, op_ids, ptr, operands, attrs=attrs, instance=instance,
                             outputs=outputs, depth=depth)
