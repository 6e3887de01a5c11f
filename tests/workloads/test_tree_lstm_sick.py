"""tree_lstm_sick: graphs match the SICK trees, the variadic node batches across child
counts, batched loss and gradients equal the node-by-node reference (fp64), bad input."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.data.sick import load_sick, similarity_target
from edbatch.errors import GraphError, UnknownNameError
from edbatch.executor import init_params, reference_loss
from edbatch.executor.cells_sick import score_target
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, GraphBuilder
from edbatch.memory import STRATEGIES, plan_memory
from edbatch.schedule import HEURISTICS, lower_bound, make_scheduler
from edbatch.workloads import DATA_DIR, LOSS_SUM, make_workload
from edbatch.workloads.tree_lstm_sick import TreeLSTMSick, relatedness_metrics

TOL = 1e-6


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@functools.cache
def small() -> TreeLSTMSick:
    return TreeLSTMSick(embed_dim=6, hidden_dim=5, sim_dim=4)


def test_registered_and_vocab() -> None:
    wl = make_workload("tree_lstm_sick", embed_dim=4, hidden_dim=3, sim_dim=2)
    assert isinstance(wl, TreeLSTMSick)
    node = wl.vocab[wl.vocab.id("tree_lstm_sick.node")]
    assert node.in_shapes is None and node.batchable  # one variadic op type
    assert wl.param_shapes()["tree_lstm_sick.U_f"] == (3, 3)
    assert wl.param_shapes()["tree_lstm_sick.E"] == (wl.num_words, 4)


def test_graph_matches_the_trees() -> None:
    """Every token is an embed node and a node whose operands are its word and its
    children's nodes (attr = child count); the sim node reads both roots."""
    wl = small()
    pairs = load_sick(DATA_DIR / "sick" / "dev")
    for k in (0, 7, 123):
        graph = wl.instance_graph("dev", k)
        pair = pairs[k]
        assert graph.num_nodes == 2 * (len(pair.a) + len(pair.b)) + 1
        ops = graph.op_ids
        node_op, embed_op = wl.vocab.id("tree_lstm_sick.node"), wl.vocab.id("tree_lstm_sick.embed")
        nodes = np.flatnonzero(ops == node_op)
        counts = sorted(len(kids) for t in (pair.a, pair.b) for kids in t.children[1:])
        assert sorted(graph.attrs[nodes].tolist()) == counts
        assert (graph.arity[nodes] == graph.attrs[nodes] + 1).all()
        first = graph.operand_ids[graph.operand_ptr[nodes]]
        assert (ops[first] == embed_op).all()
        words = sorted(wl.word_ids.get(w.lower(), 0) for t in (pair.a, pair.b) for w in t.words)
        assert sorted(graph.attrs[ops == embed_op].tolist()) == words
        (sim,) = graph.outputs
        assert graph.attrs[sim] == round(pair.score * 1000)
        assert graph.arity[sim] == 2


