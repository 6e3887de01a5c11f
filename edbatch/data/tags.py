"""Tagged sentences in ``word|tag`` format (WikiNER, ``data/tags/``).

One sentence per line; tokens are separated by spaces and each token is ``word|tag``. A word
may itself contain ``|``: the tag is whatever follows the *last* ``|``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from edbatch.data._text import read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = ["TaggedSentence", "load_tagged"]


@dataclass(frozen=True, slots=True)
class TaggedSentence:
    """A sentence with one tag per word.

    Attributes:
        words: The tokens, in order.
        tags: The tag of each token (same length as ``words``), e.g. ``O`` or ``I-PER``.
    """

    words: tuple[str, ...]
    tags: tuple[str, ...]

    def __len__(self) -> int:
        """Return the number of tokens."""
        return len(self.words)


def _parse_line(text: str, path: str, line: int) -> TaggedSentence:
    """Parse one non-blank line of ``word|tag`` tokens."""
    words: list[str] = []
    tags: list[str] = []
    for token in text.split():
        word, bar, tag = token.rpartition("|")
        if not bar or not word or not tag:
            _bad_token(text, token, len(words), path, line)
        words.append(word)
        tags.append(tag)
    return TaggedSentence(tuple(words), tuple(tags))


def _bad_token(text: str, token: str, position: int, path: str, line: int) -> NoReturn:
    """Report the malformed ``token`` (number ``position`` on the line) with its column."""
    column = _column(text, position)
    where = f"token {position + 1} {shorten(token)} at column {column}"
    word, bar, tag = token.rpartition("|")
    if not bar:
        problem = f"{where} without a '|'"
    elif not word and not tag:
        problem = f"{where} with an empty word and an empty tag"
    elif not tag:
        problem = f"{where} with an empty tag"
    else:
        problem = f"{where} with an empty word"
    raise DataFormatError(path, line, problem, "space-separated 'word|tag' tokens",
                          "give every token a non-empty word and tag, joined by '|'")


def _column(text: str, position: int) -> int:
    """1-based column of the whitespace-separated token number ``position`` in ``text``."""
    column = 0
    for _ in range(position + 1):
        while text[column].isspace():
            column += 1
        start = column
        while column < len(text) and not text[column].isspace():
            column += 1
    return start + 1


def load_tagged(path: str | Path) -> list[TaggedSentence]:
    """Load one tagged sentence per non-blank line.

    Args:
        path: A file such as ``data/tags/dev.txt``.

    Returns:
        The sentences in file order.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: On a token without ``|``, an empty word or tag, or a file without
            sentences. The message names ``file:line`` and the token.
    """
    name = str(path)
    sentences = [
        _parse_line(text, name, number)
        for number, text in enumerate(read_lines(path), start=1)
        if text.strip()
    ]
    if not sentences:
        raise DataFormatError(name, 1, "an empty file (no sentences)",
                              "one sentence of 'word|tag' tokens per line",
                              "check the path and the file")
    return sentences
