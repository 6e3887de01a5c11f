"""Tests of edbatch.data.transitions: oracle and replay on EWT, projectivity, legality."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.data import (
    ArcStandardState,
    crossing_arcs,
    is_projective,
    labelled_oracle,
    load_conllu,
    oracle,
    projective_only,
    replay,
)
from edbatch.data.transitions import LEFT_ARC, RIGHT_ARC, SHIFT
from edbatch.errors import DataFormatError, InvalidActionError

DATA = Path(__file__).resolve().parents[2] / "data" / "ud_ewt"


def _crossing_brute(heads: list[int] | tuple[int, ...]) -> bool:
    arcs = [(min(h, d), max(h, d)) for d, h in enumerate(heads, start=1)]
    return any(a < c < b < e for (a, b), (c, e) in itertools.product(arcs, arcs))


@st.composite
def _trees(draw: st.DrawFn) -> list[int]:
    """A random single-rooted tree: attach words in a random order to earlier-placed ones."""
    n = draw(st.integers(1, 12))
    order = draw(st.permutations(range(1, n + 1)))
    heads = [0] * n
    for k, word in enumerate(order[1:], start=1):
        heads[word - 1] = order[draw(st.integers(0, k - 1))]
    return heads


@settings(max_examples=300, deadline=None)
@given(heads=_trees())
def test_oracle_replays_every_projective_tree_and_refuses_the_others(heads: list[int]) -> None:
    assert is_projective(heads) == (not _crossing_brute(heads))
    if is_projective(heads):
        actions = oracle(heads)
        assert len(actions) == 2 * len(heads)
        assert replay(len(heads), actions) == tuple(heads)
    else:
        (h1, d1), (h2, d2) = crossing_arcs(heads)  # type: ignore[misc]
        assert heads[d1 - 1] == h1 and heads[d2 - 1] == h2
        with pytest.raises(DataFormatError, match="non-projective"):
            oracle(heads)


def test_small_cases() -> None:
    assert oracle([0]) == (SHIFT, RIGHT_ARC)
    assert oracle([2, 0, 2]) == (SHIFT, SHIFT, LEFT_ARC, SHIFT, RIGHT_ARC, RIGHT_ARC)
    # A root arc spanning over its word is crossed by an arc over the root word.
    assert crossing_arcs([0, 4, 1, 1]) == ((1, 3), (4, 2))
    assert crossing_arcs([3, 0, 2, 1]) is not None  # the root arc 0 -> 2 crosses 3 -> 1
    with pytest.raises(DataFormatError, match=r"s.conllu:7: found a non-projective tree "
                                              r"\(arcs 1->3 and 4->2 cross\)"):
        oracle([0, 4, 1, 1], path="s.conllu", line=7)


def test_state_legality() -> None:
    state = ArcStandardState(2)
    assert state.legal() == (True, False, False)
    with pytest.raises(InvalidActionError, match=r"RIGHT_ARC is not legal"):
        state.apply(RIGHT_ARC)
    state.apply(SHIFT)
    # The root word may be attached to 0 only when the buffer is empty (one root).
    assert state.legal() == (True, False, False)
    state.apply(SHIFT)
    assert state.legal() == (False, True, True)
    with pytest.raises(InvalidActionError, match="SHIFT is not legal"):
        state.apply(SHIFT)
    with pytest.raises(InvalidActionError, match="transition 7"):
        state.apply(7)
    state.apply(RIGHT_ARC)
    assert state.legal() == (False, False, True)
    state.apply(RIGHT_ARC)
    assert state.done and state.heads == [0, 1]
    with pytest.raises(ValueError, match="at least one word"):
        ArcStandardState(0)


def test_labelled_oracle_checks_lengths() -> None:
    with pytest.raises(ValueError, match="one relation per word"):
        labelled_oracle([2, 0], ["det"])


def test_replay_rejects_short_or_illegal_sequences() -> None:
    with pytest.raises(InvalidActionError, match="end before the parse is complete"):
        replay(2, [SHIFT, SHIFT, LEFT_ARC])
    with pytest.raises(InvalidActionError, match="LEFT_ARC is not legal"):
        replay(2, [SHIFT, LEFT_ARC])
    with pytest.raises(InvalidActionError, match="SHIFT is not legal"):
        replay(1, [SHIFT, RIGHT_ARC, SHIFT])


def test_any_legal_sequence_gives_a_tree() -> None:
    """Whatever legal actions a parser predicts, the result is a single-rooted tree."""
    for n in range(1, 5):
        for choice in itertools.product(range(3), repeat=2 * n):
            state = ArcStandardState(n)
            for pick in choice:  # take the picked action, or the first legal one
                legal = state.legal()
                state.apply(pick if legal[pick] else legal.index(True))
            assert state.done
            assert state.heads.count(0) == 1 and -1 not in state.heads


def test_ewt_dev_oracle_round_trip() -> None:
    bank = load_conllu(DATA / "en_ewt-ud-dev.conllu")
    kept, dropped = projective_only(bank)
    assert (len(kept), len(dropped)) == (1970, 31)
    assert dropped[:3] == [497, 719, 2278]
    for sentence in kept:
        actions = oracle(sentence.heads, path=sentence.path, line=sentence.line)
        assert replay(len(sentence), actions) == sentence.heads
        # Labelled: replaying with the labels rebuilds the deprels too.
        state = ArcStandardState(len(sentence))
        labels = [""] * len(sentence)
        for action, label in labelled_oracle(sentence.heads, sentence.deprels):
            dependent = state.apply(action)
            assert (label is None) == (dependent == 0)
            if dependent:
                labels[dependent - 1] = label  # type: ignore[assignment]
        assert tuple(labels) == sentence.deprels
    for line in dropped[:5]:
        sentence = next(s for s in bank if s.line == line)
        with pytest.raises(DataFormatError, match=rf"en_ewt-ud-dev.conllu:{line}: found a "
                                                  r"non-projective tree"):
            oracle(sentence.heads, path=sentence.path, line=sentence.line)
