"""The ``cand`` key: critical path's three best candidates, best first, with gap and
completeness; its first entry is critical path's own choice on real frontiers."""

from __future__ import annotations

import numpy as np

from edbatch.schedule import CriticalPathPolicy, Frontier
from edbatch.schedule.policy import drive
from edbatch.workloads import make_workload
from envs.encoding import cand_key, encode_state, fallback_action, key_actions


def test_cand_key_orders_by_height_then_fill_then_id() -> None:
    ready = np.array([0, 3, 2, 5, 1, 0])
    tw = np.array([0, 3, 4, 10, 1, 0])
    height = np.array([0, 7, 9, 9, 3, 0])
    # type 2 (h 9, fill 0.5), type 3 (h 9, fill 0.5 -> id order), type 1 (gap 2, complete);
    # type 4 (gap 6) is not among the three
    assert cand_key(ready, tw, height) == (8 * 2, 8 * 3, 8 * 1 + 2 * 2 + 1)
    assert cand_key(np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(3, np.int64)) == ()


def test_cand_key_first_candidate_is_critical_paths_choice() -> None:
    graph = make_workload("module_net").minibatch("val", range(8))
    cp = CriticalPathPolicy()
    seen = []

    def choose(f: Frontier) -> int:
        view = f.view()
        key = encode_state(view, "cand")
        a = cp.choose(view)
        assert key_actions(key, "cand")[0] == a and 1 <= len(key) <= 3
        assert all(view.mask[b] for b in key_actions(key, "cand"))
        seen.append(fallback_action(key, "cand"))
        return a

    drive(Frontier(graph, typewise=True), choose)
    assert seen
