"""dedupe_leaves: repeated operand-free nodes merged, values and gradients unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.executor import init_params, reference_loss, run_reference
from edbatch.graph import GraphBuilder, OpType, Vocab, dedupe_leaves
from edbatch.workloads import make_workload

VOCAB = Vocab([OpType("emb", "lookup", (), (2,), ("E",)), OpType("f", "tanh", ((2,),), (2,)),
               OpType("g", "add", ((2,), (2,)), (2,))])


def test_merges_equal_op_and_attr_only() -> None:
    b = GraphBuilder(VOCAB)
    x = [b.add("emb", attr=w) for w in (7, 3, 7, 3, 5)]
    y = [b.add("f", v) for v in x]
    out = b.add("g", y[0], y[2])
    g, new_id = dedupe_leaves(b.build([out, y[4]]))
    assert g.num_nodes == 3 + 5 + 1
    assert new_id[:5].tolist() == [0, 1, 0, 1, 2]
    # users of a dropped leaf read the kept one; order and outputs are remapped
    assert [int(g.operands(int(new_id[y[k]]))[0]) for k in range(5)] == [0, 1, 0, 1, 2]
    assert g.outputs.tolist() == [int(new_id[out]), int(new_id[y[4]])]
    g.validate()


def test_no_repeats_returns_the_graph_itself() -> None:
    b = GraphBuilder(VOCAB)
    g = b.build([b.add("f", b.add("emb", attr=1))])
    same, new_id = dedupe_leaves(g)
    assert same is g and new_id.tolist() == [0, 1]


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_workload_values_and_gradients_unchanged(name: str) -> None:
    wl = make_workload(name, granularity="cell", embed_dim=6, hidden_dim=5)
    graph = wl.build_graph(wl.load(wl.default_eval_split)[:8])
    small, _ = dedupe_leaves(graph)
    assert small.num_nodes < graph.num_nodes
    params = {k: p.requires_grad_(True) for k, p in
              init_params(wl, torch.Generator().manual_seed(0)).items()}
    a, b = reference_loss(graph, params), reference_loss(small, params)
    torch.testing.assert_close(a, b)
    ga = torch.autograd.grad(a, list(params.values()), allow_unused=True)
    gb = torch.autograd.grad(b, list(params.values()), allow_unused=True)
    for x, y in zip(ga, gb, strict=True):
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_output_values_follow_the_map() -> None:
    wl = make_workload("tree_lstm", granularity="cell", embed_dim=4, hidden_dim=3)
    graph = wl.build_graph(wl.load("dev")[:4], loss_sum=False)
    small, new_id = dedupe_leaves(graph)
    params = init_params(wl, torch.Generator().manual_seed(1))
    before, after = run_reference(graph, params), run_reference(small, params)
    for v in graph.outputs.tolist():
        assert torch.equal(before[v], after[int(new_id[v])])
    assert np.all(np.diff(small.outputs) > 0)
