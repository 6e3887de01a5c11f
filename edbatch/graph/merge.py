"""Merging per-instance graphs into one mini-batch graph (a disjoint union)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edbatch.errors import GraphError
from edbatch.graph.ir import Graph

__all__ = ["MergeProvenance", "merge_graphs", "merge_provenance"]


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
    if not graphs:
        raise GraphError("merge_graphs needs at least one graph; got an empty sequence")
    vocab = graphs[0].vocab
    for i, g in enumerate(graphs):
        if g.vocab is not vocab and g.vocab != vocab:
            raise GraphError(f"graph {i} has a different vocabulary than graph 0; merge only "
                             f"graphs emitted by the same workload")
    # Concatenate each field once and shift the ids by one repeated offset array (not one
    # small numpy add per graph: merging 64 cached graphs costs a few numpy calls, not 300).
    count = len(graphs)
    sizes = np.fromiter((len(g.op_ids) for g in graphs), np.int64, count)
    edge_sizes = np.fromiter((len(g.operand_ids) for g in graphs), np.int64, count)
    inst_sizes = np.fromiter((g.num_instances for g in graphs), np.int64, count)
    out_sizes = np.fromiter((len(g.outputs) for g in graphs), np.int64, count)
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
    _PROVENANCE[merged] = MergeProvenance(tuple(graphs), tuple(node_off.tolist()),
                                          int(merged.num_nodes - 1) if reduce_op is not None
                                          else None)
    return merged
