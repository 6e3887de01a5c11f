"""``Schedule.flat``: the compiled core's arrays handed over with its schedules equal what
the batches give (the oracle), and plans and programs made from either are the same."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import Batch, Schedule, make_scheduler
from edbatch.schedule.schedule import _flat_of
from edbatch.workloads import REAL_CASES
from tests.schedule.test_compiled import minibatch


def _same_flat(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_compiled_flat_equals_batches(workload: str, granularity: str) -> None:
    graph = minibatch(workload, granularity)
    for name in ("critical_path", "dynet_agenda"):
        s = make_scheduler(name)(graph)
        assert "_flat" in s.__dict__  # handed over by the core, not recomputed
        _same_flat(s.flat(), _flat_of(s.batches))
        bare = Schedule(s.batches, s.scheduler)  # no arrays: computed from the batches
        _same_flat(bare.flat(), s.flat())
        for strategy in ("naive", "aligned"):
            p, q = (plan_memory(graph, x, strategy, cache=False) for x in (s, bare))
            assert p.arenas == q.arenas and p.outputs == q.outputs and p.forced == q.forced
            np.testing.assert_array_equal(p.node_row, q.node_row)
            np.testing.assert_array_equal(p.node_arena, q.node_arena)
            for o, r in zip(p.row_order, q.row_order, strict=True):
                np.testing.assert_array_equal(o, r)
            for ops, rops in zip(p.operands, q.operands, strict=True):
                assert [(o.view, o.arena) for o in ops] == [(r.view, r.arena) for r in rops]
                for o, r in zip(ops, rops, strict=True):
                    np.testing.assert_array_equal(o.rows(), r.rows())


def test_flat_of_hand_made_schedule() -> None:
    s = Schedule((Batch(2, np.array([0, 3], np.int32)), Batch(0, np.array([1], np.int32),
                                                               True)), "manual")
    ops, ptr, nodes, forced = s.flat()
    assert ops.tolist() == [2, 0] and ptr.tolist() == [0, 2, 3]
    assert nodes.tolist() == [0, 3, 1] and nodes.dtype == np.int64
    assert forced.tolist() == [False, True]
    assert s.flat() is s.flat()  # computed once
    empty = Schedule((), "manual").flat()
    assert [len(a) for a in empty] == [0, 1, 0, 0]


def test_program_from_flat_schedule_runs_like_bare() -> None:
    import torch

    from edbatch.executor import init_params
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm")
    graph = minibatch("tree_lstm", "cell")
    params = init_params(wl, torch.Generator().manual_seed(0))
    s = make_scheduler("critical_path")(graph)
    bare = Schedule(s.batches, s.scheduler)
    losses = []
    for x in (s, bare):
        plan = plan_memory(graph, x, "naive", cache=False)
        losses.append(TorchExecutor().run(graph, x, plan, params).loss)
    assert torch.equal(losses[0], losses[1])


def test_core_schedule_makes_its_batches_on_first_access() -> None:
    """A compiled scheduler's schedule (``Schedule.of_flat``) has no ``Batch`` objects until
    ``batches`` is read: planning and a training run read the arrays alone; then they are the
    batches of those arrays, made once, and survive pickling and copying."""
    import copy
    import pickle

    import torch

    from edbatch.executor import init_params
    from edbatch.workloads import make_workload

    wl = make_workload("tree_lstm")
    graph = minibatch("tree_lstm", "cell")
    s = make_scheduler("critical_path")(graph)
    params = init_params(wl, torch.Generator().manual_seed(0))
    plan = plan_memory(graph, s, "aligned", cache=False)
    TorchExecutor().run(graph, s, plan, params, grad=True)
    assert "batches" not in s.__dict__ and s.num_batches == plan.num_batches > 1
    twin = pickle.loads(pickle.dumps(s))
    batches = s.batches
    assert s.batches is batches and len(batches) == s.num_batches
    _same_flat(_flat_of(batches), s.flat())
    s.validate(graph)
    for other in (twin, copy.deepcopy(twin)):
        assert [(b.op_id, b.node_ids.tolist(), b.forced) for b in other.batches] == \
            [(b.op_id, b.node_ids.tolist(), b.forced) for b in batches]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = s.nope
