"""Tests of edbatch.data.tags: the real WikiNER dev file and every malformed case."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from edbatch.data import TaggedSentence, load_tagged
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "tags"


def test_real_dev_file() -> None:
    sentences = load_tagged(DATA / "dev.txt")
    assert len(sentences) == 1696
    assert sum(len(s) for s in sentences) == 39007
    assert all(len(s.words) == len(s.tags) for s in sentences)
    tags = Counter(tag for s in sentences for tag in s.tags)
    assert set(tags) == {"O", "I-PER", "I-LOC", "I-ORG", "I-MISC"}
    assert tags["O"] == 32576
    assert sentences[0].words[:3] == ("010", "is", "the")
    assert sentences[0].tags[:3] == ("I-MISC", "O", "O")


def test_split_on_last_bar_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a|b|O x||I-PER\n\n  c|I-LOC \n", encoding="utf-8")
    first, second = load_tagged(path)
    assert first == TaggedSentence(("a|b", "x|"), ("O", "I-PER"))
    assert second == TaggedSentence(("c",), ("I-LOC",))


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("This|O album proved|O", "token 2 'album' at column 8 without a '|'"),
        ("This|O |O proved|O", "token 2 '|O' at column 8 with an empty word"),
        ("This|O album| proved|O", "token 2 'album|' at column 8 with an empty tag"),
        ("This|O  | proved|O", "token 2 '|' at column 9 with an empty word and an empty tag"),
    ],
)
def test_malformed_token(tmp_path: Path, bad: str, needle: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(f"a|O b|O\n\n{bad}\nc|O\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_tagged(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: found {needle}")


@pytest.mark.parametrize("content", ["", "\n   \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"empty.txt:1: found an empty file"):
        load_tagged(path)
