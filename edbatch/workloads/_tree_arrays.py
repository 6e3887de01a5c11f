"""Flattened SST trees (:class:`TreeInstance`) and their vectorised graph construction.

This module sits below :mod:`edbatch.workloads._trees` (which imports it, never the other
way round).

:func:`build_binary_cells` builds with numpy, from each instance's cached ``int64`` rows, the
graph :func:`~edbatch.workloads._trees.emit_cells` would build node by node (~10x faster;
:meth:`TreeWorkload.build_graph <edbatch.workloads._trees.TreeWorkload.build_graph>` uses it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from edbatch.data.trees import Tree
from edbatch.graph import Graph, Vocab

__all__ = ["NodeRow", "TreeInstance", "build_binary_cells"]

#: One post-order node: ``(word_id, left, right, label)``. A leaf has ``left == right == -1``
#: and ``word_id >= 0``; a binary node has both children's post-order indices and
#: ``word_id == -1``; a unary node has ``right == -1``.
NodeRow = tuple[int, int, int, int]


@dataclass(frozen=True)
class TreeInstance:
    """One sentence tree, flattened in post-order with word ids resolved.

    Attributes:
        tree: the parsed tree.
        nodes: one :data:`NodeRow` ``(word_id, left, right, label)`` per tree node, children
            before parents; the root is last.
    """

    tree: Tree
    nodes: tuple[NodeRow, ...]

    @functools.cached_property
    def _columns(self) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """``int64[n, 4]`` rows and ``int32[n]`` heights (0 for a leaf), computed once."""
        rows = np.array(self.nodes, dtype=np.int64).reshape(-1, 4)
        height = [0] * len(self.nodes)
        for k, (_, left, right, _) in enumerate(self.nodes):
            if left >= 0:
                height[k] = max(height[left], height[right] if right >= 0 else 0) + 1
        return rows, np.asarray(height, dtype=np.int32)

    @property
    def is_binary(self) -> bool:
        """No unary node (SST's binarised trees have none)."""
        rows = self._columns[0]
        return not bool(np.any((rows[:, 1] >= 0) & (rows[:, 2] < 0)))

    @property
    def num_nodes(self) -> int:
        """Number of tree nodes (each gets a state, unless unary, and a loss)."""
        return len(self.nodes)

    @property
    def num_leaves(self) -> int:
        """Number of pre-terminals (words)."""
        return sum(1 for row in self.nodes if row[1] < 0)

    @property
    def num_binary(self) -> int:
        """Number of internal nodes with two children."""
        return sum(1 for row in self.nodes if row[2] >= 0)

    @property
    def num_unary(self) -> int:
        """Number of internal nodes with one child (their state is the child's)."""
        return sum(1 for row in self.nodes if row[1] >= 0 > row[2])


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
