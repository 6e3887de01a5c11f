"""Universal Dependencies treebanks in CoNLL-U (``data/ud_ewt/``).

A sentence is a block of lines ended by a blank line: ``#`` comment lines, then one line per
token with ten tab-separated columns ``ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC``.
The ``ID`` column is read by the ``conllu`` package's field parser and has three forms:

* ``5``: a syntactic word. Words are numbered 1, 2, 3, ... and form the basic tree: each has
  a ``HEAD`` (0 = the root) and a ``DEPREL``.
* ``1-2``: a multiword token (``don't`` = ``do`` + ``n't``). It is the surface form of the
  words it spans: it is kept in :attr:`DepSentence.tokens` and is not a node of the tree.
* ``8.1``: an empty node of the enhanced graph (elided predicates). It has no basic ``HEAD``:
  it is skipped for the tree and only counted (:attr:`DepSentence.empty_nodes`).

The reader checks what a workload relies on and reports the first problem as a
:class:`~edbatch.errors.DataFormatError` with ``file:line``: the column count, the ID order,
the ``UPOS`` tag (one of the 17 universal tags), the ``DEPREL`` (a universal relation,
optionally with a ``:subtype``), the ``HEAD`` (an integer from 0 to the sentence length), the
tree itself (exactly one root and no cycle) and the sentence length (``max_words``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, overload

from conllu.exceptions import ParseException
from conllu.parser import parse_comment_line, parse_id_value, parse_int_value

from edbatch.data._text import gc_paused, read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = [
    "DEFAULT_MAX_WORDS",
    "DEPRELS",
    "UPOS_TAGS",
    "DepSentence",
    "Treebank",
    "find_cycle",
    "load_conllu",
]

#: The 17 universal part-of-speech tags, sorted (a tag's index is a stable class id).
UPOS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
    "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)
#: The 37 universal dependency relations; a ``DEPREL`` is one of them or ``rel:subtype``.
DEPRELS: frozenset[str] = frozenset((
    "acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound",
    "conj", "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat",
    "goeswith", "iobj", "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan",
    "parataxis", "punct", "reparandum", "root", "vocative", "xcomp",
))
#: Longest sentence :func:`load_conllu` accepts by default (EWT's longest: 159 words).
DEFAULT_MAX_WORDS = 256

_UPOS = frozenset(UPOS_TAGS)
_COLUMNS = 10


@dataclass(frozen=True, slots=True)
class DepSentence:
    """A sentence with its basic dependency tree.

    Attributes:
        words: The syntactic words (``FORM`` of the integer-ID lines), word ``i`` is
            ``words[i - 1]``.
        upos: The universal POS tag of each word (one of :data:`UPOS_TAGS`).
        heads: The head of each word: 0 for the root, else a word number 1..len.
        deprels: The relation of each word to its head, as written (``nmod:poss``).
        tokens: The surface tokens: a multiword token's form replaces the words it spans.
        sent_id: The ``# sent_id`` comment, if any.
        text: The ``# text`` comment (the untokenised sentence), if any.
        path: The file the sentence was read from.
        line: The line of its first token.
        empty_nodes: How many empty nodes (``8.1`` lines) the sentence had (not in the tree).
        word_lines: The line of each word (for errors about one word, e.g. its characters).
    """

    words: tuple[str, ...]
    upos: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    tokens: tuple[str, ...]
    sent_id: str | None
    text: str | None
    path: str
    line: int
    empty_nodes: int = 0
    word_lines: tuple[int, ...] = ()

    def __len__(self) -> int:
        """Return the number of syntactic words."""
        return len(self.words)

    @property
    def root(self) -> int:
        """The number (1-based) of the word whose head is 0."""
        return self.heads.index(0) + 1

    def children(self) -> tuple[tuple[int, ...], ...]:
        """Dependents of every node, left to right; entry 0 lists the root's (the root word).

        Example:
            >>> s = DepSentence(("a", "b"), ("DET", "NOUN"), (2, 0), ("det", "root"),
            ...                 ("a", "b"), None, None, "<doc>", 1)
            >>> s.children()
            ((2,), (), (1,))
        """
        kids: list[list[int]] = [[] for _ in range(len(self.heads) + 1)]
        for dependent, head in enumerate(self.heads, start=1):
            kids[head].append(dependent)
        return tuple(tuple(k) for k in kids)


class Treebank(Sequence[DepSentence]):
    """The sentences of one CoNLL-U file, plus the sentences skipped as too long.

    Attributes:
        path: The file.
        sentences: The sentences kept, in file order.
        skipped: The first token line of every sentence longer than ``max_words`` that was
            skipped (``too_long="skip"``); empty otherwise.
        max_words: The length limit the file was read with.
    """

    __slots__ = ("max_words", "path", "sentences", "skipped")

    def __init__(self, path: str, sentences: tuple[DepSentence, ...],
                 skipped: tuple[int, ...], max_words: int) -> None:
        self.path = path
        self.sentences = sentences
        self.skipped = skipped
        self.max_words = max_words

    def __len__(self) -> int:
        return len(self.sentences)

    @overload
    def __getitem__(self, index: int) -> DepSentence: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[DepSentence, ...]: ...

    def __getitem__(self, index: int | slice) -> DepSentence | tuple[DepSentence, ...]:
        return self.sentences[index]

    def __iter__(self) -> Iterator[DepSentence]:
        return iter(self.sentences)

    def __repr__(self) -> str:
        return (f"Treebank({self.path!r}, {len(self)} sentences, "
                f"{len(self.skipped)} skipped longer than {self.max_words} words)")


def find_cycle(heads: Sequence[int]) -> list[int] | None:
    """Return the words (1-based) of a cycle in ``heads``, or ``None`` if there is none.

    ``heads[i - 1]`` is the head of word ``i`` (0 = root); every head must be in
    ``0..len(heads)``. The cycle starts at its smallest word and follows the heads.

    Example:
        >>> find_cycle([2, 0, 4, 3]), find_cycle([2, 0, 2])
        ([3, 4], None)
    """
    n = len(heads)
    state = [0] * (n + 1)  # 0 = unseen, 1 = on the current path, 2 = reaches the root
    state[0] = 2
    for start in range(1, n + 1):
        path: list[int] = []
        node = start
        while state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node - 1]
        if state[node] == 1:  # walked back into the current path
            cycle = path[path.index(node):]
            first = cycle.index(min(cycle))
            return cycle[first:] + cycle[:first]
        for visited in path:
            state[visited] = 2
    return None


def _fail(path: str, line: int, found: str, expected: str, fix: str) -> NoReturn:
    raise DataFormatError(path, line, found, expected, fix)


def _parse_id(raw: str, path: str, line: int) -> int | tuple[int, str, int]:
    """The ID column through ``conllu``'s parser; its errors become file:line errors."""
    try:
        value = parse_id_value(raw)
    except ParseException:
        value = None
    if value is None:
        _fail(path, line, f"the ID {shorten(raw)}",
              "a word number (5), a multiword range (1-2) or an empty node (8.1)",
              "number the words of each sentence 1, 2, 3, ...")
    return value


