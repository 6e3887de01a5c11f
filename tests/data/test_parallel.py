"""Tests of edbatch.data.parallel: the real IWSLT15 files and every malformed case."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from edbatch.data import SentencePair, load_pairs, load_vocab, pair_files, wrap_sentence
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "iwslt15"
PAIR = "<s> a b </s> ||| <s> c </s>"


def test_real_tst2012_pairs() -> None:
    pairs = load_pairs(DATA / "tst2012.en-vi.capped")
    assert len(pairs) == 1553
    assert pairs[1] == SentencePair(
        ("<s>", "This", "is", "not", "a", "finished", "story", ".", "</s>"),
        ("<s>", "Câu", "chuyện", "này", "chưa", "kết", "thúc", ".", "</s>"),
    )
    assert round(statistics.mean(len(p.source) for p in pairs), 1) == 20.0
    assert max(len(p.source) for p in pairs) == 95
    assert round(statistics.mean(len(p.target) for p in pairs), 1) == 24.1
    assert max(len(p.target) for p in pairs) == 124


def test_real_vocabularies() -> None:
    en = load_vocab(DATA / "vocab.en")
    vi = load_vocab(DATA / "vocab.vi")
    assert (len(en), len(vi)) == (17191, 7709)
    assert [en["<unk>"], en["<s>"], en["</s>"]] == [0, 1, 2]
    assert vi["\u200b"] == 6510  # line 6511 is a zero-width-space token


def test_real_tst2013_pairs_are_built_like_the_capped_files() -> None:
    vocab = load_vocab(DATA / "vocab.vi")
    pairs = pair_files(DATA / "tst2013.en.capped", DATA / "tst2013.vi", vocab)
    assert len(pairs) == 1268
    assert pairs[1].source == ("<s>", "And", "I", "was", "very", "proud", ".", "</s>")
    assert pairs[1].target == ("<s>", "Tôi", "đã", "rất", "tự", "hào", "về", "đất", "nước",
                               "tôi", ".", "</s>")
    assert all(tok in vocab for p in pairs for tok in p.target)
    raw = (DATA / "tst2013.vi").read_text(encoding="utf-8").split("\n")
    assert [len(p.target) - 2 for p in pairs] == [len(line.split()) for line in raw[:-1]]
    assert sum(tok == "<unk>" for p in pairs for tok in p.target) == 358


def test_wrap_sentence() -> None:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}
    assert wrap_sentence("a  zz\ta", vocab) == ("<s>", "a", "<unk>", "a", "</s>")
    assert wrap_sentence("a\u00a0a", vocab) == ("<s>", "<unk>", "</s>")  # NBSP is no separator


def _pairs_error(tmp_path: Path, bad: str) -> DataFormatError:
    path = tmp_path / "pairs.capped"
    path.write_text(f"{PAIR}\n\n{bad}\n{PAIR}\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_pairs(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: found ")
    return info.value


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("<s> a b </s> <s> c </s>", "no ' ||| ' separator"),
        ("<s> a </s>|||<s> c </s>", "no ' ||| ' separator"),
        ("<s> a </s> ||| <s> b </s> ||| <s> c </s>", "2 separators"),
        ("a b </s> ||| <s> c </s>", "the source side 'a b </s>', not wrapped in <s> ... </s>"),
        ("<s> a b </s> ||| <s> c", "the target side '<s> c', not wrapped in <s> ... </s>"),
        ("<s> a b </s> ||| ", "an empty target side"),
        ("   ||| <s> c </s>", "an empty source side"),
        ("<s> </s> ||| <s> c </s>", "an empty source sentence '<s> </s>'"),
    ],
)
def test_malformed_pairs(tmp_path: Path, bad: str, needle: str) -> None:
    assert needle in _pairs_error(tmp_path, bad).found


def test_empty_pair_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.capped"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"empty.capped:1: found an empty file"):
        load_pairs(path)


def _vocab_error(tmp_path: Path, lines: list[str]) -> DataFormatError:
    path = tmp_path / "vocab.xx"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_vocab(path)
    assert str(info.value).startswith(f"{path}:{info.value.line}: found ")
    return info.value


def test_vocab_special_tokens(tmp_path: Path) -> None:
    err = _vocab_error(tmp_path, ["<unk>", "</s>", "<s>", "a"])
    assert err.line == 2 and "'</s>'" in err.found and "'<s>'" in err.expected
    err = _vocab_error(tmp_path, ["<unk>", "<s>"])
    assert err.line == 3 and "only 2 line(s)" in err.found
    err = _vocab_error(tmp_path, [])
    assert err.line == 1 and "only 0 line(s)" in err.found


def test_vocab_bad_lines(tmp_path: Path) -> None:
    err = _vocab_error(tmp_path, ["<unk>", "<s>", "</s>", "a", "", "b"])
    assert err.line == 5 and "the line ''" in err.found
    err = _vocab_error(tmp_path, ["<unk>", "<s>", "</s>", "a b"])
    assert err.line == 4 and "'a b'" in err.found
    err = _vocab_error(tmp_path, ["<unk>", "<s>", "</s>", "a", "b", "a"])
    assert err.line == 6 and "'a' a second time (first on line 4)" in err.found


def test_vocab_ok(tmp_path: Path) -> None:
    path = tmp_path / "vocab.xx"
    path.write_text("<unk>\n<s>\n</s>\nx \ny\n", encoding="utf-8")
    assert load_vocab(path) == {"<unk>": 0, "<s>": 1, "</s>": 2, "x": 3, "y": 4}


def _pair_files_setup(tmp_path: Path, src: str, tgt: str) -> tuple[Path, Path, Path]:
    src_path, tgt_path, vocab_path = tmp_path / "s.capped", tmp_path / "t.raw", tmp_path / "v"
    src_path.write_text(src, encoding="utf-8")
    tgt_path.write_text(tgt, encoding="utf-8")
    vocab_path.write_text("<unk>\n<s>\n</s>\nhello\n", encoding="utf-8")
    return src_path, tgt_path, vocab_path


def test_pair_files_wraps_target(tmp_path: Path) -> None:
    paths = _pair_files_setup(tmp_path, "<s> a </s>\n<s> b c </s>\n", "hello world\nhello\n")
    pairs = pair_files(*paths)
    assert pairs == [
        SentencePair(("<s>", "a", "</s>"), ("<s>", "hello", "<unk>", "</s>")),
        SentencePair(("<s>", "b", "c", "</s>"), ("<s>", "hello", "</s>")),
    ]


def test_pair_files_line_count_mismatch(tmp_path: Path) -> None:
    src, tgt, vocab = _pair_files_setup(tmp_path, "<s> a </s>\n<s> b </s>\n", "hello\n")
    with pytest.raises(DataFormatError) as info:
        pair_files(src, tgt, vocab)
    assert info.value.line == 2
    assert f"2 lines in {src} but 1 lines in {tgt}" in info.value.found


def test_pair_files_bad_lines(tmp_path: Path) -> None:
    src, tgt, vocab = _pair_files_setup(tmp_path, "<s> a </s>\nb\n", "hello\nhello\n")
    with pytest.raises(DataFormatError) as info:
        pair_files(src, tgt, vocab)
    assert str(info.value).startswith(f"{src}:2: found the source side 'b', not wrapped")
    src, tgt, vocab = _pair_files_setup(tmp_path, "<s> a </s>\n<s> b </s>\n", "hello\n \n")
    with pytest.raises(DataFormatError) as info:
        pair_files(src, tgt, vocab)
    assert str(info.value).startswith(f"{tgt}:2: found an empty target sentence")
    src, tgt, vocab = _pair_files_setup(tmp_path, "", "")
    with pytest.raises(DataFormatError, match="s.capped:1: found an empty file"):
        pair_files(src, tgt, vocab)