def test_score_target_matches_similarity_target() -> None:
    scores = sorted({p.score for p in load_sick(DATA_DIR / "sick" / "train")})
    attrs = torch.tensor([round(s * 1000) for s in scores])
    got = score_target(attrs, 5, torch.float64)
    want = torch.tensor([similarity_target(s) for s in scores], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@functools.cache
def reference_case() -> tuple[Graph, dict[str, Tensor], Tensor, list[Tensor]]:
    """12 dev pairs (nodes with 0..>=4 children), fp64, reference loss and gradients."""
    wl = small()
    graph = wl.minibatch("dev", range(12))
    params = dict(init_params(wl, torch.Generator().manual_seed(0), dtype=torch.float64))
    loss = reference_loss(graph, params)
    grads = torch.autograd.grad(loss, list(params.values()))
    return graph, params, loss.detach(), list(grads)


def test_reference_case_is_variadic() -> None:
    graph = reference_case()[0]
    node = graph.op_ids == small().vocab.id("tree_lstm_sick.node")
    assert set(graph.attrs[node].tolist()) >= {0, 1, 2, 3, 4}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("scheduler", HEURISTICS)
def test_batched_equals_reference_fp64(scheduler: str, strategy: str) -> None:
    graph, params, ref_loss, ref_grads = reference_case()
    schedule = make_scheduler(scheduler)(graph)
    node_op = small().vocab.id("tree_lstm_sick.node")
    # nodes with different child counts share batches (the cell is variadic)
    assert any(b.op_id == node_op and len({int(graph.attrs[v]) for v in b.node_ids}) > 1
               for b in schedule.batches)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    executor = TorchExecutor(dtype=torch.float64)
    inference = executor.run(graph, schedule, plan, params)
    assert inference.loss is not None
    torch.testing.assert_close(inference.loss, ref_loss, atol=TOL, rtol=TOL)
    trained = executor.run(graph, schedule, plan, params, grad=True)
    assert trained.loss is not None
    grads = torch.autograd.grad(trained.loss, list(params.values()))
    for name, g, ref in zip(params, grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, atol=TOL, rtol=TOL, msg=f"gradient of {name}")


def test_reference_loss_is_kl_of_the_head() -> None:
    """The loss of one pair is KL(t || p) >= 0, and 0 only if p equals the target."""
    wl = small()
    params = dict(init_params(wl, torch.Generator().manual_seed(1), dtype=torch.float64))
    losses = [reference_loss(wl.minibatch("dev", [k]), params).item() for k in range(5)]
    assert all(v > 0 for v in losses)
    total = reference_loss(wl.minibatch("dev", range(5)), params).item()
    assert total == pytest.approx(sum(losses), rel=1e-12)


def test_lower_bound_and_heuristics_run() -> None:
    wl = small()
    graph = wl.minibatch("dev", range(32))
    lb = lower_bound(graph)
    for name in HEURISTICS:
        assert make_scheduler(name)(graph).num_batches >= lb


def test_metrics() -> None:
    m = relatedness_metrics([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.5])
    assert m["spearman"] == 1.0 and 0.99 < m["pearson"] < 1.0
    assert m["mse"] == pytest.approx((1 + 4 + 9 + 4.5 ** 2) / 4)
    with pytest.raises(ValueError, match="as many predictions"):
        relatedness_metrics([1.0, 2.0], [1.0])


def test_bad_arguments() -> None:
    with pytest.raises(GraphError, match="only the 'cell' granularity"):
        TreeLSTMSick(granularity="primitive")
    with pytest.raises(UnknownNameError, match="granularity"):
        TreeLSTMSick(granularity="cells")
    with pytest.raises(ValueError, match="hidden_dim must be a positive int"):
        TreeLSTMSick(hidden_dim=0)
    with pytest.raises(ValueError, match="vocab_size"):
        TreeLSTMSick(vocab_size=0)
    with pytest.raises(UnknownNameError, match="no split 'validation'"):
        small().load("validation")
    with pytest.raises(GraphError, match="SickInstance"):
        small().emit("a sentence", GraphBuilder(small().vocab))  # type: ignore[arg-type]


def test_vocab_size_caps_word_ids() -> None:
    wl = TreeLSTMSick(embed_dim=2, hidden_dim=2, sim_dim=2, vocab_size=50)
    assert wl.num_words == 50
    graph = wl.minibatch("test", range(20))
    embed = graph.op_ids == wl.vocab.id("tree_lstm_sick.embed")
    assert graph.attrs[embed].max() < 50 and (graph.attrs[embed] == 0).any()
    assert wl.vocab.names[-1] == LOSS_SUM


def test_hand_backward_of_lone_nodes_in_one_arena() -> None:
    """With ``embed_dim == 2 * hidden_dim`` a word and the child states share an arena, so
    a node batch of one node reads its operands as one merged read (a split step); the hand
    backward routes it like the others (fp64 against the reference)."""
    wl = TreeLSTMSick(embed_dim=8, hidden_dim=4, sim_dim=3)
    graph = wl.minibatch("dev", [4, 6])  # trees of unequal heights: lone top nodes
    params = dict(init_params(wl, torch.Generator().manual_seed(1), dtype=torch.float64))
    ref = torch.autograd.grad(reference_loss(graph, params), list(params.values()))
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    executor = TorchExecutor(dtype=torch.float64)
    program, _ = executor._program(graph, schedule, plan)
    assert any(step.split and step.op.kind == "tree_lstm_sick.node" for step in program.steps)
    assert executor._training_function(program).__name__ == "AnalyticRun"
    trained = executor.run(graph, schedule, plan, params, grad=True)
    assert trained.loss is not None
    grads = torch.autograd.grad(trained.loss, list(params.values()))
    for name, g, r in zip(params, grads, ref, strict=True):
        torch.testing.assert_close(g, r, atol=TOL, rtol=TOL, msg=f"gradient of {name}")
