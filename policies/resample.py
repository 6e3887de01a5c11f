"""Resampled mini-batches: new training and check graphs drawn from a graph's own parts.

A mini-batch graph is a union of independent instances (trees, lattices, sentences) joined
only by the loss sum. Drawing its parts again with replacement gives more graphs of the same
kind and size for the table search's training and check sets, without touching the graphs
held out for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edbatch.graph import Graph

__all__ = ["resample_graphs"]


def _parts(graph: Graph) -> list[np.ndarray]:
    """Node sets of the graph's independent parts: weakly connected components once the
    sinks with several operands (a mini-batch's loss sum) are dropped."""
    n = graph.num_nodes
    ptr, ids = graph.operand_ptr.tolist(), graph.operand_ids.tolist()
    uptr, _ = graph.users
    has_users = np.diff(uptr) > 0
    drop = (~has_users) & (np.diff(graph.operand_ptr) > 1) & ~graph.batchable_node
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for v in np.flatnonzero(~drop).tolist():
        for i in range(ptr[v], ptr[v + 1]):
            a, b = find(v), find(ids[i])
            if a != b:
                parent[max(a, b)] = min(a, b)
    roots = np.array([find(v) for v in range(n)])
    keep = np.flatnonzero(~drop)
    order = np.argsort(roots[keep], kind="stable")
    keys = roots[keep][order]
    cuts = np.flatnonzero(np.diff(keys)) + 1
    return [np.sort(part) for part in np.split(keep[order], cuts)]


def resample_graphs(graphs: Sequence[Graph], count: int, rng: np.random.Generator
                    ) -> list[Graph]:
    """``count`` graphs, each as many independent parts as its source graph, drawn with
    replacement from that graph's parts (:func:`_parts`); none if a graph has one part."""
    out: list[Graph] = []
    pools = [(g, _parts(g)) for g in graphs]
    pools = [(g, p) for g, p in pools if len(p) > 1]
    for i in range(count if pools else 0):
        g, parts = pools[i % len(pools)]
        pick = rng.integers(len(parts), size=len(parts))
        ops, ptr, args, offset = [], [0], [], 0
        g_ptr, g_ids, g_op = g.operand_ptr, g.operand_ids, g.op_ids
        for j in pick.tolist():
            nodes = parts[j]
            remap = np.full(g.num_nodes, -1, dtype=np.int64)
            remap[nodes] = offset + np.arange(len(nodes))
            for v in nodes.tolist():
                ops.append(int(g_op[v]))
                args.extend(remap[g_ids[g_ptr[v]:g_ptr[v + 1]]].tolist())
                ptr.append(len(args))
            offset += len(nodes)
        out.append(Graph.from_arrays(g.vocab, np.array(ops), np.array(ptr),
                                     np.array(args, dtype=np.int64)))
    return out
