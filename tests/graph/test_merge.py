"""merge_graphs: disjoint union with shifted ids, and the optional reduce node."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType, Vocab, merge_graphs
from tests.conftest import left_chain_tree, small_vocab


def _tree(leaves: int):
    b = GraphBuilder(small_vocab())
    out = b.add("loss", left_chain_tree(b, leaves))
    return b.build([out])


def test_merge_equals_building_in_one_builder() -> None:
    vocab = small_vocab()
    parts = [_tree(k) for k in (1, 3, 2)]
    parts = [p.__class__.from_arrays(vocab, p.op_ids, p.operand_ptr, p.operand_ids,
                                     attrs=p.attrs, outputs=p.outputs) for p in parts]
    merged = merge_graphs(parts, reduce_op="sum")
    b = GraphBuilder(vocab)
    outs = []
    for i, k in enumerate((1, 3, 2)):
        b.instance = i
        outs.append(b.add("loss", left_chain_tree(b, k)))
    b.instance = 0
    direct = b.build([b.add("sum", *outs)])
    for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "depth",
                  "outputs"):
        assert np.array_equal(getattr(merged, field), getattr(direct, field)), field
    merged.validate()


def test_merge_of_merges_shifts_instances_and_outputs() -> None:
    """Parts with several instances and outputs (merged themselves), no reduce node."""
    sizes = ((2, 1), (3,), (1, 4, 2))
    parts = [merge_graphs([_tree(k) for k in ks]) for ks in sizes]
    merged = merge_graphs(parts)
    b = GraphBuilder(small_vocab())
    outs = []
    for i, k in enumerate(k for ks in sizes for k in ks):
        b.instance = i
        outs.append(b.add("loss", left_chain_tree(b, k)))
    direct = b.build(outs)
    for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "depth",
                  "outputs"):
        assert np.array_equal(getattr(merged, field), getattr(direct, field)), field
    assert merged.num_instances == 6


def test_merge_rejects_mixed_vocabularies() -> None:
    g1 = _tree(2)
    other = GraphBuilder(Vocab([OpType("z", "lookup", (), (1,))]))
    other.add("z")
    with pytest.raises(GraphError, match="different vocabulary"):
        merge_graphs([g1, other.build()])


def test_merge_rejects_empty() -> None:
    with pytest.raises(GraphError, match="at least one graph"):
        merge_graphs([])
