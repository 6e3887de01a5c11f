"""Vocabularies for taggers that compose rare words from their characters.

As in DyNet's char-BiLSTM tagger benchmark (``bilstm-tagger-withchar.py`` in
``neulab/dynet-benchmark``): a word seen more than 5 times in train (``min_count=6``) is
looked up in a word table; every other word, rare or unseen, is read by a character BiLSTM.

* :class:`FrequentWords`: the words kept for lookup (id 0 means "compose from characters").
* :class:`CharVocab`: character ids of the train words, with a boundary symbol. A character
  never seen in train maps to the unknown id 0 by default (``unknown="unk"``: dev and test
  text does contain such characters); with ``unknown="error"`` it raises a
  :class:`~edbatch.errors.DataFormatError` naming the character, its code point, the word and
  ``file:line``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from edbatch.data._text import shorten
from edbatch.errors import DataFormatError

__all__ = ["DEFAULT_MIN_COUNT", "CharVocab", "FrequentWords", "word_counts"]

#: A word needs this many train occurrences to get its own embedding (DyNet: ``wc[w] > 5``).
DEFAULT_MIN_COUNT = 6
UNK = "<unk>"
BOUNDARY = "<w>"


def word_counts(sentences: Iterable[Sequence[str]]) -> Counter[str]:
    """Count the words of ``sentences`` (each a sequence of words, e.g. ``s.words``)."""
    counts: Counter[str] = Counter()
    for words in sentences:
        counts.update(words)
    return counts


class FrequentWords:
    """Ids for the words seen at least ``min_count`` times; id 0 for every other word.

    Ids are assigned by decreasing count, ties by the word, so they are deterministic.

    Example:
        >>> v = FrequentWords(word_counts([["a", "b", "a"], ["a", "c", "b"]]), min_count=2)
        >>> v.words, v.id("a"), v.id("c"), v.is_rare("c"), v.is_rare("zebra"), len(v)
        (('<unk>', 'a', 'b'), 1, 0, True, True, 3)
    """

    __slots__ = ("counts", "ids", "min_count", "words")

    def __init__(self, counts: Mapping[str, int], min_count: int = DEFAULT_MIN_COUNT) -> None:
        if not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be a positive int, got {min_count!r}; 1 keeps "
                             "every train word")
        kept = sorted((w for w, c in counts.items() if c >= min_count),
                      key=lambda w: (-counts[w], w))
        self.min_count = min_count
        #: Train count of every word (not only the kept ones).
        self.counts: dict[str, int] = dict(counts)
        #: Id -> word; ``words[0]`` is ``"<unk>"`` (a rare or unseen word).
        self.words: tuple[str, ...] = (UNK, *kept)
        #: Word -> id for the kept words.
        self.ids: dict[str, int] = {w: i for i, w in enumerate(kept, start=1)}

    @classmethod
    def from_sentences(cls, sentences: Iterable[Sequence[str]],
                       min_count: int = DEFAULT_MIN_COUNT) -> FrequentWords:
        """Count the words of ``sentences`` (normally the train split) and keep the frequent."""
        return cls(word_counts(sentences), min_count)

    def __len__(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        """The id of ``word``; 0 if it is rare or unseen (compose it from characters)."""
        return self.ids.get(word, 0)

    def is_rare(self, word: str) -> bool:
        """Whether ``word`` has no id of its own (seen fewer than ``min_count`` times)."""
        return word not in self.ids

    def __repr__(self) -> str:
        return f"FrequentWords({len(self)} ids, min_count={self.min_count})"


class CharVocab:
    """Character ids: 0 = unknown character, 1 = the word boundary, then the characters.

    Example:
        >>> v = CharVocab.from_words(["ab", "ba", "c"])
        >>> v.chars, v.encode("cab"), v.encode("ax"), v.encode("a", boundaries=True)
        (('<unk>', '<w>', 'a', 'b', 'c'), (4, 2, 3), (2, 0), (1, 2, 1))
    """

    __slots__ = ("chars", "ids", "unknown")

    def __init__(self, chars: Iterable[str], *,
                 unknown: Literal["unk", "error"] = "unk") -> None:
        if unknown not in ("unk", "error"):
            raise ValueError(f"unknown must be 'unk' or 'error', got {unknown!r}")
        kept = sorted(set(chars))
        bad = [c for c in kept if len(c) != 1]
        if bad:
            raise ValueError(f"a character vocabulary takes single characters, got "
                             f"{shorten(bad[0])}")
        self.unknown = unknown
        #: Id -> character; ids 0 and 1 are ``"<unk>"`` and ``"<w>"``.
        self.chars: tuple[str, ...] = (UNK, BOUNDARY, *kept)
        #: Character -> id.
        self.ids: dict[str, int] = {c: i for i, c in enumerate(kept, start=2)}

    @classmethod
    def from_words(cls, words: Iterable[str], *,
                   unknown: Literal["unk", "error"] = "unk") -> CharVocab:
        """The characters of ``words`` (normally every train word)."""
        chars: set[str] = set()
        for word in words:
            chars.update(word)
        return cls(chars, unknown=unknown)

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, word: str, *, boundaries: bool = False, path: str = "<word>",
               line: int = 1) -> tuple[int, ...]:
        """The ids of the characters of ``word``.

        Args:
            word: The word.
            boundaries: Put the boundary id 1 before and after the characters.
            path: File named in the error for an unknown character.
            line: Line named in that error.

        Raises:
            DataFormatError: With ``unknown="error"``, for a character not in the vocabulary.
        """
        ids = self.ids
        out = [ids.get(c, 0) for c in word]
        if self.unknown == "error" and 0 in out:
            char = word[out.index(0)]
            raise DataFormatError(path, line, f"the character {char!r} (U+{ord(char):04X}) "
                                  f"in the word {shorten(word)}, not in the character "
                                  f"vocabulary", f"one of the {len(ids)} train characters",
                                  "build the vocabulary from these words too, or use "
                                  "unknown='unk'")
        if boundaries:
            return (1, *out, 1)
        return tuple(out)

    def __repr__(self) -> str:
        return f"CharVocab({len(self)} ids, unknown={self.unknown!r})"
