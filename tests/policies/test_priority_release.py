"""The compiled priority core keeps its release features (15-21) up to date edge by edge
(:mod:`edbatch.schedule._compiled_release`); the Python twin rescans the frontier at every
decision. Every feature row the compiled core scores must equal the twin's, exactly, on
lattices, module networks and random DAGs with unbatchable nodes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.graph import Graph
from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority import priority_trace
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_binary_trees, random_dag, random_lattices
from policies.priority import (
    FEATURES,
    PriorityPolicy,
    PriorityTwin,
    critical_path_weights,
    graph_inputs,
    num_params,
)

RELEASE = range(15, len(FEATURES))


class _Recorder(PriorityTwin):
    """The twin, keeping the (ids, rows) of every decision."""

    def __init__(self, weights: np.ndarray, hidden: int = 0) -> None:
        super().__init__(weights, hidden)
        self.log: list[tuple[list[int], list[list[float]]]] = []

    def rows(self, view):  # type: ignore[no-untyped-def]
        out = super().rows(view)
        self.log.append(out)
        return out


def _check(graph: Graph, w: np.ndarray, hidden: int = 0) -> int:
    """Assert the compiled rows and schedule equal the twin's; return the decisions."""
    twin = _Recorder(w, hidden)
    ref = run_policy(graph, twin)
    ids = np.array([a for r, _ in twin.log for a in r], dtype=np.int64)
    rows = np.array([x for _, rs in twin.log for x in rs], dtype=np.float64)
    cap = len(ids) + 1
    got_rows, got_ids = priority_trace(*graph_inputs(graph), w, hidden, cap)  # type: ignore[call-arg]
    assert np.array_equal(got_ids, ids)
    for j in range(len(FEATURES)):
        assert np.array_equal(got_rows[:, j], rows[:, j]), FEATURES[j]
    got = PriorityPolicy(w, hidden=hidden)(graph)
    assert got.num_batches == ref.num_batches and all(
        x.op_id == y.op_id and np.array_equal(x.node_ids, y.node_ids)
        for x, y in zip(got.batches, ref.batches))
    return len(twin.log)


def _weights(rng: np.random.Generator, hidden: int = 0, focus: int | None = None) -> np.ndarray:
    """Critical path's weights plus noise; ``focus``: a release feature weighted heavily, so
    it decides."""
    w = critical_path_weights(hidden) + rng.normal(0.0, 0.5, num_params(hidden))
    if focus is not None:
        w[focus] = 3.0 * rng.choice([-1.0, 1.0])
    return w


@pytest.fixture(scope="module")
def real_graphs() -> list[Graph]:
    """Small real mini-batches: module networks (many types) and lattices (long fan-ins)."""
    out = list(make_workload("module_net", granularity="cell").batches("test", 6, limit=2))
    out += list(make_workload("lattice_lstm").batches("train", 3, limit=2))
    return out


@pytest.mark.parametrize("focus", [None, *RELEASE])
def test_release_rows_equal_the_twin_on_real_graphs(real_graphs: list[Graph],
                                                    focus: int | None) -> None:
    rng = np.random.default_rng(100 + (focus or 0))
    for g in real_graphs:
        assert _check(g, _weights(rng, focus=focus)) > 0


def test_release_rows_equal_the_twin_with_hidden_units(real_graphs: list[Graph]) -> None:
    rng = np.random.default_rng(3)
    for g in real_graphs[::2]:
        _check(g, _weights(rng, hidden=3), hidden=3)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["lattice", "dag", "trees"]),
       focus=st.sampled_from([None, *RELEASE]))
