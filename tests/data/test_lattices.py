"""Tests of edbatch.data.lattices: the real lattice files and every malformed case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edbatch.data import Lattice, load_lattices
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "lattice"

# Two lattices; line numbers matter for the error tests below.
GOOD_LINES = [
    "2",  # 1: lattice count
    "3",  # 2: lattice #0 has 3 states
    "0 1 2",  # 3: tags
    "0",  # 4: state 0: no arcs
    "1 0 5",  # 5: state 1: char arc 0 -> 1 (token 5)
    "2 1 6 0 7",  # 6: state 2: char arc 1 -> 2, word arc 0 -> 2
    "2",  # 7: lattice #1 has 2 states
    "0 4",  # 8: tags
    "0",  # 9: state 0
    "1 0 9",  # 10: state 1
]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "lat.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _replace(line_number: int, text: str) -> list[str]:
    lines = list(GOOD_LINES)
    lines[line_number - 1] = text
    return lines


def _error(tmp_path: Path, lines: list[str]) -> DataFormatError:
    path = _write(tmp_path, lines)
    with pytest.raises(DataFormatError) as info:
        load_lattices(path)
    assert str(info.value).startswith(f"{path}:{info.value.line}: found ")
    return info.value


@pytest.mark.parametrize(
    ("split", "count", "mean", "lo", "hi", "chars", "words", "span", "max_tag"),
    [
        ("train", 1147, 44.1, 3, 211, 49471, 26777, 8, 17),
        ("dev", 113, 49.6, 12, 151, 5487, 3279, 8, 16),
        ("test", 316, 46.6, 5, 195, 14405, 6398, 5, 15),
    ],
)
def test_real_files(
    split: str, count: int, mean: float, lo: int, hi: int, chars: int, words: int, span: int,
    max_tag: int,
) -> None:
    lattices = load_lattices(DATA / f"{split}.txt")
    assert len(lattices) == count
    states = [lat.num_states for lat in lattices]
    assert round(float(np.mean(states)), 1) == mean
    assert (min(states), max(states)) == (lo, hi)
    n_char = sum(int(lat.is_char_arc().sum()) for lat in lattices)
    n_arcs = sum(lat.num_arcs for lat in lattices)
    assert (n_char, n_arcs - n_char) == (chars, words)
    assert max(int((lat.arc_dst - lat.arc_src).max()) for lat in lattices) == span
    assert max(int(lat.tags.max()) for lat in lattices) == max_tag
    for lat in lattices:
        assert lat.tags.dtype == np.int64 and lat.arc_src.dtype == np.int64
        assert np.all(np.diff(lat.arc_dst) >= 0)
        assert np.all(lat.arc_src < lat.arc_dst)
        assert lat.tags[0] == 0


def test_first_train_lattice() -> None:
    first = load_lattices(DATA / "train.txt")[0]
    assert first.num_states == 13
    assert first.tags.tolist() == [0] + [3] * 12
    # State 0 has no arcs; state 1 has "1 0 232".
    assert (first.arc_src[0], first.arc_dst[0], first.arc_token[0]) == (0, 1, 232)


def test_small_file_structure(tmp_path: Path) -> None:
    a, b = load_lattices(_write(tmp_path, GOOD_LINES))
    assert isinstance(a, Lattice)
    assert a.num_states == 3 and b.num_states == 2
    assert a.tags.tolist() == [0, 1, 2]
    assert a.arc_src.tolist() == [0, 1, 0]
    assert a.arc_dst.tolist() == [1, 2, 2]
    assert a.arc_token.tolist() == [5, 6, 7]
    assert a.is_char_arc().tolist() == [True, True, False]
    assert b.arc_token.tolist() == [9]
    with pytest.raises(ValueError):
        a.tags[0] = 1  # read-only arrays


def test_tokens_may_be_spread_over_lines(tmp_path: Path) -> None:
    path = tmp_path / "flat.txt"
    path.write_text(" ".join(GOOD_LINES), encoding="utf-8")
    assert [lat.num_states for lat in load_lattices(path)] == [3, 2]


def test_non_integer_token(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(6, "2 1 6 0 x7"))
    assert err.line == 6
    assert "'x7' at column 9" in err.found
    err = _error(tmp_path, _replace(3, "0 1.5 2"))
    assert err.line == 3 and "'1.5'" in err.found


def test_truncated_inside_lattice(tmp_path: Path) -> None:
    err = _error(tmp_path, GOOD_LINES[:9])  # lattice #1 lacks the arcs of state 1
    assert err.line == 9
    assert "end of the file inside lattice #1" in err.found
    assert "arc count of state 1" in err.expected
    err = _error(tmp_path, [*GOOD_LINES[:5], "2 1 6 0"])  # half an arc pair
    assert err.line == 6
    assert "lattice #0" in err.found and "2 (source, token) arc pairs of state 2" in err.expected
    err = _error(tmp_path, ["1", "4", "0 1"])  # tags cut short
    assert err.line == 3 and "4 state tags" in err.expected


def test_fewer_lattices_than_declared(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(1, "3"))
    assert err.line == 10
    assert err.found.startswith("2 lattices")
    assert "3 lattices, as declared on line 1" in err.expected


def test_more_lattices_than_declared(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(1, "1"))
    assert err.line == 7
    assert err.found == "2 lattices"
    assert "1 lattices, as declared" in err.expected


def test_extra_trailing_tokens(tmp_path: Path) -> None:
    err = _error(tmp_path, [*GOOD_LINES, "", "7 7"])
    assert err.line == 12
    assert "extra token(s) after lattice #1" in err.found


@pytest.mark.parametrize("length", ["0", "-2"])
def test_state_count_below_one(tmp_path: Path, length: str) -> None:
    err = _error(tmp_path, _replace(7, length))
    assert err.line == 7
    assert f"L = {length} states for lattice #1" in err.found


def test_negative_counts(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(1, "-2"))
    assert err.line == 1 and "lattice count -2" in err.found
    err = _error(tmp_path, _replace(5, "-1 0 5"))
    assert err.line == 5 and "arc count -1 for state 1 of lattice #0" in err.found


def test_forward_reference_and_self_loop(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(6, "2 1 6 3 7"))
    assert err.line == 6
    assert "source state 3 (arc 1 into state 2 of lattice #0: a forward reference)" in err.found
    err = _error(tmp_path, _replace(10, "1 1 9"))
    assert err.line == 10
    assert "source state 1 (arc 0 into state 1 of lattice #1: a self-loop)" in err.found


def test_negative_source_token_and_tag(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(6, "2 1 6 -1 7"))
    assert err.line == 6 and "source state -1 (arc 1 into state 2 of lattice #0)" in err.found
    err = _error(tmp_path, _replace(5, "1 0 -5"))
    assert err.line == 5 and "token id -5 (arc 0 into state 1 of lattice #0)" in err.found
    err = _error(tmp_path, _replace(8, "0 -4"))
    assert err.line == 8 and "tag -4 for state 1 of lattice #1" in err.found


@pytest.mark.parametrize("content", ["", "\n \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"empty.txt:1: found an empty file"):
        load_lattices(path)


def test_tag_outside_the_tag_set_names_file_line_value_and_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_LINES)
    assert len(load_lattices(path, num_tags=5)) == 2  # tags 0..4 fit
    with pytest.raises(DataFormatError) as info:
        load_lattices(path, num_tags=2)  # lattice #0's state 2 has tag 2
    err = info.value
    assert str(err).startswith(f"{path}:3: found tag 2 for state 2 of lattice #0")
    assert "0..1" in err.expected and "num_tags" in str(err)


def test_state_without_incoming_arc_names_file_line_and_fix(tmp_path: Path) -> None:
    err = _error(tmp_path, _replace(5, "0"))  # state 1 of lattice #0: unreachable
    assert err.line == 5 and "no incoming arc for state 1 of lattice #0" in err.found
    assert "add the missing arc" in str(err)
