"""Reversing a graph (sinks become sources), for schedulers that work backwards."""

from __future__ import annotations

import numpy as np

from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import _segments

__all__ = ["reverse_graph"]


def reverse_graph(graph: Graph) -> Graph:
    """Return the graph with every edge flipped; node ``v`` becomes ``N - 1 - v``.

    Operand slots lose their meaning (shapes are not checked), so the result is only for
    scheduling, never for execution.
    """
    n = graph.num_nodes
    uptr, uids = graph.users
    # New node w = n-1-v; its operands are v's users, mapped the same way.
    lens = np.diff(uptr)[::-1]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    idx, _ = _segments(uptr, np.arange(n - 1, -1, -1, dtype=np.int64))
    order = uids[idx]
    operand_ids = (n - 1 - order.astype(np.int64)).astype(np.int32)
    return Graph.from_arrays(graph.vocab, graph.op_ids[::-1], ptr, operand_ids,
                             attrs=graph.attrs[::-1], instance=graph.instance[::-1],
                             validate=False)
