"""The compiled core's batch sort (bitmap for dense batches, insertion for small sparse
ones, ``ndarray.sort`` for larger sparse ones, nothing for ascending ones) equals
``np.sort`` and leaves its bitmap clear."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.schedule._compiled_sort import DENSE_RANGE, SMALL, sort_nodes


def _check(ids: list[int], n: int) -> None:
    batch = np.array(ids, dtype=np.int64)
    mark = np.zeros(n, np.bool_)
    sort_nodes(batch, mark)
    np.testing.assert_array_equal(batch, np.sort(np.array(ids, dtype=np.int64)))
    assert not mark.any()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3000).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 400)))))
def test_sort_nodes_equals_np_sort(case: tuple[int, list[int]]) -> None:
    n, ids = case
    _check(ids, n)


@pytest.mark.parametrize("n", [1, 2, 17, 5000])
def test_sort_nodes_every_path(n: int) -> None:
    rng = np.random.default_rng(n)
    every = list(range(n))
    _check([], n)
    _check(every, n)  # ascending: untouched
    _check(every[::-1], n)  # dense: the bitmap
    _check(rng.permutation(n).tolist(), n)
    if n > 2 * DENSE_RANGE:  # sparse: ndarray.sort
        picked = [0, n - 1, n // 2] if n > 3 * DENSE_RANGE else [n - 1, 0]
        assert max(picked) - min(picked) >= DENSE_RANGE * len(picked)
        _check(picked, n)


@pytest.mark.parametrize("c", [2, 3, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL])
def test_sparse_batches_small_and_large(c: int) -> None:
    n = 100 * DENSE_RANGE * c  # ids spread far apart: never the bitmap
    rng = np.random.default_rng(c)
    for _ in range(20):
        ids = rng.choice(n, size=c, replace=False)
        assert ids.max() - ids.min() >= DENSE_RANGE * c or np.all(np.diff(ids) > 0)
        _check(ids.tolist(), n)
    _check(list(range(0, n, n // c))[:c][::-1], n)  # descending: every id moves
