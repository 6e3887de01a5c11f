"""Tests of edbatch.data.ud: the real EWT files, every malformed case with its file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from edbatch.data import UPOS_TAGS, DepSentence, Treebank, find_cycle, load_conllu
from edbatch.data._text import parsed
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "ud_ewt"


def _row(ident: str, form: str, upos: str = "NOUN", head: str = "0",
         deprel: str = "root") -> str:
    return "\t".join([ident, form, form.lower(), upos, "_", "_", head, deprel, "_", "_"])


# A sentence with a multiword token (3-4) and an empty node (4.1); lines 1-8 of GOOD.
GOOD_LINES = [
    "# sent_id = s1",
    "# text = I don't sing.",
    _row("1", "I", "PRON", "3", "nsubj"),
    _row("2-3", "don't", "_", "_", "_"),
    _row("2", "do", "AUX", "3", "aux"),
    _row("3", "n't", "PART", "0", "root"),
    _row("3.1", "sing", "VERB", "_", "_"),
    _row("4", ".", "PUNCT", "3", "punct"),
]
GOOD = "\n".join(GOOD_LINES) + "\n\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.conllu"
    path.write_text(text, encoding="utf-8")
    return path


def _bad(tmp_path: Path, line: int, replacement: str | None) -> DataFormatError:
    """Replace line ``line`` of the second sentence (file line 9 + line) and load."""
    lines = list(GOOD_LINES)
    if replacement is None:
        del lines[line - 1]
    else:
        lines[line - 1] = replacement
    path = _write(tmp_path, GOOD + "\n".join(lines) + "\n\n" + GOOD)
    with pytest.raises(DataFormatError) as info:
        load_conllu(path)
    return info.value


def test_multiword_tokens_and_empty_nodes(tmp_path: Path) -> None:
    bank = load_conllu(_write(tmp_path, GOOD + GOOD))
    assert isinstance(bank, Treebank)
    assert len(bank) == 2
    s = bank[0]
    assert s.words == ("I", "do", "n't", ".")  # the tree's words: no range, no empty node
    assert s.tokens == ("I", "don't", ".")  # the surface: the range replaces its words
    assert s.upos == ("PRON", "AUX", "PART", "PUNCT")
    assert s.heads == (3, 3, 0, 3)
    assert s.deprels == ("nsubj", "aux", "root", "punct")
    assert (s.sent_id, s.text, s.empty_nodes) == ("s1", "I don't sing.", 1)
    assert (s.line, bank[1].line) == (3, 12)  # first token line
    assert s.root == 3
    assert s.word_lines == (3, 5, 6, 8)
    assert s.children() == ((3,), (), (), (1, 2, 4), ())


@pytest.mark.parametrize(
    ("line", "replacement", "needles"),
    [
        (3, "1\tI\tI\tPRON\t_\t_\t3\tnsubj\t_", ["9 tab-separated columns"]),
        (3, _row("1", "I", "PRON", "3", "nsubj") + "\textra", ["11 tab-separated columns"]),
        (3, "1 I I PRON _ _ 3 nsubj _ _", ["1 tab-separated columns"]),
        (3, _row("x", "I", "PRON", "3", "nsubj"), ["the ID 'x'"]),
        (3, _row("01", "I", "PRON", "3", "nsubj"), ["the ID '01'"]),
        (3, _row("\u0661", "I", "PRON", "3", "nsubj"), ["the ID '\u0661'"]),
        (3, _row("0", "I", "PRON", "3", "nsubj"), ["the word ID 0 after word 0"]),
        (5, _row("3", "do", "AUX", "3", "aux"), ["word ID 3 after word 1", "expected word 2"]),
        (5, _row("1", "do", "AUX", "3", "aux"), ["word ID 1 after word 1"]),
        (4, _row("3-2", "don't", "_", "_", "_"), ["the ID '3-2'"]),
        (4, _row("2-2", "don't", "_", "_", "_"), ["multiword token 2-2"]),
        (4, _row("3-4", "don't", "_", "_", "_"), ["multiword token 3-4 after word 1"]),
        (7, _row("2.1", "sing", "VERB", "_", "_"), ["empty node 2.1 after word 3"]),
        (3, _row("1", "I", "PRN", "3", "nsubj"), ["UPOS tag 'PRN'"]),
        (3, _row("1", "I", "_", "3", "nsubj"), ["UPOS tag '_'"]),
        (3, _row("1", "", "PRON", "3", "nsubj"), ["an empty FORM"]),
        (3, _row("1", "I", "PRON", "x", "nsubj"), ["HEAD 'x' of word 1"]),
        (3, _row("1", "I", "PRON", "_", "nsubj"), ["HEAD '_' of word 1"]),
        (3, _row("1", "I", "PRON", "-1", "nsubj"), ["HEAD '-1' of word 1"]),
        (3, _row("1", "I", "PRON", "2.5", "nsubj"), ["HEAD '2.5' of word 1"]),
        (3, _row("1", "I", "PRON", "9", "nsubj"), ["HEAD 9 of word 1", "of 4 words"]),
        (3, _row("1", "I", "PRON", "1", "nsubj"), ["word 1 as its own head"]),
        (3, _row("1", "I", "PRON", "3", "subject"), ["DEPREL 'subject' of word 1"]),
        (3, _row("1", "I", "PRON", "3", "_"), ["DEPREL '_'"]),
        (8, _row("4", ".", "PUNCT", "0", "root"), ["a second root, word 4",
                                                   "word 3 at line 15 also has HEAD 0"]),
    ],
)
def test_malformed_line(tmp_path: Path, line: int, replacement: str,
                        needles: list[str]) -> None:
    err = _bad(tmp_path, line, replacement)
    assert err.line == 9 + line  # the second sentence starts at file line 10
    assert str(err).startswith(f"{err.path}:{err.line}: found ")
    assert "\n" not in str(err)
    for needle in needles:
        assert needle in str(err)


def test_cycle_names_the_words_and_the_line(tmp_path: Path) -> None:
    lines = [
        _row("1", "a", "DET", "2", "det"),
        _row("2", "b", "NOUN", "3", "nsubj"),
        _row("3", "c", "VERB", "2", "ccomp"),
        _row("4", "d", "VERB", "0", "root"),
    ]
    path = _write(tmp_path, GOOD + "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"t.conllu:11: found the cycle 2 -> 3 -> 2"):
        load_conllu(path)


def test_no_root_is_a_cycle(tmp_path: Path) -> None:
    lines = [_row("1", "a", "DET", "2", "det"), _row("2", "b", "NOUN", "1", "nsubj")]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"t.conllu:1: found the cycle 1 -> 2 -> 1"):
        load_conllu(path)


def test_multiword_token_past_the_end(tmp_path: Path) -> None:
    lines = [_row("1-2", "ab", "_", "_", "_"), _row("1", "a", "NOUN", "0", "root")]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"t.conllu:2: found a multiword token "
                                              r"reaching word 2 in a sentence of 1 words"):
        load_conllu(path)


def test_sentence_without_words(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + "# sent_id = x\n# text = nothing\n\n" + GOOD)
    with pytest.raises(DataFormatError, match=r"t.conllu:10: found a sentence with no word"):
        load_conllu(path)


def test_length_limit_error_or_skip(tmp_path: Path) -> None:
    long = "\n".join([_row("1", "w", "NOUN", "0", "root")]
                     + [_row(str(i), "w", "NOUN", "1", "dep") for i in range(2, 8)])
    path = _write(tmp_path, GOOD + long + "\n\n" + GOOD)
    with pytest.raises(DataFormatError, match=r"t.conllu:10: found a sentence of 7 words; "
                                              r"expected at most max_words=6"):
        load_conllu(path, max_words=6)
    bank = load_conllu(path, max_words=6, too_long="skip")
    assert [s.line for s in bank] == [3, 20]
    assert bank.skipped == (10,)
    assert "1 skipped longer than 6 words" in repr(bank)
    assert len(load_conllu(path, max_words=7)) == 3
    with pytest.raises(ValueError, match="max_words"):
        load_conllu(path, max_words=0)
    with pytest.raises(ValueError, match="too_long"):
        load_conllu(path, too_long="drop")  # type: ignore[arg-type]


def test_blank_lines_comments_and_crlf(tmp_path: Path) -> None:
    text = "\n\n" + GOOD + "\n   \n" + GOOD.rstrip("\n")  # no final blank line
    bank = load_conllu(_write(tmp_path, text.replace("\n", "\r\n")))
    assert [s.line for s in bank] == [5, 16]
    assert bank[1].words == ("I", "do", "n't", ".")


@pytest.mark.parametrize("content", ["", "\n\n", "# only = comments\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(DataFormatError, match=r"t.conllu:1: found (an empty file|a sentence "
                                              r"with no word)"):
        load_conllu(path)


def test_not_utf8_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "latin1.conllu"
    path.write_bytes((GOOD + _row("1", "caf\xe9") + "\n").encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1.conllu:10: found bytes"):
        load_conllu(path)
    with pytest.raises(FileNotFoundError):
        load_conllu(tmp_path / "nope.conllu")


def test_parsed_reads_an_edited_file_again(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    first = parsed(load_conllu, path)
    assert parsed(load_conllu, path) is first  # unchanged: parsed once
    assert parsed(load_conllu, path, max_words=9) is not first  # other options: parsed again
    path.write_text(GOOD + GOOD, encoding="utf-8")  # edited in the same process
    assert len(parsed(load_conllu, path)) == 2
    path.write_text(GOOD + "1\tcut\n", encoding="utf-8")  # a line cut short
    for _ in range(2):  # an error is not cached: the bad file raises every time
        with pytest.raises(DataFormatError, match=r"t.conllu:10: found 2 tab-separated"):
            parsed(load_conllu, path)
    path.write_text(GOOD, encoding="utf-8")
    assert len(parsed(load_conllu, path)) == 1


def test_find_cycle() -> None:
    assert find_cycle([0]) is None
    assert find_cycle([2, 0, 2, 3]) is None
    assert find_cycle([1]) == [1]
    assert find_cycle([0, 4, 2, 3]) == [2, 4, 3]
    assert find_cycle([3, 1, 2, 0]) == [1, 3, 2]


# --- the real files -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ewt_dev() -> Treebank:
    return load_conllu(DATA / "en_ewt-ud-dev.conllu")


def test_ewt_dev(ewt_dev: Treebank) -> None:
    bank = ewt_dev
    assert len(bank) == 2001
    assert sum(len(s) for s in bank) == 25147
    # 359 multiword tokens: 358 span 2 words, one spans 3, so 360 words fewer on the surface
    assert sum(len(s) - len(s.tokens) for s in bank) == 360
    assert sum(s.empty_nodes for s in bank) == 4
    assert max(len(s) for s in bank) == 75
    assert bank.skipped == ()
    assert {t for s in bank for t in s.upos} == set(UPOS_TAGS)
    first = bank[0]
    assert isinstance(first, DepSentence)
    assert first.words[:4] == ("From", "the", "AP", "comes")
    assert first.heads[:4] == (3, 3, 4, 0)
    assert first.text == "From the AP comes this story :"
    assert first.line == 5
    for s in bank:
        assert s.heads.count(0) == 1
        assert find_cycle(s.heads) is None


@pytest.mark.parametrize(("split", "sentences", "words", "empty"),
                         [("train", 12544, 204577, 37), ("test", 2077, 25094, 2)])
def test_ewt_train_and_test(split: str, sentences: int, words: int, empty: int) -> None:
    bank = load_conllu(DATA / f"en_ewt-ud-{split}.conllu")
    assert (len(bank), sum(len(s) for s in bank)) == (sentences, words)
    assert sum(s.empty_nodes for s in bank) == empty
