"""``benchmarks/priority_cost.py``: the fused loop, the per-decision pick it replaced, critical
path and the twin, per decision, with both loops' ratio to critical path."""

from __future__ import annotations

import math

from benchmarks.priority_cost import main
from policies.priority import PriorityPolicy, critical_path_weights


def test_priority_cost_reports_both_loops(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # (one round times every row, the Python twin included: it was timed every fifth only)
    w = critical_path_weights()
    w[15], w[16], w[18] = 0.2, 0.3, -0.4  # release weights: the upkeep runs
    path = PriorityPolicy(w).save(tmp_path / "p.json")
    us = main(["--workload", "module_net", "--granularity", "cell", "--batch-size", "8",
               "--graphs", "1", "--reps", "1", "--policy", str(path)])
    assert all(us[k] > 0 for k in ("priority", "per_call", "critical_path", "python_twin"))
    assert math.isclose(us["priority_over_cp"], us["priority"] / us["critical_path"])
    assert math.isclose(us["per_call_over_cp"], us["per_call"] / us["critical_path"])


def test_priority_cost_times_the_afterstate_policy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from policies.afterstate import AfterstatePolicy, afterstate_start

    w = afterstate_start()
    w[-6:] = 0.3, -0.2, 0.5, -0.4, 0.1, 0.2  # the afterstate rows are computed
    path = AfterstatePolicy(w).save(tmp_path / "a.json")
    us = main(["--workload", "module_net", "--granularity", "cell", "--batch-size", "8",
               "--graphs", "1", "--reps", "1", "--policy", str(path), "--afterstate"])
    assert all(us[k] > 0 for k in ("afterstate", "priority", "critical_path", "python_twin"))
    assert math.isclose(us["afterstate_extra"], us["afterstate"] - us["critical_path"])
