"""Tests of edbatch.data.trees: the real SST files, every malformed case, a round trip."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.data import Tree, load_trees, parse_tree
from edbatch.errors import DataFormatError

DATA = Path(__file__).resolve().parents[2] / "data" / "trees"
GOOD = "(1 (2 I) (0 (0 hate) (2 movie)))"


@pytest.fixture(scope="module")
def train() -> list[Tree]:
    """train.txt, parsed once for the module (and released after it)."""
    return load_trees(DATA / "train.txt")


def _internal_arities(tree: Tree) -> list[int]:
    out: list[int] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.children:
            out.append(len(node.children))
        stack.extend(node.children)
    return out


@pytest.mark.parametrize(
    ("split", "count", "max_nodes", "max_height"),
    [("train", 8550, 103, 30), ("dev", 1107, 97, 28), ("test", 2210, 111, 29)],
)
def test_real_files(
    split: str, count: int, max_nodes: int, max_height: int, request: pytest.FixtureRequest
) -> None:
    trees = request.getfixturevalue("train") if split == "train" else load_trees(
        DATA / f"{split}.txt"
    )
    assert len(trees) == count
    nodes = [t.num_nodes for t in trees]
    heights = [t.height for t in trees]
    assert max(nodes) == max_nodes
    assert max(heights) == max_height
    assert 37.2 < statistics.mean(nodes) < 37.6
    assert 10.8 < statistics.mean(heights) < 10.9
    assert all(a == 2 for t in trees for a in _internal_arities(t))
    assert {t.label for t in trees} <= {0, 1, 2, 3, 4}


def test_first_train_tree_and_nbsp_words(train: list[Tree]) -> None:
    trees = train
    first = trees[0]
    assert first.leaves() == ("I", "hate", "this", "movie")
    assert first.label == 1
    assert (first.num_nodes, first.height) == (7, 4)
    # Line 4348 holds the film title "8 1/2" with a U+00A0 inside one word.
    assert "8\u00a01\\/2" in trees[4347].leaves()


def test_helpers() -> None:
    tree = parse_tree("(3 (2 a) (4 (3 b) (2 c) (1 d)))")
    assert not tree.is_leaf
    assert tree.children[0].is_leaf
    assert tree.children[0].word == "a"
    assert tree.word is None
    assert tree.leaves() == ("a", "b", "c", "d")
    assert tree.num_nodes == 6
    assert tree.height == 3
    assert len(tree.children[1].children) == 3  # n-ary nodes are accepted
    single = parse_tree("  (2 word)\t")
    assert single == Tree(2, (), "word")
    assert (single.num_nodes, single.height, single.leaves()) == (1, 1, ("word",))


def test_whitespace_variants_and_hash() -> None:
    a = parse_tree("(2 (2 a) (3 b))")
    b = parse_tree("( 2\t( 2  a ) (3\tb ) )")
    assert a == b
    assert hash(a) == hash(b)


# Each case: (line 3 content, column, words the message must contain).
BAD_LINES = [
    ("(2 (2 a) (2 b)", 1, ["1 unclosed '('"]),
    ("(2 (2 a) (2 b)))", 16, ["extra ')'", "after the tree closed"]),
    (")(2 a)", 1, ["extra ')'"]),
    ("(x (2 a) (2 b))", 1, ["non-integer label 'x'"]),
    ("(2 (1.5 a) (2 b))", 4, ["non-integer label '1.5'"]),
    ("((2 a) (2 b))", 1, ["'(' without a label"]),
    ("(2 () (2 b))", 4, ["empty constituent '()'"]),
    ("()", 1, ["empty constituent '()'"]),
    ("(2 (3) (2 b))", 4, ["'(3)' with a label but no word"]),
    ("(2 (2 a) (2 b)) (2 c)", 17, ["second tree after the tree closed"]),
    ("(2 (2 a) (2 b)) c", 17, ["word 'c' after the tree closed"]),
    ("c (2 (2 a) (2 b))", 1, ["word 'c' before the first '('"]),
    ("(2 (2 a b) (2 c))", 9, ["second word 'b'", "already holds 'a'"]),
    ("(2 (2 a) b)", 10, ["word 'b' after sub-trees"]),
    ("(2 a (2 b))", 6, ["sub-tree after the word 'a'"]),
]


@pytest.mark.parametrize(("bad", "column", "needles"), BAD_LINES)
def test_malformed_line(tmp_path: Path, bad: str, column: int, needles: list[str]) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(f"{GOOD}\n{GOOD}\n{bad}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_trees(path)
    err = info.value
    assert err.line == 3
    assert str(err).startswith(f"{path}:3: found ")
    assert f"at column {column}" in str(err)
    for needle in needles:
        assert needle in err.found


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text(f"{GOOD}\n\n   \n(2 (2 a)\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_trees(path)
    assert info.value.line == 4
    path.write_text(f"\n{GOOD}\n\n{GOOD}\n", encoding="utf-8")
    assert len(load_trees(path)) == 2


@pytest.mark.parametrize("content", ["", "\n\n", "  \n\t\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"empty.txt:1: found an empty file \(no trees\)"):
        load_trees(path)


def test_parse_tree_reports_given_path_and_line() -> None:
    with pytest.raises(DataFormatError) as info:
        parse_tree("(2 (2 a) (2 b)", path="corpus.txt", line=7)
    assert str(info.value).startswith("corpus.txt:7: found 1 unclosed '(' at column 1")
    with pytest.raises(DataFormatError, match="no tree"):
        parse_tree("   ")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(f"{GOOD}\n(2 caf\xe9)\n".encode("latin-1"))
    with pytest.raises(DataFormatError) as info:
        load_trees(path)
    assert info.value.line == 2
    assert "not UTF-8" in info.value.found


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trees(tmp_path / "nope.txt")


# --- round trip -------------------------------------------------------------------------

_WORD = st.text(  # any non-surrogate character but ASCII whitespace and brackets (NBSP is fine)
    alphabet=st.characters(codec="utf-8", exclude_characters="() \t\n\r\f\v"),
    min_size=1,
    max_size=6,
)
_LABEL = st.integers(min_value=-5, max_value=20)


def _trees(max_leaves: int = 30) -> st.SearchStrategy[Tree]:
    leaf = st.builds(lambda label, word: Tree(label, (), word), _LABEL, _WORD)
    return st.recursive(
        leaf,
        lambda sub: st.builds(lambda label, a, b: Tree(label, (a, b)), _LABEL, sub, sub),
        max_leaves=max_leaves,
    )


def _to_bracket(tree: Tree, sep: str) -> str:
    if tree.is_leaf:
        return f"({tree.label}{sep}{tree.word})"
    inner = sep.join(_to_bracket(child, sep) for child in tree.children)
    return f"({tree.label}{sep}{inner})"


@settings(max_examples=200, deadline=None)
@given(tree=_trees(), sep=st.sampled_from([" ", "  ", "\t", " \t "]))
def test_round_trip_random_binary_trees(tree: Tree, sep: str) -> None:
    text = _to_bracket(tree, sep)
    parsed = parse_tree(text)
    assert parsed == tree
    assert parsed.leaves() == tree.leaves()
    assert parse_tree(f"  {text}\r") == tree


@pytest.mark.parametrize("label", ["9", "-1", "5"])
@pytest.mark.parametrize("workload", ["tree_lstm", "tree_gru", "mvrnn"])
def test_sst_workloads_refuse_labels_outside_0_to_4_naming_file_and_line(
        tmp_path: Path, label: str, workload: str) -> None:
    """The SST domain (labels 0..4) is checked at load, with file:line, not at execution."""
    from edbatch.workloads import make_workload

    good = "(3 (2 An) (4 (3 (2 good) (3 film)) (2 .)))"
    (tmp_path / "trees").mkdir()
    for split in ("train", "dev", "test"):
        (tmp_path / "trees" / f"{split}.txt").write_text(f"{good}\n{good}\n")
    bad = good.replace("(4 (3 (2 good)", f"(4 (3 ({label} good)")
    (tmp_path / "trees" / "dev.txt").write_text(f"{good}\n\n{bad}\n")
    wl = make_workload(workload, data_dir=tmp_path)
    assert len(wl.load("train")) == 2
    # load_trees checks the domain itself (naming the column), before the workload does.
    with pytest.raises(DataFormatError, match=rf"dev.txt:3: found the label {label} at "
                                              r"column 17; expected labels 0\.\.4"):
        wl.load("dev")


# --- label domain (issue 29: load_trees accepted SST label 9) -----------------------------


@pytest.mark.parametrize(("bad", "label", "column"), [
    ("(3 (2 a) (9 b))", 9, 10),
    ("(5 (2 a) (2 b))", 5, 1),
    ("(2 (2 a) (-1 b))", -1, 10),
    ("(2\t(2 a)\t(2 (2 b) (12 c)))", 12, 19),
])
def test_load_trees_refuses_labels_outside_0_to_4(tmp_path: Path, bad: str, label: int,
                                                  column: int) -> None:
    path = tmp_path / "sst.txt"
    path.write_text(f"{GOOD}\n\n{bad}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        load_trees(path)
    assert str(info.value).startswith(
        f"{path}:3: found the label {label} at column {column}; expected labels 0..4. Fix: ")
    assert info.value.line == 3
    # The domain is a parameter: None accepts any integer, another range is checked as given.
    assert load_trees(path, labels=None)[1].label in (2, 3, 5)
    assert len(load_trees(path, labels=range(-1, 13))) == 3
    with pytest.raises(DataFormatError, match="expected labels 0..1"):
        load_trees(tmp_path.joinpath("sst.txt"), labels=range(2))


def test_load_trees_label_domain_accepts_signed_and_padded_in_range(tmp_path: Path) -> None:
    path = tmp_path / "sst.txt"
    path.write_text("(+2 (02 a) (4 b))\n", encoding="utf-8")
    assert load_trees(path)[0].children[0].label == 2
    with pytest.raises(ValueError, match="non-empty range"):
        load_trees(path, labels=range(0))
    with pytest.raises(ValueError, match="non-empty range"):
        load_trees(path, labels=range(0, 5, 2))
