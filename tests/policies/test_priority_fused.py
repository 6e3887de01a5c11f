"""The fused priority loop (:mod:`edbatch.schedule._compiled_priority_fused`: cached own
terms, incremental join and wait, the release upkeep written out) schedules as the full
feature rows and ``_best`` do (``run_priority(..., lean=False)``) and as the Python twin:
same batches, nodes, override and decision counts, on every workload that builds without
files outside the repository, for dense, sparse and release-only weights."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority import run_priority
from edbatch.schedule._compiled_priority_ctx import FIRST_CONTEXT
from edbatch.schedule._compiled_priority_fused import fused_schedule
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_dag
from policies.priority import PriorityTwin, critical_path_weights, graph_inputs, num_params
from tests.policies.conftest import assert_lean_equals_full

WORKLOADS = ["tree_lstm", "tree_gru", "mvrnn", "lattice_lstm", "lattice_gru", "bilstm_tagger",
             "seq2seq", "ggnn_molecules", "tree_lstm_sick", "module_net", "moe",
             "transition_parser", "bilstm_char_tagger"]


def _weights(rng: np.random.Generator, kind: str) -> np.ndarray:
    w = np.zeros(num_params(0))
    w[:FIRST_CONTEXT - 1] = rng.normal(0.0, 0.5, FIRST_CONTEXT - 1)  # far (22) held at 0
    if kind == "sparse":
        w[:FIRST_CONTEXT][rng.random(FIRST_CONTEXT) < 0.5] = 0.0
    elif kind == "release":  # only the gap and the release columns
        w[1:15] = 0.0
    elif kind == "far":
        w[22] = rng.normal(0.0, 0.5)
    w[0] += 1.0
    return w


@pytest.mark.parametrize("name", WORKLOADS)
def test_fused_loop_equals_the_full_rows_on_every_workload(name: str) -> None:
    graph = next(iter(make_workload(name).batches("train", 8, limit=1)))
    rng = np.random.default_rng(len(name))
    for kind in ("dense", "sparse", "release", "far"):
        assert_lean_equals_full(graph, _weights(rng, kind))
    assert_lean_equals_full(graph, critical_path_weights())


def test_fused_loop_equals_the_twin_on_module_net_cells() -> None:
    graph = next(iter(make_workload("module_net", granularity="cell").batches("test", 16,
                                                                              limit=1)))
    w = _weights(np.random.default_rng(3), "dense")
    ref = run_policy(graph, PriorityTwin(w))
    bop, _, bptr, nodes, over, dec = run_priority(*graph_inputs(graph), w, 0)  # type: ignore[call-arg]
    assert bop.tolist() == [b.op_id for b in ref.batches]
    assert all(np.array_equal(nodes[lo:hi], b.node_ids)
               for lo, hi, b in zip(bptr, bptr[1:], ref.batches))
    assert 0 < over < dec  # the learned-like weights do override critical path


def test_without_release_weights_no_release_sums_are_kept() -> None:
    graph = random_dag(np.random.default_rng(5), 40, 4, 3, unbatchable_prob=0.2)
    w = _weights(np.random.default_rng(5), "dense")
    w[15:22] = 0.0
    inputs = graph_inputs(graph)
    a = fused_schedule(*inputs, w, False)  # type: ignore[call-arg]
    b = run_priority(*inputs, w, 0, False)  # type: ignore[call-arg]
    assert all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))


@pytest.mark.parametrize("seed", range(12))
def test_fused_loop_equals_the_full_rows_on_random_dags(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    g = random_dag(rng, int(rng.integers(5, 80)), int(rng.integers(1, 7)),
                   int(rng.integers(1, 5)), unbatchable_prob=float(rng.uniform(0, 0.3)))
    assert_lean_equals_full(g, _weights(rng, ("dense", "sparse", "release")[seed % 3]))


@pytest.mark.parametrize("seed", range(4))
def test_fused_loop_equals_the_full_rows_and_the_twin_with_over_64_op_types(seed: int) -> None:
    """Over 64 op types a node's ready-operand types take several 64-bit words (type 63,
    the sign bit, and types in the second and third words included)."""
    rng = np.random.default_rng(200 + seed)
    g = random_dag(rng, 300, 150, 4, unbatchable_prob=0.1)
    assert len(graph_inputs(g)[5]) > 128
    w = _weights(rng, ("dense", "release")[seed % 2])
    assert_lean_equals_full(g, w)
    ref = run_policy(g, PriorityTwin(w))
    bop, _, bptr, nodes, _, _ = run_priority(*graph_inputs(g), w, 0)  # type: ignore[call-arg]
    assert bop.tolist() == [b.op_id for b in ref.batches]
    assert all(np.array_equal(nodes[lo:hi], b.node_ids)
               for lo, hi, b in zip(bptr, bptr[1:], ref.batches))
