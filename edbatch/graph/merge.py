"""Merging per-instance graphs into one mini-batch graph (a disjoint union)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edbatch.errors import GraphError
from edbatch.graph.ir import Graph

__all__ = ["MergeProvenance", "PackedGraphs", "merge_graphs", "merge_provenance"]


@dataclass(frozen=True)
class MergeProvenance:
    """How a merged graph was made: its parts, their node offsets and the reduce node."""

    parts: tuple[Graph, ...]
    node_offsets: tuple[int, ...]
    reduce_node: int | None


_PROVENANCE: weakref.WeakKeyDictionary[Graph, MergeProvenance] = weakref.WeakKeyDictionary()


def merge_provenance(graph: Graph) -> MergeProvenance | None:
    """The parts a graph was merged from, if :func:`merge_graphs` made it (else ``None``).

    Analyses that decompose over disjoint parts (the type-wise graph) use this to reuse
    their cached per-part results.
    """
    return _PROVENANCE.get(graph)


def _one_vocab(graphs: Sequence[Graph], who: str, verb: str) -> Any:
    """The vocabulary every graph of ``graphs`` shares (``who`` / ``verb`` name the caller
    in the errors). Raises GraphError: no graphs, or graphs over different vocabularies."""
    if not graphs:
        raise GraphError(f"{who} needs at least one graph; got an empty sequence")
    vocab = graphs[0].vocab
    for i, g in enumerate(graphs):
        if g.vocab is not vocab and g.vocab != vocab:
            raise GraphError(f"graph {i} has a different vocabulary than graph 0; {verb} only "
                             f"graphs emitted by the same workload")
    return vocab


def _part_sizes(graphs: Sequence[Graph]) -> tuple[np.ndarray, ...]:
    """Per graph: its nodes, edges, instances and outputs (``int64`` each)."""
    count = len(graphs)
    return (np.fromiter((len(g.op_ids) for g in graphs), np.int64, count),
            np.fromiter((len(g.operand_ids) for g in graphs), np.int64, count),
            np.fromiter((g.num_instances for g in graphs), np.int64, count),
            np.fromiter((len(g.outputs) for g in graphs), np.int64, count))


def merge_graphs(graphs: Sequence[Graph], *, reduce_op: int | str | None = None) -> Graph:
    """Return the disjoint union of ``graphs``; optionally add one node reducing all outputs.

    Node ids of graph ``i`` are shifted by the sizes of graphs ``0..i-1``; instance ids are
    renumbered so that every instance of the result is distinct. Everything is vectorized,
    so merging cached per-instance graphs is much cheaper than re-building them.

    Args:
        graphs: graphs over one identical vocabulary.
        reduce_op: if given, an op type (id or name, typically an unbatchable variadic
            ``sum``) applied to the concatenated outputs; the new node is the only output.

    Raises:
        GraphError: empty input or graphs over different vocabularies.
    """
    vocab = _one_vocab(graphs, "merge_graphs", "merge")
    # Concatenate each field once and shift the ids by one repeated offset array (not one
    # small numpy add per graph: merging 64 cached graphs costs a few numpy calls, not 300).
    sizes, edge_sizes, inst_sizes, out_sizes = _part_sizes(graphs)
    node_off = np.cumsum(sizes) - sizes
    edge_off = np.cumsum(edge_sizes) - edge_sizes
    inst_off = np.cumsum(inst_sizes) - inst_sizes

    op_ids = np.concatenate([g.op_ids for g in graphs])
    operand_ids = np.concatenate([g.operand_ids for g in graphs])
    operand_ids += np.repeat(node_off.astype(np.int32), edge_sizes)
    operand_ptr = np.empty(len(op_ids) + 1, dtype=np.int64)
    operand_ptr[0] = 0
    np.concatenate([g.operand_ptr[1:] for g in graphs], out=operand_ptr[1:])
    operand_ptr[1:] += np.repeat(edge_off, sizes)
    attrs = np.concatenate([g.attrs for g in graphs])
    instance = np.concatenate([g.instance for g in graphs])
    instance += np.repeat(inst_off.astype(np.int32), sizes)
    depth = np.concatenate([g.depth for g in graphs])
    outputs = np.concatenate([g.outputs for g in graphs])
    outputs += np.repeat(node_off.astype(np.int32), out_sizes)
    return _finish(vocab, tuple(graphs), node_off, op_ids, operand_ptr, operand_ids, attrs,
                   instance, depth, outputs, reduce_op)


def _finish(vocab: Any, parts: tuple[Graph, ...], node_off: np.ndarray, op_ids: np.ndarray,
            operand_ptr: np.ndarray, operand_ids: np.ndarray, attrs: np.ndarray,
            instance: np.ndarray, depth: np.ndarray, outputs: np.ndarray,
            reduce_op: int | str | None) -> Graph:
    """The merged graph of the concatenated fields (the reduce node appended) and its
    provenance (what :func:`merge_graphs` and :meth:`PackedGraphs.merge` share)."""
    if reduce_op is not None:
        op = vocab.id(reduce_op) if isinstance(reduce_op, str) else int(reduce_op)
        arity = vocab[op].arity
        if arity is not None and arity != len(outputs):
            raise GraphError(f"reduce op {vocab[op].name!r} takes {arity} operands but the "
                             f"graphs have {len(outputs)} outputs; use a variadic op")
        n = len(op_ids)
        op_ids = np.append(op_ids, op)
        operand_ids = np.concatenate([operand_ids, outputs])
        operand_ptr = np.append(operand_ptr, len(operand_ids))
        attrs = np.append(attrs, -1)
        instance = np.append(instance, 0)
        depth = np.append(depth, (depth[outputs].max() + 1) if len(outputs) else 0)
        outputs = np.array([n], dtype=np.int32)
    merged = Graph.from_arrays(vocab, op_ids, operand_ptr, operand_ids, attrs=attrs,
                               instance=instance, outputs=outputs, depth=depth, validate=False)
    _PROVENANCE[merged] = MergeProvenance(parts, tuple(node_off.tolist()),
                                          int(merged.num_nodes - 1) if reduce_op is not None
                                          else None)
    return merged


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenated ranges ``starts[k] .. starts[k] + sizes[k]`` (``int64``)."""
    total = int(sizes.sum())
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)


