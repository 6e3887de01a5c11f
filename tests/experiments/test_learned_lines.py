"""The honest report lines of experiments._learned: each case of 'learned nothing' and a real
gain, on hand-made Unseen records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments._learned import Unseen, learned_nothing, worse_than_best

POLICY = SimpleNamespace(metadata={})


def _u(fsm: int, fallback: int, states: int = 21, hit: float = 0.015) -> Unseen:
    return Unseen(graphs=5, lower_bound=1303, fsm_batches=fsm, fallback_batches=fallback,
                  states=states, hit_rate=hit, fallback="critical_path")


@pytest.mark.parametrize(("u", "words"), [
    (_u(1520, 1520, states=0, hit=0.0), "0 states"),
    (_u(1520, 1520, hit=0.0), "never visited"),
    (_u(1520, 1520), "change no batch count"),
    (_u(1526, 1520), "add 6 batches (+0.39%)"),
])
def test_a_learner_that_learned_nothing_says_why(u: Unseen, words: str) -> None:
    line = learned_nothing("lattice_lstm fsm seed 0", POLICY, u)
    assert line is not None and words in line and "lattice_lstm fsm seed 0" in line


def test_a_learner_that_removes_batches_gets_no_such_line() -> None:
    assert learned_nothing("x", POLICY, _u(1500, 1520)) is None


def test_worse_than_best_names_both_counts() -> None:
    line = worse_than_best("x", _u(1889, 2826), "critical_path", 1629)
    assert line is not None and "1889 vs 1629" in line
    assert worse_than_best("x", _u(1520, 1520), "critical_path", 1629) is None
