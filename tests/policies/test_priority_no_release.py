"""The priority trainer without the release features (``trainer.release=false``): their
weights stay exactly 0, so the run-time loop keeps no release sums (the cheap path), and
that policy schedules as the Python twin does; bad combinations are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.graph import Graph
from edbatch.schedule import run_policy
from edbatch.schedule._compiled_priority import _uses_release
from edbatch.workloads import make_workload
from policies.priority import FEATURES, PriorityTwin
from policies.priority_train import PriorityTrainer, searched

RELEASE = slice(FEATURES.index("rel_log"), FEATURES.index("lead") + 1)


@pytest.fixture(scope="module")
def graphs() -> list[Graph]:
    return list(make_workload("module_net", granularity="cell").batches("test", 16, limit=4))


def test_searched_holds_the_release_columns() -> None:
    on, off = searched(0, False), searched(0, False, release=False)
    assert on[RELEASE].all() and not off[RELEASE].any()
    assert RELEASE.stop - RELEASE.start == 7
    rest = np.ones(len(on), np.bool_)
    rest[RELEASE] = False
    assert np.array_equal(on[rest], off[rest])  # nothing else changes


def test_trained_without_release_keeps_no_release_sums(graphs: list[Graph]) -> None:
    res = PriorityTrainer(iterations=3, population=8, elite=2, release=False,
                          step_weight=10.0).fit(graphs[:2], graphs[2:])
    policy = res.policy
    assert policy.metadata["release"] is False
    assert np.all(policy.weights[RELEASE] == 0.0)
    assert not _uses_release(policy.weights, 0)
    for g in graphs:  # the cheap path schedules as the oracle
        ref = run_policy(g, PriorityTwin(policy.weights))
        got = policy(g)
        assert [b.op_id for b in got.batches] == [b.op_id for b in ref.batches]
        assert all(np.array_equal(a.node_ids, b.node_ids)
                   for a, b in zip(got.batches, ref.batches, strict=True))


def test_with_release_the_search_moves_them(graphs: list[Graph]) -> None:
    res = PriorityTrainer(iterations=3, population=8, elite=2).fit(graphs[:2], graphs[2:])
    assert res.policy.metadata["release"] is True
    if res.policy.learned:  # every sampled vector moved the release weights
        assert np.any(res.policy.weights[RELEASE] != 0.0)


@pytest.mark.parametrize("kw", [{"hidden_units": 2}, {"context": True}])
def test_bad_release_combination_is_one_line(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="release=False") as e:
        PriorityTrainer(release=False, **kw)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
