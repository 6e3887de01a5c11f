"""The afterstate probe (issue 31): its replay of critical path's states lines up with the
value labels row for row, and its regret counts the picked rows' rollout values."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.afterstate_probe_exp import CANDIDATES, IS_CP, candidate_columns, cv_regret
from edbatch.workloads import make_workload
from policies.afterstate import afterstate_inputs
from policies.afterstate_values import label_values
from policies.priority import FEATURES


@pytest.fixture(scope="module")
def inputs() -> list:
    return [afterstate_inputs(g)
            for g in make_workload("lattice_lstm").batches("train", 6, limit=2)]


def test_replayed_columns_line_up_with_the_labels(inputs: list) -> None:
    x, seg, _, n = label_values(inputs)
    assert n > 10
    # IS_CP names the label rows' "critical path's choice" column: one row a decision
    assert np.array_equal(np.bincount(seg[x[:, IS_CP] > 0.5], minlength=n), np.ones(n))
    c = candidate_columns(inputs)
    assert c.shape == (len(x), len(CANDIDATES))
    # the replay's ready count of each row's type is the compiled row's (log1p / 4 there)
    ready = np.expm1(c[:, CANDIDATES.index("log_ready")] * 5)
    np.testing.assert_allclose(ready, np.expm1(x[:, FEATURES.index("log_ready")] * 4),
                               rtol=1e-9)
    share = c[:, CANDIDATES.index("crit_share")]
    assert np.all((share > 0) & (share <= 1))


def test_regret_sums_the_picked_values() -> None:
    seg = np.array([0, 0, 1, 1, 1, 2, 2])
    v = np.array([0.0, 2.0, 1.0, 0.0, 3.0, 0.0, 1.0])
    assert cv_regret(None, seg, v, 3, lambda tr: v.copy(), folds=3) == 0.0
    assert cv_regret(None, seg, v, 3, lambda tr: -v, folds=3) == 2.0 + 3.0 + 1.0
