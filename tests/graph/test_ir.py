"""Graph: validation of raw arrays, derived structure, dumps."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError
from edbatch.graph import Graph, OpType, Vocab


def test_from_arrays_rejects_cycle_and_forward_reference(vocab: Vocab) -> None:
    # node 1 uses node 2 (forward reference), node 2 uses node 1: a cycle.
    with pytest.raises(GraphError, match=r"node %1 \(tanh\) refers to %2, which does not exist"):
        Graph.from_arrays(vocab, np.array([0, 2, 2]), np.array([0, 0, 1, 2]), np.array([2, 1]))
    with pytest.raises(GraphError, match=r"refers to itself \(a cycle\)"):
        Graph.from_arrays(vocab, np.array([0, 2]), np.array([0, 0, 1]), np.array([1]))


def test_from_arrays_rejects_unknown_op_and_wrong_arity(vocab: Vocab) -> None:
    with pytest.raises(GraphError, match=r"node %0 has unknown op id 7"):
        Graph.from_arrays(vocab, np.array([7]), np.array([0, 0]), np.array([], np.int32))
    with pytest.raises(GraphError, match=r"node %1 \(node\) has 1 operands"):
        Graph.from_arrays(vocab, np.array([0, 1]), np.array([0, 0, 1]), np.array([0]))


def test_vocab_rejects_duplicate_names() -> None:
    op = OpType("x", "lookup", (), (1,))
    with pytest.raises(GraphError, match="duplicate op type name 'x'"):
        Vocab([op, op])


def test_users_csr_lists_every_consumer_slot(two_trees: Graph) -> None:
    ptr, ids = two_trees.users
    for v in range(two_trees.num_nodes):
        expected = sorted(u for u in range(two_trees.num_nodes)
                          for w in two_trees.operands(u).tolist() if w == v)
        assert sorted(ids[ptr[v]:ptr[v + 1]].tolist()) == expected


@pytest.mark.parametrize("seed", range(6))
def test_users_csr_equals_a_stable_sort_of_the_operands(seed: int) -> None:
    """Compiled counting pass == the stable argsort it replaced (order within a row
    included: ascending users, a repeated operand listed once per slot)."""
    from edbatch.workloads.synthetic import random_dag

    graph = random_dag(np.random.default_rng(seed), 1 + 40 * seed, 3, 3, 0.1)
    ptr, ids = graph.users
    order = np.argsort(graph.operand_ids, kind="stable")
    want = np.repeat(np.arange(graph.num_nodes, dtype=np.int32), graph.arity)[order]
    assert ids.dtype == np.int32 and ptr.dtype == np.int64
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_array_equal(np.diff(ptr), np.bincount(graph.operand_ids,
                                                            minlength=graph.num_nodes))


def test_levels_group_nodes_by_depth(two_trees: Graph) -> None:
    order, ptr = two_trees.levels
    for d in range(len(ptr) - 1):
        assert (two_trees.depth[order[ptr[d]:ptr[d + 1]]] == d).all()


def test_arrays_are_read_only(two_trees: Graph) -> None:
    with pytest.raises(ValueError):
        two_trees.op_ids[0] = 1


def test_str_dump_is_one_line_per_node(two_trees: Graph) -> None:
    text = str(two_trees)
    assert text.splitlines()[0] == "graph(13 nodes, 5 op types, 2 instances)"
    assert "  %12 = sum(%6, %11)" in text
    assert "  %2 = node(%0, %1)" in text


def test_structure_key_depends_on_structure(two_trees: Graph, vocab: Vocab) -> None:
    other = Graph.from_arrays(vocab, two_trees.op_ids, two_trees.operand_ptr,
                              two_trees.operand_ids)
    assert other.structure_key() == two_trees.structure_key()
    ids = two_trees.operand_ids.copy()
    ids[0], ids[1] = ids[1], ids[0]
    changed = Graph.from_arrays(vocab, two_trees.op_ids, two_trees.operand_ptr, ids)
    assert changed.structure_key() != two_trees.structure_key()
