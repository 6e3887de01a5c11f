"""merge_graphs: disjoint union with shifted ids, and the optional reduce node."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType, Vocab, merge_graphs
from edbatch.graph.merge import PackedGraphs, merge_provenance
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


_FIELDS = ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "depth", "outputs")


@pytest.mark.parametrize("reduce_op", [None, "sum"])
def test_packed_merge_equals_merge_graphs(reduce_op: str | None) -> None:
    """``PackedGraphs.merge`` = ``merge_graphs`` of the selection (fields, dtypes,
    provenance): parts of several instances and outputs, repeats, any order."""
    rng = np.random.default_rng(0)
    parts = [_tree(k) for k in (1, 3, 2, 5)] + [merge_graphs([_tree(2), _tree(4)])]
    packed = PackedGraphs(parts)
    for idx in ([4], [2, 0, 4], [1, 1, 3], *(rng.integers(0, 5, 7) for _ in range(5))):
        want = merge_graphs([parts[i] for i in idx], reduce_op=reduce_op)
        have = packed.merge(idx, reduce_op=reduce_op)
        for field in _FIELDS:
            a, b = getattr(want, field), getattr(have, field)
            assert a.dtype == b.dtype and np.array_equal(a, b), field
        assert merge_provenance(have) == merge_provenance(want)
        have.validate()


def test_packed_merge_rejects_bad_indices_and_inputs() -> None:
    packed = PackedGraphs([_tree(1), _tree(2)])
    with pytest.raises(GraphError, match="graph index 2 out of range"):
        packed.merge([0, 2])
    with pytest.raises(GraphError, match="graph index -1 out of range"):
        packed.merge([-1])
    with pytest.raises(GraphError, match="at least one graph index"):
        packed.merge([])
    with pytest.raises(GraphError, match="at least one graph"):
        PackedGraphs([])
    other = GraphBuilder(Vocab([OpType("z", "lookup", (), (1,))]))
    other.add("z")
    with pytest.raises(GraphError, match="different vocabulary"):
        PackedGraphs([_tree(1), other.build()])