class PackedGraphs:
    """``graphs`` packed once into flat arrays, so that merging any selection of them is a
    few gathers (:meth:`merge`) instead of concatenating the selected graphs' own small arrays
    field by field (64 cached question graphs: one index gather per field, not one
    ``concatenate`` over 64 scattered arrays). :meth:`merge` returns what
    :func:`merge_graphs` returns for the selected graphs (the oracle in the tests).

    Raises:
        GraphError: no graphs, or graphs over different vocabularies.
    """

    def __init__(self, graphs: Sequence[Graph]) -> None:
        self.vocab = _one_vocab(graphs, "PackedGraphs", "pack")
        self.graphs = tuple(graphs)
        self.sizes, self.edge_sizes, self.inst_sizes, self.out_sizes = _part_sizes(graphs)
        self.node_start = np.cumsum(self.sizes) - self.sizes
        self.edge_start = np.cumsum(self.edge_sizes) - self.edge_sizes
        self.out_start = np.cumsum(self.out_sizes) - self.out_sizes
        self.op_ids = np.concatenate([g.op_ids for g in graphs])
        self.degree = np.concatenate([np.diff(g.operand_ptr) for g in graphs])
        self.operand_ids = np.concatenate([g.operand_ids for g in graphs])  # graph-local ids
        self.attrs = np.concatenate([g.attrs for g in graphs])
        self.instance = np.concatenate([g.instance for g in graphs])
        self.depth = np.concatenate([g.depth for g in graphs])
        self.outputs = np.concatenate([g.outputs for g in graphs])

    def __len__(self) -> int:
        return len(self.graphs)

    def merge(self, indices: Sequence[int] | np.ndarray, *,
              reduce_op: int | str | None = None) -> Graph:
        """``merge_graphs([graphs[i] for i in indices], reduce_op=reduce_op)``.

        Raises:
            GraphError: no indices, or an index outside ``0 .. len(graphs) - 1``.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(idx):
            raise GraphError("merge needs at least one graph index; got none")
        bad = idx[(idx < 0) | (idx >= len(self.graphs))]
        if len(bad):
            raise GraphError(f"graph index {int(bad[0])} out of range; {len(self.graphs)} "
                             f"graphs are packed (indices 0 .. {len(self.graphs) - 1})")
        sizes, edge_sizes = self.sizes[idx], self.edge_sizes[idx]
        inst_sizes, out_sizes = self.inst_sizes[idx], self.out_sizes[idx]
        node_off = np.cumsum(sizes) - sizes
        inst_off = np.cumsum(inst_sizes) - inst_sizes
        nodes = _ranges(self.node_start[idx], sizes)
        edges = _ranges(self.edge_start[idx], edge_sizes)
        outs = _ranges(self.out_start[idx], out_sizes)
        operand_ids = self.operand_ids[edges]
        operand_ids += np.repeat(node_off.astype(np.int32), edge_sizes)
        operand_ptr = np.empty(len(nodes) + 1, dtype=np.int64)
        operand_ptr[0] = 0
        np.cumsum(self.degree[nodes], out=operand_ptr[1:])
        instance = self.instance[nodes]
        instance += np.repeat(inst_off.astype(np.int32), sizes)
        outputs = self.outputs[outs]
        outputs += np.repeat(node_off.astype(np.int32), out_sizes)
        graphs = self.graphs
        return _finish(self.vocab, tuple(graphs[i] for i in idx.tolist()), node_off,
                       self.op_ids[nodes], operand_ptr, operand_ids, self.attrs[nodes],
                       instance, self.depth[nodes], outputs, reduce_op)
