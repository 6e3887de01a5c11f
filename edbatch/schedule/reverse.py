"""Reversing a graph (sinks become sources), for schedulers that work backwards."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import _segments

__all__ = ["reverse_graph", "reversed_operands"]


def reversed_operands(graph: Graph) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The reversed graph's operand CSR ``(ptr, ids)``: node ``v`` becomes ``w = N - 1 - v``
    and its operands are ``v``'s users (in :attr:`Graph.users` order), mapped the same way."""
    n = graph.num_nodes
    uptr, uids = graph.users
    lens = np.diff(uptr)[::-1]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    idx, _ = _segments(uptr, np.arange(n - 1, -1, -1, dtype=np.int64))
    return ptr, n - 1 - uids[idx].astype(np.int64)


def reverse_graph(graph: Graph) -> Graph:
    """Return the graph with every edge flipped; node ``v`` becomes ``N - 1 - v``.

    Operand slots lose their meaning (shapes are not checked), so the result is only for
    scheduling, never for execution.
    """
    ptr, operand_ids = reversed_operands(graph)
    return Graph.from_arrays(graph.vocab, graph.op_ids[::-1], ptr, operand_ids.astype(np.int32),
                             attrs=graph.attrs[::-1], instance=graph.instance[::-1],
                             validate=False)
