"""The compiled policies hand their batch arrays over with their schedules
(:func:`edbatch.schedule.compiled.core_schedule`), as the compiled heuristics do: the planner and
the program then read them instead of recomputing them from the batches, so a learned policy
does not pay a per-schedule pass over its batches that critical path does not."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.schedule import make_scheduler
from edbatch.schedule.schedule import _flat_of
from edbatch.workloads import make_workload
from policies.afterstate import AfterstatePolicy, afterstate_start
from policies.priority import PriorityPolicy, critical_path_weights, num_params
from policies.priority_fsm import PriorityFSM, RankKey


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return next(iter(make_workload("module_net", granularity="cell").batches("test", 12,
                                                                           limit=1)))


def _schedulers():  # type: ignore[no-untyped-def]
    w = critical_path_weights() + np.random.default_rng(5).normal(0.0, 0.5, num_params())
    key = RankKey(3, ("wait_gain", "rel_join"), ((0.25,), (0.1, 0.5)))
    return {"priority": PriorityPolicy(w), "afterstate": AfterstatePolicy(afterstate_start()),
            "priority_fsm": PriorityFSM(key, {}),
            "rollout": make_scheduler("rollout")}


@pytest.mark.parametrize("name", ["priority", "afterstate", "priority_fsm", "rollout"])
def test_compiled_policy_hands_its_flat_arrays_over(graph, name: str) -> None:  # type: ignore[no-untyped-def]
    s = _schedulers()[name](graph)
    assert "_flat" in s.__dict__, f"{name} left Schedule.flat to be recomputed"
    for x, y in zip(s.flat(), _flat_of(s.batches), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert s.seconds > 0.0
    cp = make_scheduler("critical_path")(graph)
    assert "_flat" in cp.__dict__
