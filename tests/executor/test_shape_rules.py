"""The parameter shape expressions of cell kinds (``executor/_shape_rules.py``)."""

from __future__ import annotations

import gc

import pytest

from edbatch.executor._shape_rules import _eval


class _Kind:
    __name__ = "Kind"


@pytest.mark.parametrize(("expr", "want"), [("4H", 12), ("H + 2 * E", 13), ("2*(H-1)", 4),
                                            ("E // 2", 2), ("7", 7)])
def test_expressions_evaluate_and_leave_no_reference_cycle(expr: str, want: int) -> None:
    """Each expression gives its value; evaluating one (done on every checked executor run)
    leaves nothing to the cyclic garbage collector (a nested recursive evaluator did)."""
    gc.collect()
    gc.disable()
    try:
        assert _eval(expr, {"H": 3, "E": 5}, _Kind) == want
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_an_unknown_symbol_is_refused_with_the_symbols() -> None:
    with pytest.raises(TypeError, match=r"cannot evaluate 'X' \(symbols: \['H'\]\)"):
        _eval("X + 1", {"H": 3}, _Kind)
