"""IWSLT15 English-Vietnamese sentence pairs in the ``*.capped`` format (``data/iwslt15/``).

The capped files were made by ED-Batch's ``wrap-data.py``: out-of-vocabulary tokens became
``<unk>`` and each sentence is wrapped as ``<s> ... </s>``; a pair file holds
``<s> en ... </s> ||| <s> vi ... </s>`` per line. Tokens are split on ASCII whitespace only, as
the original Python 2 script did on byte strings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from edbatch.data._text import read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = [
    "BOS",
    "EOS",
    "SEPARATOR",
    "UNK",
    "SentencePair",
    "load_pairs",
    "load_vocab",
    "pair_files",
    "wrap_sentence",
]

UNK = "<unk>"
BOS = "<s>"
EOS = "</s>"
SEPARATOR = " ||| "
_SPLIT = re.compile(r"[ \t\n\r\f\v]+")


@dataclass(frozen=True, slots=True)
class SentencePair:
    """A source sentence and its translation, both including ``<s>`` and ``</s>``.

    Attributes:
        source: English tokens, e.g. ``("<s>", "Thank", "you", ".", "</s>")``.
        target: Vietnamese tokens, wrapped the same way.
    """

    source: tuple[str, ...]
    target: tuple[str, ...]


def _tokens(text: str) -> list[str]:
    """Split on ASCII whitespace (a U+00A0 or U+200B inside a token stays part of it)."""
    return [token for token in _SPLIT.split(text) if token]


def _fail(path: str, line: int, found: str, expected: str, fix: str) -> NoReturn:
    """Raise a :class:`DataFormatError` (a helper that type checkers know never returns)."""
    raise DataFormatError(path, line, found, expected, fix)


def _wrapped(text: str, side: str, path: str, line: int) -> tuple[str, ...]:
    """Check that ``text`` is ``<s> tok ... </s>`` with at least one token inside."""
    tokens = _tokens(text)
    if not tokens:
        _fail(path, line, f"an empty {side} side", f"the {side} as '<s> ... </s>'",
              "every line needs a non-empty sentence on each side")
    if tokens[0] != BOS or tokens[-1] != EOS or len(tokens) < 2:
        _fail(path, line, f"the {side} side {shorten(text.strip())}, not wrapped in <s> ... </s>",
              f"the {side} as '<s> ... </s>'", "the capped files wrap every sentence in "
              "<s> ... </s> (see wrap-data.py)")
    if len(tokens) == 2:
        _fail(path, line, f"an empty {side} sentence '<s> </s>'",
              f"at least one token between <s> and </s> on the {side} side",
              "drop empty sentences from the corpus")
    return tuple(tokens)


def load_pairs(path: str | Path) -> list[SentencePair]:
    """Load a ``<s> en ... </s> ||| <s> vi ... </s>`` file (one pair per non-blank line).

    Args:
        path: A pair file such as ``data/iwslt15/tst2012.en-vi.capped``.

    Returns:
        The sentence pairs in file order.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: On a line without exactly one ``' ||| '``, a side not wrapped in
            ``<s> ... </s>``, an empty side, or a file without pairs.
    """
    name = str(path)
    pairs: list[SentencePair] = []
    for number, text in enumerate(read_lines(path), start=1):
        if not text.strip():
            continue
        sides = text.split(SEPARATOR)
        if len(sides) != 2:
            found = "no ' ||| ' separator" if len(sides) == 1 else f"{len(sides) - 1} separators"
            _fail(name, number, f"{found} in {shorten(text)}",
                  "exactly one ' ||| ' between source and target",
                  "write each pair as '<s> source </s> ||| <s> target </s>'")
        source = _wrapped(sides[0], "source", name, number)
        target = _wrapped(sides[1], "target", name, number)
        pairs.append(SentencePair(source, target))
    if not pairs:
        _fail(name, 1, "an empty file (no sentence pairs)",
              "one '<s> source </s> ||| <s> target </s>' pair per line",
              "check the path and the file")
    return pairs


def load_vocab(path: str | Path) -> dict[str, int]:
    """Load a vocabulary file: one token per line, the line order giving the ids.

    Args:
        path: A file such as ``data/iwslt15/vocab.vi``; its first three tokens must be
            ``<unk>``, ``<s>`` and ``</s>`` (ids 0, 1, 2).

    Returns:
        A dict from token to id (0-based line index).

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: On wrong or missing special tokens, a blank line, a line with
            whitespace inside the token, or a duplicate token.
    """
    name = str(path)
    lines = read_lines(path)
    vocab: dict[str, int] = {}
    for index, raw in enumerate(lines):
        token = raw.strip(" \t\r\f\v")
        if not token or len(_tokens(token)) != 1:
            _fail(name, index + 1, f"the line {shorten(raw)}",
                  "exactly one token per line", "remove blank lines and split the line")
        if index < 3 and token != (UNK, BOS, EOS)[index]:
            _fail(name, index + 1, f"the token {shorten(token)}",
                  f"{(UNK, BOS, EOS)[index]!r}: a vocabulary starts with <unk>, <s>, </s>",
                  "put <unk>, <s> and </s> on the first three lines")
        if token in vocab:
            _fail(name, index + 1, f"the token {shorten(token)} a second time (first on line "
                  f"{vocab[token] + 1})", "each token once", "remove the duplicate line")
        vocab[token] = index
    if len(vocab) < 3:
        _fail(name, len(lines) + 1, f"only {len(vocab)} line(s)",
              "at least the three special tokens <unk>, <s>, </s>",
              "check the path and the file")
    return vocab


def wrap_sentence(text: str, vocab: Mapping[str, int]) -> tuple[str, ...]:
    """Wrap a raw sentence like ``wrap-data.py``: OOV tokens become ``<unk>``, add ``<s> </s>``.

    Args:
        text: A raw tokenised sentence (tokens separated by ASCII whitespace).
        vocab: Known tokens (e.g. from :func:`load_vocab`).

    Returns:
        ``("<s>", tok_or_unk, ..., "</s>")``.
    """
    return (BOS, *(token if token in vocab else UNK for token in _tokens(text)), EOS)


def pair_files(
    src_capped: str | Path, tgt_raw: str | Path, tgt_vocab: str | Path | Mapping[str, int]
) -> list[SentencePair]:
    """Pair a capped source file with a raw target file, line by line.

    The target is wrapped exactly like the capped files (see :func:`wrap_sentence`). This
    builds e.g. the tst2013 pairs from ``tst2013.en.capped`` and ``tst2013.vi``.

    Args:
        src_capped: Source sentences, one ``<s> ... </s>`` per line.
        tgt_raw: Raw target sentences, one per line, aligned with ``src_capped``.
        tgt_vocab: Target vocabulary file (or an already loaded mapping).

    Returns:
        One pair per line.

    Raises:
        DataFormatError: If the files have different numbers of lines, a source line is not
            wrapped in ``<s> ... </s>``, a side is empty, or either file is empty.
    """
    vocab = tgt_vocab if isinstance(tgt_vocab, Mapping) else load_vocab(tgt_vocab)
    src_name, tgt_name = str(src_capped), str(tgt_raw)
    sources = read_lines(src_capped)
    targets = read_lines(tgt_raw)
    if len(sources) != len(targets):
        line = min(len(sources), len(targets)) + 1
        _fail(src_name, line, f"{len(sources)} lines in {src_name} but {len(targets)} lines "
              f"in {tgt_name}", "line-aligned files with the same number of lines",
              "pair the matching source and target files")
    if not sources:
        _fail(src_name, 1, "an empty file (no sentences)", "one sentence per line",
              "check the path and the file")
    pairs: list[SentencePair] = []
    for number, (source, target) in enumerate(zip(sources, targets, strict=True), start=1):
        wrapped_source = _wrapped(source, "source", src_name, number)
        if not _tokens(target):
            _fail(tgt_name, number, "an empty target sentence", "a non-empty sentence",
                  "drop the pair from both files")
        pairs.append(SentencePair(wrapped_source, wrap_sentence(target, vocab)))
    return pairs
