"""Synthetic generators and the synthetic workload."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.errors import GraphError, UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import lower_bound, run_policy
from edbatch.schedule.heuristics import TypewiseGreedyPolicy
from edbatch.workloads import LOSS_SUM, GraphSampler, make_workload
from edbatch.workloads.synthetic import (
    SOLO,
    SyntheticWorkload,
    chains,
    random_binary_trees,
    random_dag,
    random_lattices,
    synthetic_vocab,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _same(a: Graph, b: Graph) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("op_ids", "operand_ptr", "operand_ids", "instance", "outputs"))


def _names(g: Graph) -> set[str]:
    return {g.vocab[int(t)].name for t in np.unique(g.op_ids)}


def test_vocab_layout() -> None:
    v = synthetic_vocab(3)
    assert v.names == ("t0", "t1", "t2", SOLO, LOSS_SUM)
    assert v.batchable.tolist() == [True, True, True, False, False]
    with pytest.raises(GraphError):
        synthetic_vocab(0)


def test_binary_trees_are_full_binary_trees() -> None:
    g = random_binary_trees(_rng(1), num_trees=20, max_leaves=9)
    g.validate()
    assert g.num_instances == 20 and len(g.outputs) == 20
    leaf, node = g.op_ids == 0, g.op_ids == 1
    assert _names(g) <= {"t0", "t1"}
    assert np.all(g.arity[leaf] == 0) and np.all(g.arity[node] == 2)
    users = np.bincount(g.operand_ids, minlength=g.num_nodes)
    assert np.all(users[g.outputs] == 0) and np.all(np.delete(users, g.outputs) == 1)
    per_tree = np.bincount(g.instance[leaf], minlength=20)
    assert per_tree.min() >= 1 and per_tree.max() <= 9
    assert np.array_equal(np.bincount(g.instance[node], minlength=20), per_tree - 1)


def test_chains_respect_length_and_types() -> None:
    g = chains(_rng(2), num_chains=15, max_len=7, num_types=4)
    g.validate()
    assert np.all(g.arity <= 1) and g.op_ids.max() < 4
    lengths = np.bincount(g.instance, minlength=15)
    assert lengths.min() >= 1 and lengths.max() <= 7
    assert np.all(g.depth[g.outputs] == lengths - 1)


def test_lattices_structure() -> None:
    g = random_lattices(_rng(3), num=6, max_states=12, max_span=3)
    g.validate()
    op = g.op_ids
    assert np.all(g.arity[op == 3] == 0)  # start states
    assert np.all(g.arity[(op == 0) | (op == 1)] == 1)  # arcs read one state
    for v in np.flatnonzero(op == 2).tolist():  # states read their arcs: one char arc
        arcs = g.operands(v)
        assert np.sum(op[arcs] == 0) == 1 and np.all((op[arcs] == 0) | (op[arcs] == 1))
    assert np.all(op[g.outputs] != 0) and len(g.outputs) == 6


@pytest.mark.parametrize("span", [None, 3])
def test_random_dag_bounds(span: int | None) -> None:
    g = random_dag(_rng(4), num_nodes=60, num_types=3, max_fan_in=3, max_span=span)
    g.validate()
    assert g.num_nodes == 60 and g.arity.max() <= 3
    assert _names(g) <= {"t0", "t1", "t2"}
    consumer = np.repeat(np.arange(60), g.arity)
    assert np.all(consumer > g.operand_ids)
    if span is not None:
        assert np.all(consumer - g.operand_ids <= span)
    users = np.bincount(g.operand_ids, minlength=60)
    assert g.outputs.tolist() == np.flatnonzero(users == 0).tolist()
    for v in range(60):  # operands are distinct
        assert len(set(g.operands(v).tolist())) == g.arity[v]


def test_random_dag_unbatchable_probability() -> None:
    assert _names(random_dag(_rng(5), 30, 2, 2, unbatchable_prob=1.0)) == {SOLO}
    assert SOLO not in _names(random_dag(_rng(5), 30, 2, 2, unbatchable_prob=0.0))
    mixed = random_dag(_rng(5), 200, 2, 2, unbatchable_prob=0.3)
    assert 20 < int((~mixed.batchable_node).sum()) < 100


def test_generators_are_deterministic_given_the_generator() -> None:
    for make in (lambda r: random_binary_trees(r, 5, 8), lambda r: chains(r, 5, 8, 3),
                 lambda r: random_lattices(r, 3, 8, 3), lambda r: random_dag(r, 30, 3, 3)):
        assert _same(make(_rng(7)), make(_rng(7)))


def test_generator_arguments_are_checked() -> None:
    with pytest.raises(GraphError, match="num_nodes must be an integer >= 1"):
        random_dag(_rng(), 0, 3, 2)
    with pytest.raises(GraphError, match="unbatchable_prob"):
        random_dag(_rng(), 5, 3, 2, unbatchable_prob=1.5)
    with pytest.raises(GraphError, match="max_span"):
        random_dag(_rng(), 5, 3, 2, max_span=0)
    with pytest.raises(GraphError, match="max_leaves"):
        random_binary_trees(_rng(), 2, 0)


@pytest.mark.parametrize("kind", ["dag", "trees", "chains", "lattices"])
def test_workload_splits_and_minibatches(kind: str) -> None:
    w = SyntheticWorkload(kind, num_instances=40, seed=3)
    assert w.splits == ("train", "dev", "test")
    assert [len(w.load(s)) for s in w.splits] == [32, 4, 4]
    assert w.param_shapes() == {}
    g = w.minibatch("train", [0, 1, 2])
    g.validate()
    assert g.num_instances == 3 and g.vocab is w.vocab
    assert w.vocab[int(g.op_ids[g.outputs[0]])].name == LOSS_SUM
    assert _same(g, SyntheticWorkload(kind, num_instances=40, seed=3).minibatch("train", [0, 1, 2]))
    assert not _same(w.instance_graph("train", 0), w.instance_graph("test", 0))
    sched = run_policy(g, TypewiseGreedyPolicy())
    sched.validate(g)
    assert sched.num_batches >= lower_bound(g)


def test_workload_options_registry_and_errors() -> None:
    w = make_workload("synthetic", kind="dag", num_instances=10, num_nodes=12, num_types=5)
    assert isinstance(w, SyntheticWorkload) and len(w.vocab) == 7
    assert w.instance_graph("train", 0).num_nodes == 12
    trees = SyntheticWorkload("trees", num_instances=10, max_leaves=3)
    assert trees.instance_graph("dev", 0).num_nodes <= 5
    assert GraphSampler(trees, "train", 4)(_rng()).num_instances == 4
    with pytest.raises(UnknownNameError, match="Did you mean 'trees'"):
        SyntheticWorkload("tree")
    with pytest.raises(UnknownNameError, match="num_nodes"):
        SyntheticWorkload("trees", num_nodes=3)
    with pytest.raises(UnknownNameError, match="granularity"):
        SyntheticWorkload(granularity="cel")


@pytest.mark.parametrize(("kind", "options", "match"), [
    ("dag", {"num_nodes": -4}, "num_nodes must be an integer >= 1, got -4"),
    ("dag", {"num_nodes": "abc"}, "num_nodes must be an integer >= 1, got 'abc'"),
    ("dag", {"num_types": 1.5}, r"num_types must be an integer >= 1, got 1\.5"),
    ("dag", {"max_fan_in": -1}, "max_fan_in must be an integer >= 0, got -1"),
    ("dag", {"unbatchable_prob": 2}, r"unbatchable_prob must be a number in \[0, 1\], got 2"),
    ("dag", {"max_span": 0}, "max_span must be an integer >= 1, got 0"),
    ("trees", {"max_leaves": 0}, "max_leaves must be an integer >= 1, got 0"),
    ("chains", {"max_len": True}, "max_len must be an integer >= 1, got True"),
    ("lattices", {"max_span": -2}, "max_span must be an integer >= 1, got -2"),
])
def test_workload_generator_options_are_checked_when_made(kind: str, options: dict,
                                                          match: str) -> None:
    """(``num_nodes=-4`` failed in numpy at the first graph, ``max_leaves=0`` made empty
    instances.)"""
    with pytest.raises(GraphError, match=match):
        SyntheticWorkload(kind, **options)
    assert SyntheticWorkload("dag", max_span=None).options["max_span"] is None
