"""The planner's Operand builder in C (``edbatch/memory/_fastplan.c``) against its Python
twin (``edbatch.memory._operands.operands_py``, the oracle): the same Operands, Regions and
gather rows on every real workload and strategy, random DAGs and the corner cases; and a
bad call gets a clear error, not a crash."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings

from edbatch.graph import Graph
from edbatch.memory import _operands, plan_memory
from edbatch.memory.plan import MemoryPlan, Operand
from edbatch.schedule import make_scheduler
from edbatch.workloads import REAL_CASES
from tests.schedule.test_compiled import minibatch
from tests.schedule.test_properties import graphs

needs_c = pytest.mark.skipif(_operands._fastplan is None,
                             reason="edbatch.memory._fastplan not built (no C compiler)")


def _plan(graph: Graph, scheduler: str, strategy: str, builder: object,
          monkeypatch: pytest.MonkeyPatch) -> MemoryPlan:
    monkeypatch.setattr(_operands, "build", builder)
    return plan_memory(graph, make_scheduler(scheduler)(graph), strategy,  # type: ignore[arg-type]
                       cache=False)


def assert_same(got: Sequence[Sequence[Operand]], want: Sequence[Sequence[Operand]]) -> None:
    assert type(got) is tuple and len(got) == len(want)
    for b, (g_ops, w_ops) in enumerate(zip(got, want, strict=True)):
        assert type(g_ops) is tuple and len(g_ops) == len(w_ops), b
        for g, w in zip(g_ops, w_ops, strict=True):
            assert type(g) is Operand and g.arena == w.arena and type(g.arena) is int
            if w.view is None:
                assert g.view is None and g.gather is not None and w.gather is not None
                np.testing.assert_array_equal(g.gather, w.gather)
                assert g.gather.dtype == np.int64 and not g.gather.flags.writeable
            else:
                assert g.gather is None and g.view == w.view  # arena, start, stop
                assert (g.view.start, g.view.stop) == (w.view.start, w.view.stop)


@needs_c
@pytest.mark.parametrize("strategy", ["naive", "aligned", "planned"])
@pytest.mark.parametrize(("workload", "granularity"), REAL_CASES)
def test_c_builder_equals_the_python_twin(workload: str, granularity: str, strategy: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    graph = minibatch(workload, granularity)
    for scheduler in ("depth", "critical_path"):
        want = _plan(graph, scheduler, strategy, _operands.operands_py, monkeypatch)
        got = _plan(graph, scheduler, strategy, _operands._fastplan.operands, monkeypatch)
        assert_same(got.operands, want.operands)
        assert got.outputs == want.outputs


@needs_c
@settings(max_examples=30, deadline=None)
@given(graphs())
def test_c_builder_equals_the_python_twin_on_random_dags(graph: Graph) -> None:
    schedule = make_scheduler("dynet_agenda")(graph)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_operands, "build", _operands.operands_py)
        want = plan_memory(graph, schedule, "naive", cache=False)
        m.setattr(_operands, "build", _operands._fastplan.operands)
        got = plan_memory(graph, schedule, "naive", cache=False)
    assert_same(got.operands, want.operands)


@needs_c
def test_direct_call_corner_cases() -> None:
    """Batches without reads get empty tuples; a view covers ``first..last`` inclusive; a
    gather is the slice ``rows[lo:hi]`` (empty allowed)."""
    rows = np.array([4, 7, 7, 1, 2, 3], np.int64)
    rows.setflags(write=False)
    args = (4, [2, 0, 2, 0], [True, False, False, True], [1, 0, 3, 2], [0, 1, 3, 3],
            [1, 3, 3, 6], [4, 7, 1, 1], [4, 7, 1, 3], rows)
    got = _operands._fastplan.operands(*args)
    assert_same(got, _operands.operands_py(*args))
    assert got[1] == () and got[3] == ()
    assert (got[2][0].view.arena, got[2][0].view.start, got[2][0].view.stop) == (1, 4, 5)
    assert got[0][0].gather.tolist() == [7, 7] and got[2][1].gather.tolist() == []
    assert _operands._fastplan.operands(0, [], [], [], [], [], [], [], rows) == ()


@needs_c
@pytest.mark.parametrize(("args", "error", "match"), [
    ((2, [5], [True], [0], [0], [1], [0], [0]), IndexError, "read 0 of batch 5"),
    ((2, [0], [True], [0, 1], [0], [1], [0], [0]), TypeError, "arena must be a list of 1"),
    ((-1, [], [], [], [], [], [], []), TypeError, "batches >= 0"),
])
def test_bad_calls_raise(args: tuple[object, ...], error: type, match: str) -> None:
    rows = np.arange(3, dtype=np.int64)
    with pytest.raises(error, match=match):
        _operands._fastplan.operands(*args, rows)
