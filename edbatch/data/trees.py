"""PTB bracket trees, as in the Stanford Sentiment Treebank files (``data/trees/``).

Every constituent is ``(label children...)`` with an integer label; a pre-terminal wraps exactly
one word, e.g. ``(1 (2 I) (0 (0 hate) (2 movie)))``. The parser accepts any number (>= 1) of
children per internal node; workloads that need binary trees check that themselves.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from edbatch.data._text import read_lines, shorten
from edbatch.errors import DataFormatError

__all__ = ["Tree", "load_trees", "parse_tree"]

# One token per match: a whole pre-terminal "(label word)" (groups 1, 2: fast path), an opening
# bracket with its label (possibly empty), a closing bracket, or a bare word. Only ASCII
# whitespace separates tokens: SST words may contain U+00A0 (e.g. "8\u00a01\\/2" in train.txt),
# which the original C++ readers keep inside the word.
_WS = " \t\n\r\f\v"
_TOKEN = re.compile(
    rf"\([{_WS}]*([^{_WS}()]+)[{_WS}]+([^{_WS}()]+)[{_WS}]*\)"  # 1, 2: label, word
    rf"|\([{_WS}]*([^{_WS}()]*)"  # 3: opening bracket and its label
    r"|(\))"  # 4: closing bracket
    rf"|([^{_WS}()]+)"  # 5: word outside a pre-terminal
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
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _column(text: str, token_index: int) -> int:
    """1-based column where token number ``token_index`` of ``text`` starts."""
    for k, match in enumerate(_TOKEN.finditer(text)):
        if k == token_index:
            return match.start() + 1
    return len(text) + 1


def _label(raw: str, text: str, k: int, path: str, line: int) -> int:
    if _INT.fullmatch(raw) is None:
        raise DataFormatError(
            path,
            line,
            f"label {shorten(raw)} at column {_column(text, k)}",
            "an integer label after '(' (e.g. '(2 word)')",
            "every constituent must start with its integer label",
        )
    return int(raw)


def parse_tree(text: str, *, path: str = "<string>", line: int = 1) -> Tree:
    """Parse one bracketed tree such as ``(3 (2 a) (4 (3 good) (2 film)))``.

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
    tokens = _TOKEN.findall(text)
    cache: dict[str, int] = {}
    # Open constituents: [label, children, word, token index of the '('].
    stack: list[list[Any]] = []
    root: Tree | None = None
    for k, (leaf_label, leaf_word, open_label, close, word) in enumerate(tokens):
        if root is not None:
            if close:
                _fail(path, line, text, k, "an extra ')' after the tree closed", "end of line",
                      "remove the extra ')'")
            _fail(path, line, text, k, "a token after the tree closed", "end of line",
                  "put one tree per line")
        if leaf_word:
            label = cache.get(leaf_label)
            if label is None:
                label = cache[leaf_label] = _label(leaf_label, text, k, path, line)
            node = Tree(label, (), leaf_word)
        elif close:
            if not stack:
                _fail(path, line, text, k, "an extra ')'", "a matching '(' before it",
                      "remove the extra ')'")
            label, children, tree_word, start = stack.pop()
            if not children and tree_word is None:
                _fail(path, line, text, start, "a constituent with a label but no word or "
                      "children", "'(label word)' or '(label subtree...)'", "add the word")
            node = Tree(label, tuple(children), tree_word)
        elif word:
            _add_word(stack, word, text, k, path, line)
            continue
        else:
            _check_open_label(tokens, k, open_label, text, path, line)
            if stack and stack[-1][2] is not None:
                _fail(path, line, text, k, "a sub-tree after a word", "only sub-trees or only "
                      "one word inside a constituent", "wrap the word as '(label word)'")
            label = _label(open_label, text, k, path, line)
            stack.append([label, [], None, k])
            continue
        if stack:
            _add_child(stack, node, text, k, path, line)
        else:
            root = node
    if stack:
        _fail(path, line, text, stack[-1][3], f"{len(stack)} unclosed '('",
              "a ')' for every '('", f"add {len(stack)} ')' at the end of the line")
    if root is None:
        _fail(path, line, text, 0, "no tree", "a bracketed tree '(label ...)'",
              "remove the line or add the tree")
    return root


def _check_open_label(
    tokens: list[tuple[str, ...]], k: int, label: str, text: str, path: str, line: int
) -> None:
    if label:
        return
    if k + 1 < len(tokens) and tokens[k + 1][3]:
        _fail(path, line, text, k, "an empty constituent '()'", "'(label ...)'",
              "remove the '()' or add a label and content")
    _fail(path, line, text, k, "'(' without a label", "an integer label right after '('",
          "write the label first, e.g. '(2 word)'")


def _add_word(stack: list[list[Any]], word: str, text: str, k: int, path: str, line: int) -> None:
    if not stack:
        _fail(path, line, text, k, f"the word {shorten(word)} outside any bracket",
              "a tree starting with '('", "wrap the line as '(label ...)'")
    top = stack[-1]
    if top[2] is not None:
        _fail(path, line, text, k, f"a second word {shorten(word)} in a pre-terminal that "
              f"already holds {shorten(top[2])}", "exactly one word per '(label word)'",
              "wrap each word in its own '(label word)'")
    if top[1]:
        _fail(path, line, text, k, f"the word {shorten(word)} after sub-trees",
              "only sub-trees or only one word inside a constituent",
              "wrap the word as '(label word)'")
    top[2] = word


def _add_child(stack: list[list[Any]], node: Tree, text: str, k: int, path: str, line: int) -> None:
    top = stack[-1]
    if top[2] is not None:
        _fail(path, line, text, k, f"a sub-tree after the word {shorten(top[2])}",
              "only sub-trees or only one word inside a constituent",
              "wrap the word as '(label word)'")
    top[1].append(node)


def _fail(
    path: str, line: int, text: str, k: int, found: str, expected: str, fix: str
) -> NoReturn:
    raise DataFormatError(path, line, f"{found} at column {_column(text, k)}", expected, fix)


def load_trees(path: str | Path) -> list[Tree]:
    """Load one bracketed tree per non-blank line.

    Args:
        path: A file such as ``data/trees/train.txt``.

    Returns:
        The trees in file order.

    Raises:
        FileNotFoundError: If the file does not exist.
        DataFormatError: If a line is not a well-formed tree (see :func:`parse_tree`) or the
            file holds no tree at all.
    """
    name = str(path)
    trees = [
        parse_tree(text, path=name, line=i)
        for i, text in enumerate(read_lines(path), start=1)
        if text.strip(_WS)
    ]
    if not trees:
        raise DataFormatError(name, 1, "an empty file (no trees)",
                              "one bracketed tree per line", "check the path and the file")
    return trees
