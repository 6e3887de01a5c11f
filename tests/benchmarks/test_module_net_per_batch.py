"""``benchmarks/module_net_per_batch.py``: every scheduler's phases and what a batch costs
beside critical path; a priority artifact runs as ``learned``."""

from __future__ import annotations

import math

import pytest

from benchmarks.module_net_per_batch import PHASES, _at_cp_cost, main


@pytest.mark.slow
def test_per_batch_costs_and_a_learned_priority_policy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Critical path's weights as a priority artifact schedule as critical path does (same
    batches on the same mini-batches, so no per-batch figure for it); depth needs more
    batches on every mini-batch, so its per-batch cost is a number."""
    from policies.priority import PriorityPolicy, critical_path_weights
    path = PriorityPolicy(critical_path_weights(), learned=False).save(tmp_path / "p.json")
    out = main(["--minibatches", "2", "--batch-size", "8", "--hidden-dim", "4", "--split",
                "test", "--schedulers", "depth", "critical_path", "--policy", str(path)])
    assert out["learned/batches"] == out["critical_path/batches"] > 0
    assert out["depth/batches"] > out["critical_path/batches"]
    assert math.isfinite(out["depth/per_batch_us"]) and "learned/per_batch_us" not in out
    assert all(out[f"{n}/{p}"] > 0 for n in ("depth", "learned") for p in PHASES)
    assert out["learned_items_ratio"] > 0
    # the same schedules: as many program steps as critical path's on every mini-batch
    assert out["learned/steps"] > 0 and out["learned/fewer_steps_share"] == 0.0


@pytest.mark.slow
def test_at_cp_cost_runs_the_policys_schedules(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--at-cp-cost``: a ``learned@cp`` row with the policy's batches (not critical
    path's, which it runs and drops) and its own phases and items/s ratio."""
    import numpy as np

    from policies.priority import PriorityPolicy, critical_path_weights
    w = critical_path_weights()
    w[0], w[1] = 0.0, 1.0  # fill first: not critical path's schedules
    path = PriorityPolicy(w).save(tmp_path / "p.json")
    out = main(["--minibatches", "2", "--batch-size", "8", "--hidden-dim", "4", "--split",
                "test", "--schedulers", "critical_path", "--policy", str(path),
                "--at-cp-cost"])
    assert out["learned@cp/batches"] == out["learned/batches"] != out["critical_path/batches"]
    assert all(out[f"learned@cp/{p}"] > 0 for p in PHASES)
    assert np.isfinite(out["learned@cp_items_ratio"])


def test_at_cp_cost_replays_the_same_batches() -> None:
    """The ``@cp`` row's scheduler (the policy's decisions replayed with critical path's
    weights) makes the policy's schedule: same op ids, same nodes, same forced flags."""
    import numpy as np

    from edbatch.workloads import make_workload
    from policies.priority import PriorityPolicy, critical_path_weights
    w = critical_path_weights()
    w[0], w[1], w[3] = 0.2, 1.0, -0.5  # not critical path's choices
    policy = PriorityPolicy(w)
    for g in make_workload("module_net", granularity="cell").batches("test", 16, limit=2):
        ref = policy(g)
        made = {"learned": np.array([b.op_id for b in ref.batches if not b.forced], np.int64)}
        got = _at_cp_cost(made, "learned")(g)
        assert [(b.op_id, b.forced, b.node_ids.tolist()) for b in got.batches] == \
            [(b.op_id, b.forced, b.node_ids.tolist()) for b in ref.batches]
        cp = policy.fallback_alone()(g)
        assert [b.op_id for b in ref.batches] != [b.op_id for b in cp.batches]


def test_critical_path_is_required(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["--schedulers", "depth"])
    assert "must include critical_path" in capsys.readouterr().err


def test_order_puts_every_scheduler_in_every_position() -> None:
    """The rotating order: with 3 schedulers all 6 orders in 6 mini-batches (forward and
    reverse alone left the second one in the middle), with 2 each first half the time."""
    from itertools import permutations

    from benchmarks.module_net_per_batch import _order
    names = ["critical_path", "learned", "learned@cp"]
    assert sorted(tuple(_order(names, m)) for m in range(6)) == sorted(permutations(names))
    assert [_order(["a", "b"], m)[0] for m in range(4)] == ["a", "b", "b", "a"]
