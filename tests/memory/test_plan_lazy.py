"""``MemoryPlan.of_flat``: a planned plan's row orders and output regions are made on first
access; the executor's training run reads the flat arrays alone, and the objects made later
are the plan's (what ``flat_order`` and ``output_rows`` hold)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.executor import TorchExecutor, init_params
from edbatch.memory import MemoryPlan, Region, plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload


@pytest.mark.parametrize("strategy", ["naive", "aligned"])
def test_row_orders_and_regions_made_on_first_access(strategy: str) -> None:
    wl = make_workload("module_net")
    graph = wl.minibatch("val", range(12))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy, cache=False)  # type: ignore[arg-type]
    params = init_params(wl, torch.Generator().manual_seed(0))
    for p in params.values():
        p.requires_grad_(True)
    TorchExecutor().run(graph, schedule, plan, params, grad=True).loss.backward()  # type: ignore[union-attr]
    assert "row_order" not in plan.__dict__ and "outputs" not in plan.__dict__
    assert plan.num_batches == schedule.num_batches > 10
    order, (arena, start) = plan.flat_order(), plan.output_rows()
    counts = plan.row_counts()
    assert "row_order" not in plan.__dict__ and counts.dtype == np.int64
    rows = plan.row_order
    assert plan.row_order is rows and len(rows) == plan.num_batches
    assert all(r.dtype == np.int32 and not r.flags.writeable for r in rows)
    np.testing.assert_array_equal(np.concatenate(rows), order)
    assert [len(r) for r in rows] == [len(b) for b in schedule.batches] == counts.tolist()
    assert all(isinstance(r, Region) for r in plan.outputs)
    assert [(r.arena, r.start) for r in plan.outputs] == list(zip(arena, start, strict=True))
    assert all(len(r) == len(o) for r, o in zip(plan.outputs, rows, strict=True))
    for b, r in enumerate(rows):  # each batch's nodes sit in its region, in row order
        np.testing.assert_array_equal(plan.node_row[r], np.arange(start[b], start[b] + len(r)))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = plan.nope  # type: ignore[attr-defined]


def test_a_plan_built_whole_answers_the_flat_accessors() -> None:
    plan = MemoryPlan("naive", ((3, 2),), np.array([0, 1, 2]), np.zeros(3, np.int32),
                      (np.array([1, 0], np.int32), np.array([2], np.int32)),
                      (Region(0, 0, 2), Region(0, 2, 3)), ((), ()))
    assert plan.flat_order().tolist() == [1, 0, 2] and plan.num_batches == 2
    assert plan.output_rows() == ([0, 0], [0, 2])
    assert plan.row_counts().tolist() == [2, 1]
