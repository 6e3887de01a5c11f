"""Boosted trees on the afterstate score: the compiled tree sum against its numpy oracle,
the loss gradient against finite differences, boosting lowers the loss, and the compiled
loop with trees schedules as the Python twin does with the same trees (and differently
from the linear score alone: the trees are not ignored)."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.schedule import run_policy
from edbatch.schedule._compiled_afterstate import (
    AFTER_FEATURES,
    afterstate_trace,
    run_afterstate,
    run_afterstate_tree,
    tree_score,
)
from edbatch.schedule.compiled import core_schedule
from edbatch.workloads import make_workload
from policies.afterstate import AfterstateTwin, afterstate_inputs, afterstate_start
from policies.afterstate_trees import boost, segment_grad, tree_batches, tree_predict
from policies.priority import FEATURES
from tests.policies.conftest import same_schedule

F = len(FEATURES)
W = F + len(AFTER_FEATURES)


def _random_trees(rng: np.random.Generator, n: int, depth: int) -> tuple:  # type: ignore[type-arg]
    nodes: list[list[float]] = []
    roots = []

    def grow(d: int) -> int:
        me = len(nodes)
        nodes.append([-1.0, 0.0, -1.0, -1.0, float(rng.normal())])
        if d < depth and rng.random() < 0.8:
            nodes[me][:2] = [float(rng.integers(W)), float(rng.random())]
            nodes[me][2] = float(grow(d + 1))
            nodes[me][3] = float(grow(d + 1))
        return me

    for _ in range(n):
        roots.append(grow(0))
    return np.array(nodes), np.array(roots, dtype=np.int64)


def test_compiled_tree_sum_matches_numpy_oracle() -> None:
    rng = np.random.default_rng(0)
    tree, roots = _random_trees(rng, 7, 3)
    x = rng.random((50, W))
    want = tree_predict(x, tree, roots)
    got = [tree_score(r[:F].copy(), r[F:].copy(), tree, roots) for r in x]
    assert np.allclose(got, want) and np.ptp(want) > 0
    assert tree_predict(x, tree, roots[:0]).tolist() == [0.0] * 50


def test_segment_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    seg = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    target = np.array([1, 0, 1, 0, 1, 0, 0, 1, 0], bool)
    s = rng.normal(size=9)
    g, h, _ = segment_grad(s, seg, target, 3)
    assert np.all(h >= 0)
    for i in range(9):
        e = np.zeros(9)
        e[i] = 1e-6
        up, down = segment_grad(s + e, seg, target, 3)[2], segment_grad(s - e, seg, target, 3)[2]
        num = (up - down) / 2e-6
        assert -g[i] / 3 == pytest.approx(num, abs=1e-6)  # g: minus the gradient of the sum


def test_boosting_lowers_the_loss_and_rejects_bad_settings() -> None:
    rng = np.random.default_rng(2)
    n = 200
    x = rng.random((3 * n, W))
    seg = np.repeat(np.arange(n), 3)
    # the teacher takes the row of the largest x[:, 3] * (x[:, 5] > 0.5): not linear
    v = (x[:, 3] * (x[:, 5] > 0.5)).reshape(n, 3)
    target = (v == v.max(axis=1, keepdims=True)).ravel()
    active = np.zeros(W, bool)
    active[[3, 5]] = True
    tree, _, losses = boost(x, seg, target, n, np.zeros(3 * n), active, 30, depth=2)
    assert losses[-1] < 0.7 * losses[0]
    assert set(tree[tree[:, 0] >= 0, 0].astype(int)) <= {3, 5}
    with pytest.raises(ValueError, match="depth=0"):
        boost(x, seg, target, n, np.zeros(3 * n), active, 3, depth=0)


class _TreeTwin(AfterstateTwin):
    def __init__(self, w: np.ndarray, tree: np.ndarray, roots: np.ndarray) -> None:
        super().__init__(w)
        self.tree, self.roots = tree, roots

    def score(self, row: list[float]) -> float:
        return super().score(row) + float(tree_predict(np.array([row]), self.tree,
                                                       self.roots)[0])


@pytest.fixture(scope="module")
def lattices() -> list:  # type: ignore[type-arg]
    return list(make_workload("lattice_lstm").batches("train", 6, limit=2))


def test_trees_steer_the_compiled_loop_as_the_twin(lattices: list) -> None:  # type: ignore[type-arg]
    """Critical path's weights plus one stump on ``miss2`` (weight 0 in the linear part, so
    the loop must compute that column for the trees): the schedules are the twin's, and
    differ from critical path's on some graph; no trees is the linear loop exactly."""
    w = afterstate_start()
    col = F + AFTER_FEATURES.index("miss2")
    tree = np.array([[col, 0.25, 1, 2, 0.0], [-1, 0, -1, -1, 0.0], [-1, 0, -1, -1, -50.0]])
    roots = np.array([0], dtype=np.int64)
    changed = 0
    for g in lattices:
        gi = afterstate_inputs(g)
        rows, _ = afterstate_trace(*gi, w, 10000)  # type: ignore[call-arg]
        assert rows[:, col].max() > 0.25  # the stump sees both sides
        a = run_afterstate_tree(*gi, w, tree, roots)  # type: ignore[call-arg]
        assert same_schedule(_sched(a), run_policy(g, _TreeTwin(w, tree, roots)))
        lin = run_afterstate(*gi, w)  # type: ignore[call-arg]
        none = run_afterstate_tree(*gi, w, tree[:0], roots[:0])  # type: ignore[call-arg]
        assert np.array_equal(lin[0], none[0]) and np.array_equal(lin[3], none[3])
        changed += not (len(a[0]) == len(lin[0]) and np.array_equal(a[0], lin[0]))
    assert changed > 0
    counts = tree_batches([afterstate_inputs(g) for g in lattices], w, tree, roots)
    assert counts.tolist() == [len(run_afterstate_tree(*afterstate_inputs(g), w, tree, roots)[0])
                               for g in lattices]


def _sched(res):  # type: ignore[no-untyped-def]
    return core_schedule(res[0], res[1], res[2], res[3], "trees", 0.0)