def test_release_rows_equal_the_twin_on_random_graphs(seed: int, kind: str,
                                                      focus: int | None) -> None:
    rng = np.random.default_rng(seed)
    if kind == "lattice":
        g = random_lattices(rng, int(rng.integers(1, 5)), int(rng.integers(2, 12)),
                            int(rng.integers(1, 5)))
    elif kind == "dag":
        g = random_dag(rng, int(rng.integers(5, 60)), int(rng.integers(1, 6)),
                       int(rng.integers(1, 5)), unbatchable_prob=float(rng.uniform(0, 0.3)))
    else:
        g = random_binary_trees(rng, int(rng.integers(1, 5)), int(rng.integers(2, 10)))
    _check(g, _weights(rng, focus=focus))


def test_version_1_weights_leave_the_release_features_unread(real_graphs: list[Graph]) -> None:
    """Weights without a say for features 15-21 skip their upkeep: those columns stay 0,
    and the schedule is still the twin's."""
    rng = np.random.default_rng(5)
    w = _weights(rng)
    w[15:] = 0.0
    g = real_graphs[2]
    rows, _ = priority_trace(*graph_inputs(g), w, 0, 10_000)  # type: ignore[call-arg]
    assert len(rows) and not rows[:, 15:22].any()  # 22 (far) is no release feature
    assert not rows[:, 23:].any()  # nor are the context features read
    assert run_policy(g, PriorityTwin(w)).num_batches == PriorityPolicy(w)(g).num_batches
    w = _weights(rng, hidden=2)  # an MLP whose context weights are all 0: columns unread
    f, c0 = len(FEATURES), FEATURES.index("is_cp")
    for o in (0, f, 2 * f + 1):
        w[o + c0:o + f] = 0.0
    rows, _ = priority_trace(*graph_inputs(g), w, 2, 10_000)  # type: ignore[call-arg]
    assert rows[:, 15:22].any() and not rows[:, 23:].any()
    got, ref = PriorityPolicy(w, hidden=2)(g), run_policy(g, PriorityTwin(w, 2))
    assert [b.op_id for b in got.batches] == [b.op_id for b in ref.batches]


def test_context_columns_are_live_and_mean_what_they_say(real_graphs: list[Graph]) -> None:
    """Every context column (23-) varies over a real schedule's rows (a column stuck at one
    value in both the core and the twin would pass the equality tests), and they read as
    documented: ``is_cp`` marks one row per decision, ``o_*`` is the most of the others."""
    from edbatch.schedule._compiled_priority_ctx import CONTEXT_FEATURES, CONTEXT_SOURCES

    rng = np.random.default_rng(11)
    w = _weights(rng)
    c0 = FEATURES.index("is_cp")
    for g in real_graphs[:2]:
        twin = _Recorder(w)
        run_policy(g, twin)
        rows = np.array([x for _, rs in twin.log for x in rs])
        for j, name in enumerate(CONTEXT_FEATURES):
            assert np.ptp(rows[:, c0 + j]) > 0, name
        for _, rs in twin.log:
            x = np.array(rs)
            assert x[:, c0].sum() == 1
            for k, src in enumerate(CONTEXT_SOURCES):
                for i in range(len(x)):
                    others = np.delete(x[:, src], i)
                    assert x[i, c0 + 3 + k] == (others.max() if len(others) else 0.0)
        _check(g, w)


def test_context_columns_follow_the_row_features() -> None:
    """``FIRST_CONTEXT`` (a literal: the context module cannot import the feature list back)
    is where the context names sit in the full row, and every ``o_*`` source is a row
    feature before them."""
    from edbatch.schedule._compiled_priority import PRIORITY_FEATURES
    from edbatch.schedule._compiled_priority_ctx import (
        CONTEXT_FEATURES,
        CONTEXT_SOURCES,
        FIRST_CONTEXT,
    )
    assert PRIORITY_FEATURES[FIRST_CONTEXT:] == CONTEXT_FEATURES
    assert all(0 <= j < FIRST_CONTEXT for j in CONTEXT_SOURCES)
    assert [PRIORITY_FEATURES[j] for j in CONTEXT_SOURCES] == \
        ["fill", "complete", "log_ready", "rel_join", "wait_gain", "cp_feed"]
