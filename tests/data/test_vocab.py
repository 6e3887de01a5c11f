"""Tests of edbatch.data.vocab: rare words by train count, characters with UNK or an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from edbatch.data import CharVocab, FrequentWords, load_conllu, word_counts
from edbatch.data.vocab import DEFAULT_MIN_COUNT
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "ud_ewt"


def test_frequent_words_threshold() -> None:
    sentences = [["the", "cat", "the"], ["the", "dog", "cat"], ["a"]]
    counts = word_counts(sentences)
    assert counts == {"the": 3, "cat": 2, "dog": 1, "a": 1}
    v = FrequentWords(counts, min_count=2)
    assert v.words == ("<unk>", "the", "cat")
    assert [v.id(w) for w in ("the", "cat", "dog", "zebra")] == [1, 2, 0, 0]
    assert [v.is_rare(w) for w in ("the", "cat", "dog", "zebra")] == [False, False, True, True]
    assert v.counts["dog"] == 1
    everything = FrequentWords.from_sentences(sentences, min_count=1)
    assert everything.words == ("<unk>", "the", "cat", "a", "dog")  # count desc, then word
    assert len(FrequentWords(counts, min_count=4)) == 1
    assert DEFAULT_MIN_COUNT == 6  # DyNet's benchmark: a word seen more than 5 times
    with pytest.raises(ValueError, match="min_count must be a positive int"):
        FrequentWords(counts, min_count=0)


def test_char_vocab_unk_and_error() -> None:
    words = ["ab", "bc"]
    unk = CharVocab.from_words(words)
    assert unk.chars == ("<unk>", "<w>", "a", "b", "c")
    assert unk.encode("cab") == (4, 2, 3)
    assert unk.encode("a\u00e9b") == (2, 0, 3)  # unknown -> 0
    assert unk.encode("ab", boundaries=True) == (1, 2, 3, 1)
    strict = CharVocab.from_words(words, unknown="error")
    assert strict.encode("cab", boundaries=True) == (1, 4, 2, 3, 1)
    with pytest.raises(DataFormatError) as info:
        strict.encode("ca\u00e9b", path="dev.conllu", line=42)
    assert str(info.value).startswith(
        "dev.conllu:42: found the character '\u00e9' (U+00E9) in the word 'ca\u00e9b', not in "
        "the character vocabulary; expected one of the 3 train characters. Fix: ")
    with pytest.raises(ValueError, match="unknown must be"):
        CharVocab("ab", unknown="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single characters"):
        CharVocab(["ab"])


def test_ewt_rare_words_and_unseen_characters() -> None:
    train = load_conllu(DATA / "en_ewt-ud-train.conllu")
    dev = load_conllu(DATA / "en_ewt-ud-dev.conllu")
    words = FrequentWords.from_sentences(s.words for s in train)
    assert (len(words.counts), len(words)) == (19674, 3505)
    chars = CharVocab.from_words((w for s in train for w in s.words), unknown="error")
    assert len(chars) == 2 + 108
    # Dev has characters never seen in train: the strict vocabulary names the first one.
    unseen = [(s, i) for s in dev for i, w in enumerate(s.words)
              if any(c not in chars.ids for c in w)]
    assert {c for s, i in unseen for c in s.words[i] if c not in chars.ids} == {
        "\\", "\u00e0", "\u2665"}
    sentence, i = unseen[0]
    line = sentence.word_lines[i]
    assert Path(sentence.path).read_text(encoding="utf-8").split("\n")[line - 1].split(
        "\t")[1] == sentence.words[i]
    with pytest.raises(DataFormatError, match=rf"en_ewt-ud-dev.conllu:{line}: found "
                                              r"the character"):
        chars.encode(sentence.words[i], path=sentence.path, line=line)
    word = sentence.words[i]
    lenient = CharVocab(chars.chars[2:])
    assert 0 in lenient.encode(word)
