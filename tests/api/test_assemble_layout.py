"""The compiled node layout of graph assembly (``edbatch.api._assemble.node_layout``: operand
pointers, instances, nodes outside every instance) against its numpy twin
(``layout_numpy``), and the numpy errors kept where the compiled pass declines."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.api._assemble import _NO_COUNTS, _marks, layout_numpy, node_layout

ARITY = np.array([0, 1, 2, -1, -1], dtype=np.int64)  # type 3: variadic; 4: the loss sum
ARITY.setflags(write=False)


def _case(rng: np.random.Generator, n: int, losses: int, outside_first: bool
          ) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
    op_ids = rng.integers(0, 4, n).astype(np.int32)
    if losses:
        op_ids = np.append(op_ids, np.int32(4))
    counts = [int(c) for c in rng.integers(0, 5, int((op_ids[:n] == 3).sum()))]
    cuts = sorted(rng.integers(0, n + 1, int(rng.integers(0, 6))).tolist())
    if not outside_first and cuts:
        cuts[0] = 0
    # instance ids ascend; a -1 mark: the nodes after a `with batch.instance()` block
    marks = [(c, int(i) if rng.random() > 0.2 else -1) for i, c in enumerate(cuts)]
    return op_ids, counts, marks


@pytest.mark.parametrize("seed", range(40))
def test_compiled_layout_equals_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    op_ids, counts, marks = _case(rng, n, int(rng.integers(0, 3)) * int(n > 0),
                                  bool(seed % 2))
    losses = int(len(op_ids) > n) * 3
    given = np.asarray(counts, np.int64) if counts else _NO_COUNTS
    got = node_layout(op_ids, ARITY, given, _marks(marks), n, losses)
    want = layout_numpy(op_ids, ARITY, counts, marks, n, losses)
    assert got[2] >= 0
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].dtype == want[0].dtype == np.int64
    assert got[1].dtype == want[1].dtype == np.int32
    assert got[2] == want[2]


def test_no_marks_every_node_outside() -> None:
    op_ids = np.array([0, 0, 1], np.int32)
    ptr, inst, outside = node_layout(op_ids, ARITY, _NO_COUNTS, _marks([]), 3, 0)
    assert outside == 3 and inst.tolist() == [0, 0, 0] and ptr.tolist() == [0, 0, 0, 1]


def test_declines_where_numpy_decides() -> None:
    op_ids = np.array([0, 3, 3], np.int32)
    few = np.array([2], np.int64)  # two variadic nodes, one count: numpy's call (which
    assert node_layout(op_ids, ARITY, few, _marks([(0, 0)]), 3, 0)[2] == -1  # broadcasts it)
    assert layout_numpy(op_ids, ARITY, [2], [(0, 0)], 3, 0)[0].tolist() == [0, 0, 2, 4]
    with pytest.raises(ValueError):
        layout_numpy(op_ids, ARITY, [2, 2, 2], [(0, 0)], 3, 0)
    backwards = [(0, 0), (2, 1), (1, 2)]  # marks out of order
    assert node_layout(op_ids, ARITY, np.array([1, 1], np.int64), _marks(backwards), 3,
                       0)[2] == -1
    with pytest.raises(ValueError):
        layout_numpy(op_ids, ARITY, [1, 1], backwards, 3, 0)
