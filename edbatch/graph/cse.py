"""Common-subexpression elimination of operand-free nodes (``dedupe_leaves``).

Kernels are pure (:mod:`edbatch.executor.kernels`): a node's value depends only on its op
type, its ``attr`` and its operands' values. Two operand-free nodes with the same op type and
``attr`` (the leaf cell of the same word in two trees, the zero start state of every lattice,
the same word's embedding lookup) therefore compute the same row, and one of them can serve
the users of both. :func:`dedupe_leaves` keeps the first of each group, rewires the users of
the others and drops them; a mini-batch of SST trees loses about half its leaf cells. The
result computes the same outputs with the same kernels (in training, the gradient of a
shared leaf is the sum over its users, as before).

Example:
    >>> from edbatch.graph import GraphBuilder, OpType, Vocab
    >>> b = GraphBuilder(Vocab([OpType("emb", "lookup", (), (2,)),
    ...                         OpType("f", "tanh", ((2,),), (2,))]))
    >>> xs = [b.add("emb", attr=w) for w in (7, 3, 7)]
    >>> g = b.build([b.add("f", x) for x in xs])
    >>> small, new_id = dedupe_leaves(g)
    >>> small.num_nodes, new_id.tolist()
    (5, [0, 1, 0, 2, 3, 4])
"""

from __future__ import annotations

import weakref

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph

__all__ = ["dedupe_leaves", "dedupe_origin"]


def dedupe_leaves(graph: Graph) -> tuple[Graph, NDArray[np.int64]]:
    """Merge operand-free nodes of equal (op type, attr) into the first of them.

    Only op types whose nodes all have no operands take part (a variadic type with some
    empty nodes does not), so the merged nodes have no type-wise relations either.

    Args:
        graph: the graph.

    Returns:
        ``(deduplicated graph, new_id)`` where ``new_id[v]`` is the node of the new graph that
        computes old node ``v``'s value (outputs are mapped with it). A kept node keeps its
        ``instance`` (the first instance using the value). If nothing repeats, ``graph``
        itself is returned with the identity map.
    """
    n = graph.num_nodes
    leaves = np.flatnonzero(graph.operand_free_types[graph.op_ids])
    key = graph.op_ids[leaves].astype(np.int64) << 40 | (graph.attrs[leaves] + 1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if len(first) == len(leaves):
        return graph, np.arange(n, dtype=np.int64)
    rep = np.arange(n, dtype=np.int64)
    rep[leaves] = leaves[first][inverse]  # the first node of each group (lowest id)
    keep = rep == np.arange(n)
    new_id = (np.cumsum(keep) - 1)[rep]
    arity = graph.arity[keep]
    ptr = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(arity, out=ptr[1:])
    kept_edges = np.repeat(keep, graph.arity)
    operands = new_id[graph.operand_ids[kept_edges]]
    small = Graph.from_arrays(graph.vocab, graph.op_ids[keep], ptr, operands,
                              attrs=graph.attrs[keep], instance=graph.instance[keep],
                              outputs=new_id[graph.outputs], depth=graph.depth[keep],
                              validate=False)
    _ORIGIN[small] = (graph, keep, new_id)
    return small, new_id


#: deduplicated graph -> (original graph, kept mask, new_id): lets analyses of the original
#: (e.g. its type-wise graph, assembled from cached per-instance parts) carry over.
_ORIGIN: weakref.WeakKeyDictionary[Graph, tuple[Graph, NDArray[np.bool_], NDArray[np.int64]]] = (
    weakref.WeakKeyDictionary())


def dedupe_origin(graph: Graph) -> tuple[Graph, NDArray[np.bool_], NDArray[np.int64]] | None:
    """``(original, kept mask, new_id)`` if ``graph`` came from :func:`dedupe_leaves`."""
    return _ORIGIN.get(graph)
