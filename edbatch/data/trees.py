"""PTB bracket trees, as in the Stanford Sentiment Treebank files (``data/trees/``).

Every constituent is ``(label children...)`` with an integer label; a pre-terminal wraps exactly
one word, e.g. ``(1 (2 I) (0 (0 hate) (2 movie)))``. The parser accepts any number (>= 1) of
children per internal node; workloads that need binary trees check that themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from edbatch.data._text import gc_paused, read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = ["SST_LABELS", "Tree", "load_trees", "parse_tree"]

# One token per match: a whole pre-terminal "(label word)" (groups 1, 2: fast path), an opening
# bracket with its label (possibly empty), a closing bracket, or a bare word. Only ASCII
# whitespace separates tokens: SST words may contain U+00A0 (e.g. "8\u00a01\\/2" in train.txt),
# which the original C++ readers keep inside the word.
_WS = " \t\n\r\f\v"
_OTHER_WS = re.compile(r"[\t\n\r\f\v]")
_TO_SPACE = str.maketrans("\t\n\r\f\v", "     ")  # 1:1, so columns are unchanged
_TOKEN = re.compile(
    r"\( *([^ ()]+) +([^ ()]+) *\)"  # 1, 2: label and word of a pre-terminal
    r"|\( *([^ ()]*)"  # 3: opening bracket and its label
    r"|(\))"  # 4: closing bracket
    r"|([^ ()]+)"  # 5: word outside a pre-terminal
)
_INT = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True, slots=True)
class Tree:
    """A node of a constituency tree.

    Attributes:
        label: Integer label of the constituent (SST: sentiment 0..4).
        children: Sub-trees in order; empty for a leaf.
        word: The token of a pre-terminal (leaf); ``None`` for internal nodes.
    """

    label: int
    children: tuple[Tree, ...] = ()
    word: str | None = None

    @property
    def is_leaf(self) -> bool:
        """Whether this node is a pre-terminal (it carries a word and has no children)."""
        return not self.children

    def leaves(self) -> tuple[str, ...]:
        """Return the words of the sentence, left to right."""
        return tuple(node.word for node in self._preorder() if node.word is not None)

    @property
    def num_nodes(self) -> int:
        """Number of labelled nodes (internal nodes plus pre-terminals)."""
        return sum(1 for _ in self._preorder())

    @property
    def height(self) -> int:
        """Number of nodes on the longest root-to-leaf path (a single pre-terminal has 1)."""
        best = 0
        stack: list[tuple[Tree, int]] = [(self, 1)]
        while stack:
            node, depth = stack.pop()
            best = max(best, depth)
            stack.extend((child, depth + 1) for child in node.children)
        return best

    def _preorder(self) -> Iterator[Tree]:
        """Yield the nodes in pre-order (root, then children left to right), iteratively."""
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _node_factory() -> Callable[[int, tuple[Tree, ...], str | None], Tree]:
    """Return a constructor equivalent to ``Tree(label, children, word)``, about 2x faster.

    It writes the slots through their member descriptors, skipping the frozen-dataclass
    ``__init__`` (three ``object.__setattr__`` calls); parsing builds ~40 nodes per sentence.
    """
    new = object.__new__
    slots = vars(Tree)  # the member descriptors of the three slots
    set_label = slots["label"].__set__
    set_children = slots["children"].__set__
    set_word = slots["word"].__set__

    def make(label: int, children: tuple[Tree, ...], word: str | None) -> Tree:
        """Build ``Tree(label, children, word)`` without the dataclass ``__init__``."""
        node = new(Tree)
        set_label(node, label)
        set_children(node, children)
        set_word(node, word)
        return node

    return make


_make_node = _node_factory()


def _column(text: str, token_index: int) -> int:
    """1-based column where token number ``token_index`` of ``text`` starts."""
    for k, match in enumerate(_TOKEN.finditer(text)):
        if k == token_index:
            return match.start() + 1
    return len(text) + 1


def _fail(
    path: str, line: int, text: str, k: int, found: str, expected: str, fix: str
) -> NoReturn:
    """Raise a :class:`DataFormatError` naming the column of token ``k``."""
    raise DataFormatError(path, line, f"{found} at column {_column(text, k)}", expected, fix)


_LABELS: dict[str, int] = {}  # label text -> int, shared by all parses (a handful of entries)


def _label(raw: str, text: str, k: int, path: str, line: int) -> int:
    """Convert (and cache) a label; fail on an empty or non-integer label at token ``k``."""
    if not raw:
        _fail(path, line, text, k, "'(' without a label", "an integer label right after '('",
              "write the label first, e.g. '(2 word)'")
    if _INT.fullmatch(raw) is None:
        _fail(path, line, text, k, f"the non-integer label {shorten(raw)}",
              "an integer label after '(' (e.g. '(2 word)')",
              "every constituent must start with its integer label")
    value = int(raw)
    if len(_LABELS) < 256:
        _LABELS[raw] = value
    return value


def parse_tree(text: str, *, path: str = "<string>", line: int = 1) -> Tree:  # noqa: C901
    """Parse one bracketed tree such as ``(3 (2 a) (4 (3 good) (2 film)))``.

    Tokens are separated by ASCII whitespace only (a U+00A0 inside a word is part of it).

    Args:
        text: The tree in PTB bracket form (surrounding whitespace is ignored).
        path: File name used in error messages.
        line: Line number used in error messages.

    Returns:
        The root :class:`Tree`.

    Raises:
        DataFormatError: On unbalanced brackets, a missing or non-integer label, an empty
            constituent ``()``, a token after the tree closes, a pre-terminal with more than one
            word, or a word mixed with sub-trees. The message names ``path:line`` and the column.
    """
    if _OTHER_WS.search(text):
        text = text.translate(_TO_SPACE)
    tokens = _TOKEN.findall(text)
    labels = _LABELS
    make = _make_node
    nodes: list[Tree] = []  # finished nodes whose parent is still open, left to right
    frames: list[tuple[int, int, int]] = []  # open constituents: (label, first child, token)
    for k, (leaf_label, leaf_word, open_label, close, word) in enumerate(tokens):
        if leaf_word:  # a whole "(label word)": by far the most common token
            if not frames and nodes:
                _fail(path, line, text, k, "a second tree after the tree closed",
                      "end of line", "put one tree per line")
            label = labels.get(leaf_label)
            if label is None:
                label = _label(leaf_label, text, k, path, line)
            nodes.append(make(label, (), leaf_word))
        elif close:
            if not frames:
                _fail(path, line, text, k, "an extra ')'" + (" after the tree closed" if nodes
                      else ""), "a matching '(' before it", "remove the extra ')'")
            label, first, _ = frames.pop()
            children = tuple(nodes[first:])
            del nodes[first:]
            nodes.append(make(label, children, None))
        elif word:  # a valid tree has every word inside a "(label word)" token
            _word_error(tokens, frames, nodes, text, k, path, line)
        else:
            if not frames and nodes:
                _fail(path, line, text, k, "a second tree after the tree closed",
                      "end of line", "put one tree per line")
            _check_open(tokens, text, k, path, line)
            label = labels.get(open_label)
            if label is None:
                label = _label(open_label, text, k, path, line)
            frames.append((label, len(nodes), k))
    if frames:
        _fail(path, line, text, frames[-1][2], f"{len(frames)} unclosed '('",
              "a ')' for every '('", f"add {len(frames)} ')' at the end of the line")
    if not nodes:
        _fail(path, line, text, 0, "no tree", "a bracketed tree '(label ...)'",
              "remove the line or add the tree")
    return nodes[0]


def _check_open(tokens: list[tuple[str, ...]], text: str, k: int, path: str, line: int) -> None:
    """Reject ``()`` and ``(label)`` at the opening bracket ``k``."""
    if k + 1 >= len(tokens) or not tokens[k + 1][3]:
        return
    raw = tokens[k][2]
    if not raw:
        _fail(path, line, text, k, "an empty constituent '()'", "'(label ...)'",
              "remove the '()' or add a label and content")
    _label(raw, text, k, path, line)  # a non-integer label is the first thing to report
    _fail(path, line, text, k, f"the constituent '({raw})' with a label but no word or "
          "children", "'(label word)' or '(label subtree...)'",
          "add the word or remove the constituent")


def _word_error(
    tokens: list[tuple[str, ...]], frames: list[tuple[int, int, int]], nodes: list[Tree],
    text: str, k: int, path: str, line: int,
) -> NoReturn:
    """Explain why the bare word at token ``k`` (not inside a ``(label word)``) is wrong."""
    word = shorten(tokens[k][4])
    if not frames:
        where = "after the tree closed" if nodes else "before the first '('"
        _fail(path, line, text, k, f"the word {word} {where}",
              "a single tree '(label ...)' on the line", "wrap the line as '(label ...)'")
    if len(nodes) > frames[-1][1]:
        _fail(path, line, text, k, f"the word {word} after sub-trees",
              "only sub-trees or only one word inside a constituent",
              "wrap the word as '(label word)'")
    if k + 1 >= len(tokens):
        _fail(path, line, text, frames[-1][2], f"{len(frames)} unclosed '('",
              "a ')' for every '('", f"add {len(frames)} ')' at the end of the line")
    nxt = tokens[k + 1]
    if nxt[4]:
        _fail(path, line, text, k + 1, f"a second word {shorten(nxt[4])} in a pre-terminal "
              f"that already holds {word}", "exactly one word per '(label word)'",
              "wrap each word in its own '(label word)'")
    _fail(path, line, text, k + 1, f"a sub-tree after the word {word}",
          "only sub-trees or only one word inside a constituent",
          "wrap the word as '(label word)'")


#: The SST sentiment classes, 0 (very negative) to 4 (very positive).
SST_LABELS = range(5)
_LABEL_AT = re.compile(r"\( *([^ ()]*)")  # every label, after its '('


def _check_labels(text: str, allowed: frozenset[str], labels: range, path: str,
                  line: int) -> None:
    """Fail on the first label of the (already parsed) ``text`` outside ``labels``."""
    if _OTHER_WS.search(text):
        text = text.translate(_TO_SPACE)
    for match in _LABEL_AT.finditer(text):
        raw = match.group(1)
        if raw not in allowed and int(raw) not in labels:  # "+2" or "02" is still 2
            low, high = labels[0], labels[-1]
            raise DataFormatError(
                path, line, f"the label {int(raw)} at column {match.start() + 1}",
                f"labels {low}..{high}", f"use a label from {low} to {high} (SST: 0 very "
                "negative .. 4 very positive), or pass labels=range(...) for other data")


def load_trees(path: str | Path, *, labels: range | None = SST_LABELS) -> list[Tree]:
    """Load one bracketed tree per non-blank line.

    Args:
        path: A file such as ``data/trees/train.txt``.
        labels: The label domain every constituent must be in (default: SST's 0-4);
            ``None`` accepts any integer label.

    Returns:
        The trees in file order.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: If a line is not a well-formed tree (see :func:`parse_tree`), a
            label is outside ``labels`` (names the label, its column and the range) or the
            file holds no tree at all.
    """
    if labels is not None and (not isinstance(labels, range) or len(labels) == 0
                               or labels.step != 1):
        raise ValueError(f"labels must be a non-empty range with step 1 or None, got "
                         f"{labels!r}")
    name = str(path)
    lines = read_lines(path)
    allowed = frozenset(map(str, labels)) if labels is not None else frozenset()
    with gc_paused():
        trees = [
            parse_tree(text, path=name, line=i)
            for i, text in enumerate(lines, start=1)
            if text.strip(_WS)
        ]
    # One pass over the whole text finds the distinct labels; only a file with a label
    # outside the domain is walked line by line to name the first one.
    if labels is not None and not allowed.issuperset(_LABEL_AT.findall("\n".join(lines))):
        for i, text in enumerate(lines, start=1):
            _check_labels(text, allowed, labels, name, i)
    if not trees:
        raise DataFormatError(name, 1, "an empty file (no trees)",
                              "one bracketed tree per line", "check the path and the file")
    return trees