class _Block:
    """The sentence being read: its columns, plus the line of each word for errors."""

    __slots__ = ("deprels", "empty", "first", "first_token", "heads", "lines", "mwt_end",
                 "sent_id", "text", "tokens", "upos", "words")

    def __init__(self) -> None:
        self.words: list[str] = []
        self.upos: list[str] = []
        self.heads: list[int] = []
        self.deprels: list[str] = []
        self.tokens: list[str] = []
        self.lines: list[int] = []
        self.mwt_end = 0  # last word covered by the current multiword token
        self.empty = 0
        self.first = 0  # first line of the block (a comment or a token)
        self.first_token = 0  # first token line
        self.sent_id: str | None = None
        self.text: str | None = None


def _comment(block: _Block, text: str) -> None:
    for key, value in parse_comment_line(text):
        if key == "sent_id":
            block.sent_id = value
        elif key == "text":
            block.text = value


def _token(block: _Block, text: str, path: str, line: int) -> None:  # noqa: C901
    """Read one token line into ``block``."""
    cols = text.split("\t")
    if len(cols) != _COLUMNS:
        _fail(path, line, f"{len(cols)} tab-separated columns",
              "10 columns: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC",
              "separate the columns with single tabs and write '_' for an empty field")
    if not block.first_token:
        block.first_token = line
    n = len(block.words)
    raw_id = cols[0]
    if raw_id.isascii() and raw_id.isdigit() and raw_id[0] != "0":  # the common case
        ident: int | tuple[int, str, int] = int(raw_id)
    else:
        ident = _parse_id(raw_id, path, line)
    if isinstance(ident, tuple):
        start, kind, end = ident
        if kind == ".":  # an empty node: after word `start`, outside the basic tree
            if start != n:
                _fail(path, line, f"the empty node {raw_id} after word {n}",
                      f"an empty node numbered {n}.k", "number empty nodes after the "
                      "word they follow")
            block.empty += 1
            return
        if start != n + 1 or end <= start or block.mwt_end > n:
            _fail(path, line, f"the multiword token {raw_id} after word {n}",
                  f"a range {n + 1}-k with k > {n + 1}, not overlapping another",
                  "put the range line right before the words it spans")
        block.mwt_end = end
        block.tokens.append(cols[1])
        return
    if ident != n + 1:
        _fail(path, line, f"the word ID {raw_id} after word {n}", f"word {n + 1}",
              "number the words of each sentence 1, 2, 3, ... in order")
    form, upos, raw_head, deprel = cols[1], cols[3], cols[6], cols[7]
    if not form:
        _fail(path, line, "an empty FORM", "the word in column 2", "write the word")
    if upos not in _UPOS:
        _fail(path, line, f"the UPOS tag {shorten(upos)}",
              "one of the 17 universal tags " + " ".join(UPOS_TAGS),
              "fix column 4 (language-specific tags belong in XPOS, column 5)")
    try:
        head = parse_int_value(raw_head)
    except ParseException:
        head = None
    if head is None or head < 0:
        _fail(path, line, f"the HEAD {shorten(raw_head)} of word {n + 1}",
              "an integer from 0 (root) to the sentence length",
              "write the number of the head word, 0 for the root")
    if deprel.partition(":")[0] not in DEPRELS:
        _fail(path, line, f"the DEPREL {shorten(deprel)} of word {n + 1}",
              "a universal relation (nsubj, obj, root, ...) optionally with ':subtype'",
              "fix column 8")
    block.words.append(form)
    block.upos.append(upos)
    block.heads.append(head)
    block.deprels.append(deprel)
    block.lines.append(line)
    if n + 1 > block.mwt_end:
        block.tokens.append(form)


