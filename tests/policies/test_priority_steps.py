"""The priority trainer's step-aware cost (``trainer.step_weight``): the program steps it
counts are the executor's own (attention segments on CPU), and the CEM minimises
``batches + lam * steps`` under the same guard."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.executor._program import compile_program
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.schedule._compiled_priority import run_priority
from edbatch.schedule._compiled_priority_steps import program_steps, run_priority_costs
from edbatch.workloads import make_workload
from policies.priority import critical_path_weights, graph_inputs
from policies.priority_train import PriorityTrainer, segment_types


@pytest.fixture(scope="module")
def graphs() -> list[Graph]:
    return list(make_workload("module_net", granularity="cell").batches("test", 16, limit=4))


def test_program_steps_are_the_executors(graphs: list[Graph]) -> None:
    ex = TorchExecutor("cpu")
    rng = np.random.default_rng(0)
    for g in graphs:
        seg = segment_types(g)
        assert seg.any() and not seg.all()
        w = critical_path_weights() + rng.normal(0.0, 0.5, len(critical_path_weights()))
        for sched in (make_scheduler("critical_path"), make_scheduler("depth")):
            s = sched(g)
            prog = compile_program(g, s, plan_memory(g, s, "aligned"), ex.device, ex.kernels)
            ops = np.array([b.op_id for b in s.batches], np.int64)
            assert program_steps(ops, seg) == len(prog.steps) < len(ops)
        bop = run_priority(*graph_inputs(g), w, 0)[0]  # type: ignore[call-arg]
        cost = run_priority_costs(*graph_inputs(g), w[None], 0, seg, 2.5)[0]  # type: ignore[call-arg]
        assert cost == len(bop) + 2.5 * program_steps(bop, seg)


def test_program_steps_count_runs() -> None:
    seg = np.array([True, True, False])
    assert program_steps(np.array([2, 0, 1, 0, 2, 1, 2], np.int64), seg) == 5
    assert program_steps(np.zeros(0, np.int64), seg) == 0


def test_step_weight_trains_on_the_step_cost(graphs: list[Graph]) -> None:
    lam = 10.0
    res = PriorityTrainer(iterations=2, population=6, elite=2, step_weight=lam).fit(
        graphs[:2], graphs[2:])
    meta = res.policy.metadata
    assert meta["step_weight"] == lam and meta["objective"] == "batches + 10 x steps"

    def cost(w: np.ndarray, gs: list[Graph]) -> float:
        return sum(float(run_priority_costs(*graph_inputs(g), w[None], 0, segment_types(g),
                                            lam)[0]) for g in gs)  # type: ignore[call-arg]

    w0 = critical_path_weights()
    assert meta["train_fallback_batches"] == cost(w0, graphs[:2])
    if res.policy.learned:
        assert cost(res.policy.weights, graphs[:2]) == meta["train_batches"] < cost(
            w0, graphs[:2])
        assert cost(res.policy.weights, graphs[2:]) <= cost(w0, graphs[2:])


@pytest.mark.parametrize("kw", [{"step_weight": -1.0}, {"step_weight": float("nan")},
                                {"step_weight": 1.0, "api_rounds": 1},
                                {"step_weight": 1.0, "dagger_rounds": 1}])
def test_bad_step_weight_is_one_line(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="step_weight"):
        PriorityTrainer(**kw)  # type: ignore[arg-type]
