"""The projection groups' readiness from the graph (``_ready_nodes``: each hoisted slot's
producer batch by node) equals the plan-based oracle (``_ready``: the producer batch of
every row the plan reads), on the hoisted workloads, schedulers and plans."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.executor._hoist import hoist_kinds, hoisted_batches
from edbatch.executor._hoist_ready import ready as _ready
from edbatch.executor._hoist_ready import ready_nodes as _ready_nodes
from edbatch.executor._reads import RowLocator
from edbatch.executor.cells_hoist import HOISTS
from edbatch.memory import plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads import make_workload


@pytest.mark.parametrize("scheduler", ["depth", "critical_path", "dynet_agenda"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "seq2seq",
                                  "bilstm_char_tagger"])
def test_ready_from_graph_equals_plan_oracle(name: str, scheduler: str) -> None:
    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.minibatch(wl.default_eval_split, range(8))
    compared = 0
    for schedule in (make_scheduler(scheduler)(graph),):
        bare = Schedule(schedule.batches, schedule.scheduler)  # flat() from the batches
        for strategy in ("naive", "planned"):
            plan = plan_memory(graph, schedule, strategy, cache=False)
            batch_of = RowLocator(plan).batch_of
            for s in (schedule, bare):
                _, bptr, nodes, _ = s.flat()
                step = np.empty(graph.num_nodes, np.int64)
                step[nodes] = np.repeat(np.arange(len(bptr) - 1), np.diff(bptr))
                for op_id, batches in hoisted_batches(graph, s, plan,
                                                      hoist_kinds(True)).items():
                    op = graph.vocab[op_id]
                    if op.arity is None:
                        continue
                    slots = HOISTS[op.kind].hoisted
                    assert _ready_nodes(graph, s, step, batches, slots) == \
                        _ready(plan, batch_of, batches, slots)
                    compared += 1
    assert compared
