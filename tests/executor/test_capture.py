"""CUDA-graph bookkeeping that needs no GPU: shape keys, when a shape is captured, lookups by
parameter tensors, the LRU, and which runs ask for a capture (the capture itself is faked;
``test_cuda.py`` runs the real one on a GPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from edbatch.executor import init_params
from edbatch.executor._capture import GraphCache, params_key
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload


def _setup(count: int = 3, strategy: str = "planned") -> tuple[Any, Graph, Any, Any]:
    wl = make_workload("tree_lstm", embed_dim=6, hidden_dim=5)
    graph = wl.minibatch("dev", range(count))
    schedule = make_scheduler("typewise_greedy")(graph)
    return wl, graph, schedule, plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]


def _other_attrs(graph: Graph) -> Graph:
    attrs = graph.attrs.copy()
    leaves = np.flatnonzero(graph.op_ids == graph.op_ids[0])
    attrs[leaves] = attrs[leaves[::-1]]
    return dataclasses.replace(graph, attrs=attrs)


def test_a_shape_key_ignores_attrs_but_not_structure_or_strategy() -> None:
    _, graph, schedule, plan = _setup()
    other = _other_attrs(graph)
    assert not np.array_equal(other.attrs, graph.attrs)
    assert GraphCache.key(other, schedule, plan) == GraphCache.key(graph, schedule, plan)
    naive = plan_memory(graph, schedule, "naive")
    assert GraphCache.key(graph, schedule, naive) != GraphCache.key(graph, schedule, plan)
    _, bigger, big_schedule, big_plan = _setup(count=4)
    assert GraphCache.key(bigger, big_schedule, big_plan) != GraphCache.key(graph, schedule, plan)


@pytest.mark.parametrize("after", [0, 1, 3])
def test_a_shape_is_due_for_capture_on_its_after_th_repetition(after: int) -> None:
    cache = GraphCache(capture_after=after)
    assert [cache.due(b"k") for _ in range(after + 2)] == [False] * after + [True, True]
    cache._failed.add(b"bad")
    assert not any(cache.due(b"bad") for _ in range(after + 2))


def test_lookups_match_parameter_tensors_and_the_cache_is_an_lru() -> None:
    cache = GraphCache(size=2)
    params = {"w": torch.zeros(3)}
    for key in (b"a", b"b"):
        cache._store(key, dataclasses.make_dataclass("E", ["params_key"])(params_key(params)))
    assert cache.lookup(b"a", params) is not None  # a is now the most recent
    assert cache.lookup(b"a", {"w": torch.zeros(3)}) is None  # other tensors, same values
    cache._store(b"c", cache.captured[b"b"])
    assert list(cache.captured) == [b"a", b"c"]  # b, the least recently used, dropped
    with pytest.raises(ValueError, match="capture_after"):
        GraphCache(capture_after=-1)


def test_cuda_graphs_are_off_on_the_cpu() -> None:
    assert TorchExecutor("cpu", cuda_graphs=True).graphs is None


def test_which_runs_ask_for_a_capture() -> None:
    wl, graph, schedule, plan = _setup()
    params = dict(init_params(wl, torch.Generator().manual_seed(0)))
    ex = TorchExecutor("cpu")
    ex.graphs = GraphCache(capture_after=1)  # as on CUDA, with the capture faked below
    calls: list[tuple[str, Any]] = []
    ex.graphs.capture = lambda key, program, run, params: calls.append(  # type: ignore
        ("infer", program))
    ex.graphs.capture_training = lambda key, program, fn, params: calls.append(  # type: ignore
        ("train", program))
    for _ in range(3):  # first sight eager; then captured (faked: stays uncaptured)
        ex.run(graph, schedule, plan, params)
    assert [c[0] for c in calls] == ["infer", "infer"]
    cached, _ = ex._program(graph, schedule, plan)
    assert all(program is not cached for _, program in calls)  # compiled for the capture
    frozen = {k: p.detach() for k, p in params.items()}
    calls.clear()
    for _ in range(3):  # nothing to differentiate: never captured
        ex.run(graph, schedule, plan, frozen, grad=True)
    trainable = {k: p.detach().requires_grad_() for k, p in params.items()}
    for _ in range(3):
        ex.run(graph, schedule, plan, trainable, grad=True)
    # the frozen runs counted as sightings of the shape: every trainable run is due (and the
    # faked capture never stores a graph, so each asks again)
    assert [c[0] for c in calls] == ["train"] * 3
    sparse = TorchExecutor("cpu", sparse_grads=True)
    sparse.graphs = GraphCache(capture_after=0)
    sparse.graphs.capture_training = lambda *a: calls.append(("sparse", a))  # type: ignore
    sparse.run(graph, schedule, plan, trainable, grad=True)
    assert calls[-1][0] == "train"  # sparse gradients are never captured
