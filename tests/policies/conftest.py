"""Fixtures shared by the learner tests: small lattice mini-batches, a compiled state key
evaluated on per-type arrays, a priority twin forced along a prefix, whether two schedules
are the same, and the check that the priority policy's run-time loop schedules as its full
rows do."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from edbatch.graph import Graph
from edbatch.schedule import FrontierView
from edbatch.schedule._compiled_priority import run_priority
from edbatch.workloads import make_workload
from policies.priority import PriorityTwin, graph_inputs


def same_schedule(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Whether schedules ``a`` and ``b`` run the same batches (op, forced, nodes) in order."""
    return a.num_batches == b.num_batches and all(
        x.op_id == y.op_id and x.forced == y.forced and np.array_equal(x.node_ids, y.node_ids)
        for x, y in zip(a.batches, b.batches, strict=True))


@pytest.fixture(scope="module")
def lattice() -> tuple[list, list]:
    """Lattice-LSTM train mini-batches of 8: the first to train on, two to check."""
    graphs = list(make_workload("lattice_lstm").batches("train", 8, limit=3))
    return graphs[:1], graphs[1:]


@pytest.fixture(scope="module")
def lattice4():  # type: ignore[no-untyped-def]
    """One Lattice-LSTM train mini-batch of 4 (the priority learners' rollout values)."""
    return next(iter(make_workload("lattice_lstm").batches("train", 4, limit=1)))


class ForcedTwin(PriorityTwin):
    """The priority policy's Python twin, except that its first decisions follow ``prefix``
    (the schedule a rollout value of one deviation stands for)."""

    def __init__(self, weights: np.ndarray, prefix: list[int], hidden: int = 0) -> None:
        super().__init__(weights, hidden)
        self.prefix, self.t = prefix, 0

    def choose(self, view: FrontierView) -> int:
        a = self.prefix[self.t] if self.t < len(self.prefix) else super().choose(view)
        self.t += 1
        return a


def _compiled_key(fn, ready, tw, height) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    k = len(ready)
    out = np.empty(4 * k + 8, np.int64)
    n = fn(k, ready.astype(np.int64), tw.astype(np.int64), np.where(ready > 0, height, -1),
           np.zeros(k, np.int64), np.zeros(k), np.ones(k, np.bool_), out)
    return tuple(out[:n].tolist())


@pytest.fixture
def compiled_key() -> Callable[..., tuple[int, ...]]:
    """``compiled_key(key_fn, ready, tw, height)``: the key a compiled key function
    (``edbatch.schedule._compiled_keys``) writes for these per-type arrays (unready types:
    no height; no remaining counts; every type batchable)."""
    return _compiled_key


def assert_lean_equals_full(graph: Graph, w: np.ndarray) -> None:
    """``run_priority`` with ``lean`` (for a linear ``w`` without context weights the fused
    loop) gives the schedule, overrides and decisions of the full feature rows."""
    inputs = graph_inputs(graph)
    lean = run_priority(*inputs, w, 0, True)  # type: ignore[call-arg]
    full = run_priority(*inputs, w, 0, False)  # type: ignore[call-arg]
    for x, y in zip(lean[:4], full[:4], strict=True):
        assert np.array_equal(x, y)
    assert lean[4:] == full[4:]
