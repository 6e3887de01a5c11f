"""GraphBuilder: ids, depth, and immediate errors for bad use."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError, UnknownNameError
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab


def test_builder_hands_out_ids_in_order_and_computes_depth(two_trees: Graph) -> None:
    g = two_trees
    assert g.num_nodes == 13
    assert g.depth.tolist() == [0, 0, 1, 0, 2, 3, 4, 0, 0, 1, 2, 3, 5]
    assert g.instance.tolist() == [0] * 7 + [1] * 5 + [0]
    assert g.outputs.tolist() == [12]
    assert g.operands(12).tolist() == [6, 11]


def test_builder_rejects_unknown_op_name_with_hint(vocab: Vocab) -> None:
    b = GraphBuilder(vocab)
    with pytest.raises(UnknownNameError, match="'laef'.*Did you mean 'leaf'"):
        b.add("laef")


def test_builder_rejects_op_id_out_of_range(vocab: Vocab) -> None:
    with pytest.raises(GraphError, match="unknown op id 9"):
        GraphBuilder(vocab).add(9)


def test_builder_rejects_wrong_arity(vocab: Vocab) -> None:
    b = GraphBuilder(vocab)
    x = b.add("leaf")
    with pytest.raises(GraphError, match=r"node %1 \(node\) gets 1 operands.*exactly 2"):
        b.add("node", x)


@pytest.mark.parametrize("bad", [1, 5, -1])
def test_builder_rejects_forward_reference(vocab: Vocab, bad: int) -> None:
    b = GraphBuilder(vocab)
    b.add("leaf")
    with pytest.raises(GraphError, match=rf"operand 0 refers to %{bad}"):
        b.add("tanh", bad)
    assert len(b) == 1  # nothing half-added


def test_builder_rejects_non_int_operand(vocab: Vocab) -> None:
    b = GraphBuilder(vocab)
    b.add("leaf")
    with pytest.raises(GraphError, match="must be node ids"):
        b.add("tanh", "0")  # type: ignore[arg-type]


def test_build_reports_shape_mismatch_naming_node_and_slot() -> None:
    vocab = Vocab([OpType("a", "lookup", (), (3,)), OpType("b", "lookup", (), (4,)),
                   OpType("f", "add", ((3,), (4,)), (4,))])
    b = GraphBuilder(vocab)
    x, y = b.add("a"), b.add("b")
    b.add("f", y, x)  # swapped
    with pytest.raises(GraphError, match=r"shape mismatch at node %2 \(f\) operand 0: %1 \(b\) "
                                         r"produces shape \(4,\)"):
        b.build()


def test_variadic_op_accepts_any_arity(vocab: Vocab) -> None:
    b = GraphBuilder(vocab)
    leaves = [b.add("loss", b.add("leaf")) for _ in range(5)]
    s = b.add("sum", *leaves)
    g = b.build([s])
    assert g.arity[s] == 5
    assert np.array_equal(g.operands(s), leaves)


@pytest.mark.parametrize("attr", [1.5, 2.0, "3", None])
def test_builder_rejects_an_attr_that_is_no_integer(vocab: Vocab, attr: object) -> None:
    """np.asarray(attrs, dtype=int64) cut 1.5 to 1 and read '3' as 3, silently."""
    b = GraphBuilder(vocab)
    b.add("leaf", attr=4)
    b.add("leaf", attr=attr)  # type: ignore[arg-type]
    with pytest.raises(GraphError, match=rf"node %1: attr {attr!r} .* is not an integer"):
        b.build()


def test_builder_keeps_integer_attrs_of_every_kind(vocab: Vocab) -> None:
    b = GraphBuilder(vocab)
    for attr in (3, np.int64(4), np.int32(-1)):
        b.add("leaf", attr=attr)  # type: ignore[arg-type]
    assert b.build().attrs.tolist() == [3, 4, -1]