def _check_tree(block: _Block, path: str) -> None:
    """Heads in range, exactly one root, no cycle; errors name the line of a word."""
    n = len(block.heads)
    roots: list[int] = []
    for i, head in enumerate(block.heads):
        if head > n:
            _fail(path, block.lines[i], f"the HEAD {head} of word {i + 1} in a sentence of "
                  f"{n} words", f"a head from 0 to {n}", "point HEAD at a word of the "
                  "same sentence")
        if head == i + 1:
            _fail(path, block.lines[i], f"word {i + 1} as its own head (a cycle)",
                  "a head that is another word or 0", "fix column 7")
        if head == 0:
            roots.append(i)
    if len(roots) > 1:
        first, second = roots[0], roots[1]
        _fail(path, block.lines[second], f"a second root, word {second + 1} (word "
              f"{first + 1} at line {block.lines[first]} also has HEAD 0)",
              "exactly one word with HEAD 0 per sentence",
              "attach all but one root to a word of the sentence")
    cycle = find_cycle(block.heads)
    if cycle is not None:  # with no root there is always one
        loop = " -> ".join(str(word) for word in [*cycle, cycle[0]])
        _fail(path, block.lines[cycle[0] - 1], f"the cycle {loop} in the heads",
              "a tree: following HEAD from every word reaches 0",
              "fix the HEAD column of the words on the cycle")


def _finish(block: _Block, path: str, max_words: int, too_long: str,
            skipped: list[int]) -> DepSentence | None:
    n = len(block.words)
    if not n:
        _fail(path, block.first, "a sentence with no word lines (only comments, multiword "
              "tokens or empty nodes)", "at least one word line per sentence",
              "remove the block or add its words")
    if block.mwt_end > n:
        _fail(path, block.lines[-1], f"a multiword token reaching word {block.mwt_end} in a "
              f"sentence of {n} words", "ranges inside the sentence",
              "fix the range or add the missing words")
    if n > max_words:
        if too_long == "skip":
            skipped.append(block.first_token)
            return None
        _fail(path, block.first_token, f"a sentence of {n} words", f"at most max_words="
              f"{max_words}", "pass a larger max_words, or too_long='skip' to drop such "
              "sentences")
    _check_tree(block, path)
    return DepSentence(tuple(block.words), tuple(block.upos), tuple(block.heads),
                       tuple(block.deprels), tuple(block.tokens), block.sent_id, block.text,
                       path, block.first_token, block.empty, tuple(block.lines))


def load_conllu(path: str | Path, *, max_words: int = DEFAULT_MAX_WORDS,
                too_long: Literal["error", "skip"] = "error") -> Treebank:
    """Read a CoNLL-U file into sentences with their basic dependency trees.

    Args:
        path: A file such as ``data/ud_ewt/en_ewt-ud-train.conllu``.
        max_words: The longest sentence accepted, in syntactic words.
        too_long: What to do with a longer sentence: ``"error"`` raises a
            :class:`DataFormatError` at its first token line; ``"skip"`` drops it and records
            that line in :attr:`Treebank.skipped` (the rest of it is still checked for format
            errors line by line, but not its tree).

    Returns:
        The :class:`Treebank`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If ``max_words`` or ``too_long`` is invalid.
        DataFormatError: On the first malformed line or tree (see the module docstring), or
            a file without sentences.
    """
    if not isinstance(max_words, int) or max_words < 1:
        raise ValueError(f"max_words must be a positive int, got {max_words!r}")
    if too_long not in ("error", "skip"):
        raise ValueError(f"too_long must be 'error' or 'skip', got {too_long!r}")
    name = str(path)
    sentences: list[DepSentence] = []
    skipped: list[int] = []
    block = _Block()
    started = False
    with gc_paused():
        for number, text in enumerate(read_lines(path), start=1):
            if not text or text.isspace():
                if started:
                    sentence = _finish(block, name, max_words, too_long, skipped)
                    if sentence is not None:
                        sentences.append(sentence)
                    block, started = _Block(), False
                continue
            if not started:
                block.first, started = number, True
            if text[0] == "#":
                _comment(block, text)
            else:
                _token(block, text, name, number)
        if started:
            sentence = _finish(block, name, max_words, too_long, skipped)
            if sentence is not None:
                sentences.append(sentence)
    if not sentences and not skipped:
        raise DataFormatError(name, 1, "an empty file (no sentences)",
                              "CoNLL-U sentences separated by blank lines",
                              "check the path and the file")
    return Treebank(name, tuple(sentences), tuple(skipped), max_words)
