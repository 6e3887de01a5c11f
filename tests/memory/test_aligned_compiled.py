"""The compiled ``aligned`` layout against the Python one (the oracle): identical row orders."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from edbatch.graph import Graph
from edbatch.memory._aligned import aligned_orders, aligned_orders_python
from edbatch.memory._aligned_compiled import _first_reads, aligned_orders_compiled
from edbatch.memory._first_reads import first_reads
from edbatch.schedule import make_scheduler
from edbatch.workloads import REAL_CASES
from tests.schedule.test_compiled import minibatch
from tests.schedule.test_properties import graphs

SCHEDULERS = ("depth", "dynet_agenda", "critical_path", "typewise_greedy_backward")


def assert_same_orders(graph: Graph) -> None:
    for name in SCHEDULERS:
        schedule = make_scheduler(name)(graph)
        want = aligned_orders_python(graph, schedule)
        got = aligned_orders_compiled(graph, schedule)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype == np.int32
            np.testing.assert_array_equal(g, w, err_msg=f"{name} batch {i}")
        step = schedule.step_of(graph.num_nodes)
        forced = np.array([b.forced for b in schedule.batches], dtype=np.bool_)
        got_reads = _first_reads(graph.operand_ptr.astype(np.int64),
                                 graph.operand_ids.astype(np.int64), step, forced)
        for field, g, w in zip(("arity", "consumer", "slot", "deferred", "first", "slots"),
                               got_reads, first_reads(graph, schedule.batches, step),
                               strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} {field}")


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_aligned_equals_python(workload: str, granularity: str) -> None:
    assert_same_orders(minibatch(workload, granularity))


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_compiled_aligned_equals_python_on_random_dags(graph: Graph) -> None:
    assert_same_orders(graph)


def test_backend_picks_the_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = minibatch("tree_lstm", "cell")
    schedule = make_scheduler("critical_path")(graph)
    monkeypatch.setenv("EDBATCH_BACKEND", "python")
    a = aligned_orders(graph, schedule)
    b = aligned_orders(graph, schedule, backend="compiled")
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
