"""MemoScheduler and the per-instance type-wise analysis."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.schedule import MemoScheduler, bounds, make_scheduler
from edbatch.workloads import make_workload


def test_memo_reuses_by_structure_not_identity() -> None:
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=4)
    calls = []

    def scheduler(graph):  # type: ignore[no-untyped-def]
        calls.append(graph)
        return make_scheduler("depth")(graph)

    memo = MemoScheduler(scheduler, size=2)
    dev = wl.load("dev")
    a = memo(wl.build_graph(dev[:3]))
    assert memo(wl.build_graph(dev[:3])) is a  # new object, same structure
    memo(wl.build_graph(dev[3:6]))  # another structure
    memo(wl.build_graph(dev[6:9]))  # evicts the first (size 2)
    memo(wl.build_graph(dev[:3]))
    assert (memo.hits, memo.misses, len(calls)) == (1, 4, 4)
    with pytest.raises(ValueError, match="size"):
        MemoScheduler(scheduler, size=0)


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger", "seq2seq"])
@pytest.mark.parametrize("granularity", ["cell", "primitive"])
def test_typewise_by_instance_equals_whole_graph(name: str, granularity: str) -> None:
    wl = make_workload(name, granularity=granularity, embed_dim=4, hidden_dim=4)
    graph = wl.build_graph(wl.load(wl.default_eval_split)[:3])
    split = bounds._typewise_by_instance(graph)
    assert split is not None
    for x, y in zip(split, bounds._typewise_small(graph), strict=True):
        assert np.array_equal(x, y)


def test_typewise_by_instance_declines_shared_nodes() -> None:
    from edbatch.graph import GraphBuilder, OpType, Vocab

    b = GraphBuilder(Vocab([OpType("x", "lookup", (), (1,)),
                            OpType("f", "add", ((1,), (1,)), (1,))]))
    b.instance = 0
    x0 = b.add("x")
    y0 = b.add("f", x0, x0)
    b.instance = 1
    x1 = b.add("x")
    y = b.add("f", y0, x1)  # instance 1 reads a non-leaf of instance 0, and "f" is used below
    b.add("f", y, x1)
    assert bounds._typewise_by_instance(b.build()) is None


@pytest.mark.parametrize("name", ["tree_lstm", "bilstm_tagger", "lattice_lstm"])
def test_typewise_by_instance_after_dedupe(name: str) -> None:
    from edbatch.graph import dedupe_leaves

    wl = make_workload(name, granularity="cell", embed_dim=4, hidden_dim=4)
    graph, _ = dedupe_leaves(wl.build_graph(wl.load(wl.default_eval_split)[:16]))
    split = bounds._typewise_by_instance(graph)
    assert split is not None  # shared leaves are inert, so the split still applies
    for x, y in zip(split, bounds._typewise_small(graph), strict=True):
        assert np.array_equal(x, y)


def test_plans_and_schedules_are_not_shared_across_model_sizes() -> None:
    """Equal op names, other widths: the structure keys (and so the plan memo) differ."""
    import torch

    from edbatch.executor import TorchExecutor, init_params
    from edbatch.memory import plan_memory

    graphs, losses = [], []
    for hidden in (6, 5):
        wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=hidden)
        g = wl.build_graph(wl.load("dev")[:3])
        graphs.append(g)
        s = make_scheduler("depth")(g)
        plan = plan_memory(g, s, "planned")  # memoised
        assert plan.arenas[0][1] in (2 * hidden, 1)
        res = TorchExecutor().run(g, s, plan, init_params(wl, torch.Generator().manual_seed(0)))
        losses.append(res.loss)
    assert graphs[0].structure_key() != graphs[1].structure_key()


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_typewise_carries_over_through_dedupe(name: str) -> None:
    from edbatch.graph import dedupe_leaves

    wl = make_workload(name, granularity="cell", embed_dim=4, hidden_dim=4)
    merged = wl.minibatch(wl.default_eval_split, range(12))  # has per-instance provenance
    small, _ = dedupe_leaves(merged)
    derived = bounds.typewise_graph(small)  # from the merged graph's parts
    for x, y in zip(derived, bounds._typewise_small(small), strict=True):
        assert np.array_equal(x, y)
