"""The linear priority policy's lean pick (:mod:`edbatch.schedule._compiled_priority_lean`:
only the columns with a non-zero weight, scored as computed) makes the same choices as the
full rows and ``_best``, and as the Python twin: same batches, same override counts, on
module networks, lattices and random DAGs, for sparse weights (any column may be 0)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.graph import Graph
from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority import run_priority
from edbatch.schedule._compiled_priority_ctx import FIRST_CONTEXT
from edbatch.schedule._compiled_priority_lean import lean_ok
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_dag, random_lattices
from policies.priority import PriorityTwin, critical_path_weights, graph_inputs, num_params
from tests.policies.conftest import assert_lean_equals_full


def _sparse(rng: np.random.Generator, p_zero: float) -> np.ndarray:
    """Linear weights over the row features (context 0), each 0 with probability
    ``p_zero``, the gap kept large so the schedules stay sensible."""
    w = np.zeros(num_params(0))
    w[:FIRST_CONTEXT] = rng.normal(0.0, 0.5, FIRST_CONTEXT)
    w[:FIRST_CONTEXT][rng.random(FIRST_CONTEXT) < p_zero] = 0.0
    w[0] += 1.0
    return w


@pytest.fixture(scope="module")
def real_graphs() -> list[Graph]:
    out = list(make_workload("module_net", granularity="cell").batches("test", 16, limit=2))
    out += list(make_workload("lattice_lstm").batches("train", 3, limit=1))
    return out


@pytest.mark.parametrize("p_zero", [0.0, 0.3, 0.7, 1.0])
def test_lean_pick_equals_the_full_rows_on_real_graphs(real_graphs: list[Graph],
                                                       p_zero: float) -> None:
    rng = np.random.default_rng(int(10 * p_zero))
    for g in real_graphs:
        for _ in range(3):
            assert_lean_equals_full(g, _sparse(rng, p_zero))
        assert_lean_equals_full(g, critical_path_weights())


def test_lean_pick_equals_the_twin(real_graphs: list[Graph]) -> None:
    rng = np.random.default_rng(7)
    for g in real_graphs[:2]:
        w = _sparse(rng, 0.4)
        ref = run_policy(g, PriorityTwin(w))
        bop, _, bptr, nodes, _, _ = run_priority(*graph_inputs(g), w, 0)  # type: ignore[call-arg]
        assert bop.tolist() == [b.op_id for b in ref.batches]
        assert all(np.array_equal(np.sort(nodes[lo:hi]), b.node_ids)
                   for lo, hi, b in zip(bptr, bptr[1:], ref.batches))


def test_lean_is_only_for_linear_rows_without_context() -> None:
    w = critical_path_weights()
    assert lean_ok(w, 0)
    w[FIRST_CONTEXT] = 0.5
    assert not lean_ok(w, 0)
    assert not lean_ok(critical_path_weights(2), 2)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["lattice", "dag"]),
       p_zero=st.sampled_from([0.0, 0.5, 0.9]))
def test_lean_pick_equals_the_full_rows_on_random_graphs(seed: int, kind: str,
                                                         p_zero: float) -> None:
    rng = np.random.default_rng(seed)
    if kind == "lattice":
        g = random_lattices(rng, int(rng.integers(1, 5)), int(rng.integers(2, 12)),
                            int(rng.integers(1, 5)))
    else:
        g = random_dag(rng, int(rng.integers(5, 60)), int(rng.integers(1, 6)),
                       int(rng.integers(1, 5)), unbatchable_prob=float(rng.uniform(0, 0.3)))
    assert_lean_equals_full(g, _sparse(rng, p_zero))
