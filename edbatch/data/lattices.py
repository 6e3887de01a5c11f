"""Character/word lattices in the integer-stream format of ``data/lattice/`` (Lattice-LSTM style).

The file is one whitespace-separated stream of integers::

    <n_lattices>
    for each lattice:
        <L>                          number of states; state 0 is the start state
        <tag_0> ... <tag_{L-1}>      one label per state
        for each state i = 0..L-1:
            <k> <from_1> <id_1> ... <from_k> <id_k>     k arcs into state i

An arc with ``from == i - 1`` is a character arc (``id`` indexes the character vocabulary); any
other arc is a word arc spanning ``i - from`` characters (``id`` indexes the word vocabulary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from edbatch.data._text import read_text, shorten
from edbatch.errors import DataFormatError

__all__ = ["Lattice", "load_lattices"]

_INT = re.compile(r"-?[0-9]+")
_INT_STREAM = re.compile(r"[\s0-9-]*")  # characters an all-integer stream may contain


@dataclass(frozen=True, slots=True, eq=False)
class Lattice:
    """One lattice: per-state tags and the incoming arcs of every state.

    Arrays are read-only ``int64``. Arcs are kept in file order, i.e. grouped by destination
    state in ascending order. Equality is identity (``eq=False``): compare arrays explicitly.

    Attributes:
        tags: Label of each state, shape ``[L]`` (state 0 is the start state).
        arc_src: Source state of each arc, shape ``[A]``; always ``< arc_dst``.
        arc_dst: Destination state of each arc, shape ``[A]``, non-decreasing.
        arc_token: Token id of each arc (character id for character arcs, word id otherwise).
    """

    tags: np.ndarray
    arc_src: np.ndarray
    arc_dst: np.ndarray
    arc_token: np.ndarray

    @property
    def num_states(self) -> int:
        """Number of states ``L`` (including the start state)."""
        return int(self.tags.shape[0])

    @property
    def num_arcs(self) -> int:
        """Number of arcs ``A``."""
        return int(self.arc_src.shape[0])

    def is_char_arc(self) -> np.ndarray:
        """Return a bool array ``[A]``: True for character arcs (``src == dst - 1``)."""
        is_char: np.ndarray = self.arc_src == self.arc_dst - 1
        return is_char


class _Stream:
    """The integer tokens of a file, with lazy token -> line lookup for error messages."""

    def __init__(self, path: str, text: str, values: list[int]) -> None:
        """Keep the file name, its text and its integer tokens."""
        self.path = path
        self.text = text
        self.values = values

    def line_of(self, index: int) -> int:
        """1-based line of token ``index``; past the end, the line of the last token."""
        index = min(index, len(self.values) - 1)
        seen = 0
        for number, line in enumerate(self.text.split("\n"), start=1):
            seen += len(line.split())
            if seen > index:
                return number
        return 1

    def fail(self, index: int, found: str, expected: str, fix: str = "") -> NoReturn:
        """Raise a :class:`DataFormatError` at the line of token ``index``."""
        raise DataFormatError(self.path, self.line_of(index), found, expected, fix)


def _to_ints(path: str, text: str) -> list[int]:
    """Convert the whitespace-separated stream to ints, reporting the first bad token."""
    tokens = text.split()
    if _INT_STREAM.fullmatch(text) is not None:
        try:
            return list(map(int, tokens))
        except ValueError:
            pass
    for number, line in enumerate(text.split("\n"), start=1):
        for column, token in _tokens_with_columns(line):
            if _INT.fullmatch(token) is None:
                raise DataFormatError(
                    path, number, f"the token {shorten(token)} at column {column}",
                    "an integer (the lattice format is a stream of integers)",
                    "remove or fix the token",
                )
    raise AssertionError("unreachable: a token failed int() but matches -?[0-9]+")


def _tokens_with_columns(line: str) -> list[tuple[int, str]]:
    """Return ``(1-based column, token)`` for every whitespace-separated token of ``line``."""
    return [(m.start() + 1, m.group()) for m in re.finditer(r"\S+", line)]


def load_lattices(path: str | Path, *, num_tags: int | None = None) -> list[Lattice]:
    """Load every lattice of an integer-stream file.

    Args:
        path: A file such as ``data/lattice/train.txt``.
        num_tags: The size of the tag set: the tags of states ``1..L-1`` (the ones a model
            predicts) must be below it. ``None`` checks only that tags are ``>= 0``.

    Returns:
        The lattices in file order; exactly as many as the header declares.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: On an empty file, a non-integer token, a non-positive lattice count, a
            stream that ends inside a lattice, more or fewer lattices than declared, ``L < 1``,
            a negative arc count, a negative tag, source state or token id, an arc whose
            source is not an earlier state, a state ``i >= 1`` without an incoming arc (it
            would be unreachable and its state undefined), or a tag ``>= num_tags``. Messages
            name ``file:line`` and the lattice index.
    """
    name = str(path)
    text = read_text(path)
    values = _to_ints(name, text)
    stream = _Stream(name, text, values)
    if not values:
        stream.fail(0, "an empty file", "a lattice count followed by the lattices",
                    "check the path and the file")
    declared = values[0]
    if declared < 1:
        stream.fail(0, f"the lattice count {declared}", "a positive number of lattices",
                    "the first integer must be the number of lattices in the file")
    pos = 1
    lattices: list[Lattice] = []
    for index in range(declared):
        if pos == len(values):
            stream.fail(pos, f"{index} lattices (the file ends after lattice #{index - 1})",
                        f"{declared} lattices, as declared on line 1",
                        "fix the count on line 1 or restore the missing lattices")
        lattice, pos = _parse_lattice(stream, pos, index, num_tags)
        lattices.append(lattice)
    if pos < len(values):
        _extra_tokens(stream, pos, declared)
    return lattices


def _extra_tokens(stream: _Stream, pos: int, declared: int) -> NoReturn:
    """Report tokens after the last declared lattice (counting whole extra lattices if any)."""
    extra = 0
    start = pos
    try:
        while pos < len(stream.values):
            _, pos = _parse_lattice(stream, pos, declared + extra)
            extra += 1
    except DataFormatError:
        extra = -1
    if extra > 0:
        found = f"{declared + extra} lattices"
    else:
        found = f"{len(stream.values) - start} extra token(s) after lattice #{declared - 1}"
    stream.fail(start, found, f"{declared} lattices, as declared on line 1",
                "fix the count on line 1 or remove the trailing data")


def _parse_lattice(stream: _Stream, pos: int, index: int,
                   num_tags: int | None = None) -> tuple[Lattice, int]:
    """Parse lattice number ``index`` starting at token ``pos``; return it and the next pos."""
    values = stream.values
    n = len(values)
    length = values[pos]
    if length < 1:
        stream.fail(pos, f"L = {length} states for lattice #{index}", "L >= 1 (state 0 is the "
                    "start state)", "fix the state count of this lattice")
    tag_start = pos + 1
    pos = tag_start + length
    if pos > n:
        _truncated(stream, index, f"{length} state tags")
    tags = values[tag_start:pos]
    if min(tags) < 0:
        bad = next(i for i, tag in enumerate(tags) if tag < 0)
        stream.fail(tag_start + bad, f"tag {tags[bad]} for state {bad} of lattice #{index}",
                    "a tag id >= 0", "fix the tag")
    if num_tags is not None and length > 1 and max(tags[1:]) >= num_tags:
        bad = next(i for i, tag in enumerate(tags) if i and tag >= num_tags)
        stream.fail(tag_start + bad, f"tag {tags[bad]} for state {bad} of lattice #{index}",
                    f"a tag id in 0..{num_tags - 1} (the tag set has {num_tags} tags)",
                    "fix the tag, or use a workload with a larger num_tags")
    src: list[int] = []
    dst: list[int] = []
    tok: list[int] = []
    for state in range(length):
        if pos >= n:
            _truncated(stream, index, f"the arc count of state {state} (of {length})")
        k = values[pos]
        if k < 0:
            stream.fail(pos, f"arc count {k} for state {state} of lattice #{index}",
                        "a number of incoming arcs >= 0", "fix the arc count")
        if k == 0 and state > 0:
            stream.fail(pos, f"no incoming arc for state {state} of lattice #{index}",
                        "at least one arc into every state i >= 1 (from an earlier state)",
                        "add the missing arc, or remove the unreachable state")
        end = pos + 1 + 2 * k
        if end > n:
            _truncated(stream, index, f"{k} (source, token) arc pairs of state {state}")
        if k:
            sources = values[pos + 1 : end : 2]
            tokens = values[pos + 2 : end : 2]
            if min(sources) < 0 or max(sources) >= state or min(tokens) < 0:
                _bad_arc(stream, pos, index, state, sources, tokens)
            src.extend(sources)
            tok.extend(tokens)
            dst.extend([state] * k)
        pos = end
    lattice = Lattice(_frozen(tags), _frozen(src), _frozen(dst), _frozen(tok))
    return lattice, pos


def _frozen(values: list[int]) -> np.ndarray:
    """Return ``values`` as a read-only ``int64`` array."""
    array = np.array(values, dtype=np.int64)
    array.setflags(write=False)
    return array


def _truncated(stream: _Stream, index: int, what: str) -> NoReturn:
    """Report that the stream ended inside lattice ``index`` while ``what`` was expected."""
    stream.fail(len(stream.values), f"the end of the file inside lattice #{index}",
                f"{what}", "the file is truncated: restore the rest of the lattice or fix the "
                "counts")


def _bad_arc(
    stream: _Stream, pos: int, index: int, state: int, sources: list[int], tokens: list[int]
) -> NoReturn:
    """Report the first invalid arc of ``state`` (its count is at token ``pos``)."""
    for j, (source, token) in enumerate(zip(sources, tokens, strict=True)):
        at = pos + 1 + 2 * j
        where = f"arc {j} into state {state} of lattice #{index}"
        if source < 0:
            stream.fail(at, f"source state {source} ({where})", "a source state >= 0",
                        "fix the arc")
        if source >= state:
            kind = "a self-loop" if source == state else "a forward reference"
            stream.fail(at, f"source state {source} ({where}: {kind})",
                        f"a source state < {state}: arcs go from an earlier state to a later "
                        "one, so the lattice is acyclic", "fix the arc or the state order")
        if token < 0:
            stream.fail(at + 1, f"token id {token} ({where})", "a token id >= 0", "fix the arc")
    raise AssertionError("unreachable: no invalid arc found")
