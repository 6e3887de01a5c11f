"""Tests of edbatch.data.sick: the real splits, every malformed case with its file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from edbatch.data import DepTree, SickPair, load_sick, similarity_target
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "sick"

GOOD = {
    "a.toks": ["A man is playing", "Two dogs run", "A cat sleeps"],
    "a.parents": ["2 4 4 0", "2 3 0", "2 3 0"],
    "b.toks": ["A man plays", "Dogs are running", "Nobody sleeps"],
    "b.parents": ["2 3 0", "3 3 0", "2 0"],
    "sim.txt": ["4.5", "3.25", "1"],
}


def _split(tmp_path: Path, **changes: tuple[int, str | None]) -> Path:
    """Write the GOOD split; ``file=(line, text)`` replaces a line (None deletes it)."""
    folder = tmp_path / "split"
    folder.mkdir(exist_ok=True)
    for name, lines in GOOD.items():
        lines = list(lines)
        key = name.replace(".", "_")
        if key in changes:
            line, text = changes[key]
            if text is None:
                del lines[line - 1]
            else:
                lines[line - 1] = text
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_good_split(tmp_path: Path) -> None:
    pairs = load_sick(_split(tmp_path))
    assert len(pairs) == 3
    first = pairs[0]
    assert isinstance(first, SickPair)
    assert first.a.words == ("A", "man", "is", "playing")
    assert first.a.heads == (2, 4, 4, 0)
    assert first.a.children == ((4,), (), (1,), (), (2, 3))
    assert first.a.root == 4
    assert first.a.postorder() == (1, 2, 3, 4)
    assert first.b.children == ((3,), (), (1,), (2,))
    assert (first.score, first.line) == (4.5, 1)
    assert [p.score for p in pairs] == [4.5, 3.25, 1.0]
    assert len(pairs[2].b) == 2


@pytest.mark.parametrize(
    ("change", "where", "needles"),
    [
        ({"a_parents": (2, "2 3")}, "a.parents:2", ["2 parents for the 3 tokens of a.toks:2"]),
        ({"b_parents": (3, "2 0 1")}, "b.parents:3", ["3 parents for the 2 tokens"]),
        ({"a_parents": (1, "2 4 x 0")}, "a.parents:1", ["non-integer parent 'x' of token 3"]),
        ({"a_parents": (1, "2 4 4.0 0")}, "a.parents:1", ["non-integer parent '4.0'"]),
        ({"a_parents": (1, "2 4 \u00b3 0")}, "a.parents:1", ["non-integer parent '\u00b3'"]),
        ({"a_parents": (1, "2 4 \u0664 0")}, "a.parents:1", ["non-integer parent '\u0664'"]),
        ({"a_parents": (1, "2 4 -1 0")}, "a.parents:1", ["out-of-range parent '-1' of token 3"]),
        ({"a_parents": (1, "2 4 5 0")}, "a.parents:1", ["out-of-range parent '5'",
                                                        "from 0 (root) to 4"]),
        ({"b_parents": (2, "3 2 0")}, "b.parents:2", ["self-loop parent '2' of token 2"]),
        ({"a_parents": (1, "2 4 0 0")}, "a.parents:1", ["2 roots (parent 0)"]),
        ({"a_parents": (1, "2 4 4 2")}, "a.parents:1", ["0 roots"]),
        ({"b_parents": (2, "2 1 0")}, "b.parents:2", ["the cycle 1 -> 2 -> 1"]),
        ({"a_toks": (3, "")}, "a.toks:3", ["an empty sentence"]),
        ({"a_toks": (3, "   ")}, "a.toks:3", ["an empty sentence"]),
        ({"sim_txt": (2, "x")}, "sim.txt:2", ["the score 'x'"]),
        ({"sim_txt": (2, "5.01")}, "sim.txt:2", ["the score '5.01'", "from 1 to 5"]),
        ({"sim_txt": (2, "0.5")}, "sim.txt:2", ["the score '0.5'"]),
        ({"sim_txt": (2, "nan")}, "sim.txt:2", ["the score 'nan'"]),
        ({"sim_txt": (2, "")}, "sim.txt:2", ["the score ''"]),
        ({"b_toks": (3, None)}, "a.toks:3", ["line 3 while b.toks has only 2 lines"]),
        ({"sim_txt": (1, None)}, "a.toks:3", ["line 3 while sim.txt has only 2 lines"]),
    ],
)
def test_malformed(tmp_path: Path, change: dict[str, tuple[int, str | None]], where: str,
                   needles: list[str]) -> None:
    folder = _split(tmp_path, **change)
    with pytest.raises(DataFormatError) as info:
        load_sick(folder)
    message = str(info.value)
    assert message.startswith(f"{folder / where}: found "), message
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_extra_line_names_the_longer_file(tmp_path: Path) -> None:
    folder = _split(tmp_path)
    with (folder / "b.parents").open("a", encoding="utf-8") as f:
        f.write("1 0\n")
    with pytest.raises(DataFormatError, match=r"b.parents:4: found line 4 while a.toks has "
                                              r"only 3 lines"):
        load_sick(folder)


def test_missing_file_and_empty_split(tmp_path: Path) -> None:
    folder = _split(tmp_path)
    (folder / "b.toks").unlink()
    with pytest.raises(FileNotFoundError, match=r"b.toks: no such file; a SICK split folder "
                                                r"holds a.toks, a.parents"):
        load_sick(folder)
    for name in GOOD:
        (folder / name).write_text("", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"a.toks:1: found an empty file"):
        load_sick(folder)


def test_similarity_target() -> None:
    assert similarity_target(1.0) == (1.0, 0.0, 0.0, 0.0, 0.0)
    assert similarity_target(4.5) == (0.0, 0.0, 0.0, 0.5, 0.5)
    for score in (1.0, 1.3, 2.75, 3.6, 4.9, 5.0):
        p = similarity_target(score)
        assert abs(sum(p) - 1.0) < 1e-12
        assert abs(sum((i + 1) * q for i, q in enumerate(p)) - score) < 1e-9
    with pytest.raises(ValueError, match=r"score must be in \[1, 5\]"):
        similarity_target(5.5)


def test_deptree_from_heads() -> None:
    tree = DepTree.from_heads(("a", "b", "c", "d"), (0, 1, 1, 3))
    assert tree.children == ((1,), (2, 3), (), (4,), ())
    assert tree.postorder() == (2, 4, 3, 1)


@pytest.mark.parametrize(("split", "count", "max_len"),
                         [("train", 4500, 36), ("dev", 500, 30), ("test", 4927, 30)])
def test_real_splits(split: str, count: int, max_len: int) -> None:
    pairs = load_sick(DATA / split)
    assert len(pairs) == count
    assert max(max(len(p.a), len(p.b)) for p in pairs) == max_len
    assert min(p.score for p in pairs) == 1.0
    assert max(p.score for p in pairs) == 5.0
    for pair in pairs:
        for tree in (pair.a, pair.b):
            assert sorted(tree.postorder()) == list(range(1, len(tree) + 1))
    if split == "train":
        first = pairs[0]
        assert first.a.words[:4] == ("A", "group", "of", "kids")
        assert first.a.heads[:6] == (2, 6, 2, 3, 6, 0)
        assert first.score == 4.5
