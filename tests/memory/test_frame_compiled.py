"""The planner frame's compiled pass (``frame_compiled``: arenas by width, each batch's
region in placement order, each position's row and arena) equals its numpy oracle
(``planner._frame_numpy``) on real schedules and random batch lists."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.memory._classify_compiled import frame_compiled
from edbatch.memory.planner import _frame_numpy, _op_tables
from edbatch.schedule import make_scheduler
from tests.schedule.test_compiled import minibatch


def _same(op_ids: np.ndarray, bptr: np.ndarray, place: np.ndarray, width: np.ndarray) -> None:
    for x, y in zip(_frame_numpy(op_ids, bptr, place, width),
                    frame_compiled(op_ids, bptr, place, width), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("workload", ["tree_lstm", "lattice_lstm", "bilstm_tagger",
                                      "ggnn_molecules"])
def test_frame_on_schedules(workload: str) -> None:
    graph = minibatch(workload, "cell")
    op_ids, bptr, _, _ = make_scheduler("critical_path")(graph).flat()
    width = _op_tables(graph.vocab)[0]
    rng = np.random.default_rng(0)
    for place in (np.arange(len(op_ids)), rng.permutation(len(op_ids))):
        _same(op_ids, bptr, place.astype(np.int64), width)


def test_frame_on_random_batches() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        nb, k = int(rng.integers(0, 30)), 5
        op_ids = rng.integers(0, k, nb).astype(np.int64)
        bptr = np.zeros(nb + 1, np.int64)
        np.cumsum(rng.integers(1, 6, nb), out=bptr[1:])
        width = rng.choice([3, 7, 7, 12], k).astype(np.int64)
        _same(op_ids, bptr, rng.permutation(nb).astype(np.int64), width)
