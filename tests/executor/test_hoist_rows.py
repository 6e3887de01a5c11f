"""``_hoist._concat_rows``: the rows of many plan operands at once equal their
``Operand.rows()`` concatenated, for views, gathers and both mixed."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.executor._hoist import _concat_rows
from edbatch.memory.plan import Operand, Region


def _view(lo: int, hi: int) -> Operand:
    return Operand.of_view(Region(0, lo, hi))


def _gather(*rows: int) -> Operand:
    return Operand.of_gather(0, np.array(rows, dtype=np.int64))


@pytest.mark.parametrize("operands", [
    [_view(3, 7), _view(0, 1), _view(9, 12)],
    [_gather(5, 2), _gather(8), _gather(1, 1, 0)],
    [_view(4, 6), _gather(9, 0, 3), _view(1, 2), _gather(7), _view(10, 13)],
    [_gather(2, 6), _view(0, 3)],
    [_view(5, 5), _gather(), _view(2, 4)],
    [],
])
def test_concat_rows_equals_rows_concatenated(operands: list[Operand]) -> None:
    rows, sizes = _concat_rows(operands)
    want = [o.rows() for o in operands]
    assert sizes.tolist() == [len(r) for r in want]
    expected = np.concatenate(want) if want else np.zeros(0, np.int64)
    assert rows.dtype == np.int64
    assert rows.tolist() == expected.tolist()
