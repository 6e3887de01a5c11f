"""SICK sentence pairs with dependency parses, as the Tree-LSTM preprocessing writes them.

A split folder (``data/sick/train``, ``dev``, ``test``) holds five line-aligned files, one
pair per line:

* ``a.toks`` / ``b.toks``: the tokens of sentence A / B, separated by spaces.
* ``a.parents`` / ``b.parents``: one integer per token, its parent in the dependency tree
  (1-based token number; 0 = the root).
* ``sim.txt``: the relatedness score of the pair, a real number in [1, 5].

:func:`load_sick` checks every line and reports the first problem as a
:class:`~edbatch.errors.DataFormatError` naming ``file:line``: unequal line counts, a
token/parent count mismatch, a non-integer or out-of-range parent, a tree with no or several
roots or with a cycle, a score that is not a number in [1, 5].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from edbatch.data._text import gc_paused, read_lines, shorten
from edbatch.data.ud import find_cycle
from edbatch.errors import DataFormatError

__all__ = [
    "SICK_FILES",
    "SIM_RANGE",
    "DepTree",
    "SickPair",
    "load_sick",
    "similarity_target",
]

#: The files of one split, in the order they are checked.
SICK_FILES: tuple[str, ...] = ("a.toks", "a.parents", "b.toks", "b.parents", "sim.txt")
#: The relatedness scale (inclusive).
SIM_RANGE: tuple[float, float] = (1.0, 5.0)
_NEGATIVE = re.compile(r"-[0-9]+")


@dataclass(frozen=True, slots=True)
class DepTree:
    """A dependency tree over the tokens of a sentence.

    Attributes:
        words: The tokens; token ``i`` is ``words[i - 1]``.
        heads: The parent of each token: 0 for the root, else a token number 1..len.
        children: ``children[i]`` are the dependents of token ``i`` in order;
            ``children[0] == (root,)``.
    """

    words: tuple[str, ...]
    heads: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]

    def __len__(self) -> int:
        """Return the number of tokens."""
        return len(self.words)

    @property
    def root(self) -> int:
        """The token number whose parent is 0."""
        return self.children[0][0]

    def postorder(self) -> tuple[int, ...]:
        """Token numbers with every node after all of its children (the root last).

        Example:
            >>> tree = DepTree.from_heads(("a", "b", "c"), (2, 0, 2))
            >>> tree.postorder(), tree.children
            ((1, 3, 2), ((2,), (), (1, 3), ()))
        """
        order: list[int] = []
        stack: list[tuple[int, bool]] = [(self.root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
            else:
                stack.append((node, True))
                stack.extend((kid, False) for kid in reversed(self.children[node]))
        return tuple(order)

    @classmethod
    def from_heads(cls, words: tuple[str, ...], heads: tuple[int, ...]) -> DepTree:
        """Build the tree, computing the children lists (``heads`` must be a valid tree)."""
        kids: list[list[int]] = [[] for _ in range(len(heads) + 1)]
        for token, head in enumerate(heads, start=1):
            kids[head].append(token)
        return cls(words, heads, tuple(tuple(k) for k in kids))


@dataclass(frozen=True, slots=True)
class SickPair:
    """One sentence pair and its gold relatedness.

    Attributes:
        a: The tree of sentence A.
        b: The tree of sentence B.
        score: The mean human relatedness judgement, in [1, 5].
        line: The line of the pair in each of the five files.
    """

    a: DepTree
    b: DepTree
    score: float
    line: int


def similarity_target(score: float, classes: int = 5) -> tuple[float, ...]:
    """The sparse target distribution of Tai et al. (2015) over the scores ``1..classes``.

    The expected value of the distribution is ``score``: the mass is split between the two
    integers around it.

    Example:
        >>> similarity_target(3.6)
        (0.0, 0.0, 0.4, 0.6, 0.0)
        >>> similarity_target(5.0)
        (0.0, 0.0, 0.0, 0.0, 1.0)
    """
    if not 1.0 <= score <= classes:
        raise ValueError(f"score must be in [1, {classes}], got {score!r}")
    low = math.floor(score)
    p = [0.0] * classes
    if low == classes:
        p[-1] = 1.0
        return tuple(p)
    frac = round(score - low, 12)
    p[low - 1] = round(1.0 - frac, 12)
    p[low] = frac
    return tuple(p)


def _fail(path: Path, line: int, found: str, expected: str, fix: str) -> NoReturn:
    raise DataFormatError(path, line, found, expected, fix)


def _tree(toks: str, parents: str, toks_path: Path, parents_path: Path,
          line: int) -> DepTree:
    """Parse one sentence's tokens and parents; every error names ``file:line``."""
    words = tuple(toks.split())
    if not words:
        _fail(toks_path, line, "an empty sentence", "at least one token",
              "remove the pair from all five files")
    fields = parents.split()
    if len(fields) != len(words):
        _fail(parents_path, line, f"{len(fields)} parents for the {len(words)} tokens of "
              f"{toks_path.name}:{line}", "one parent per token",
              "re-run the parser on this sentence, or fix the tokenisation")
    n = len(words)
    heads: list[int] = []
    roots = 0
    for position, raw in enumerate(fields, start=1):
        value = int(raw) if raw.isascii() and raw.isdigit() else None
        if value is None or value > n or value == position:
            if value is None:
                what = ("the out-of-range parent" if _NEGATIVE.fullmatch(raw)
                        else "the non-integer parent")
            else:
                what = "the self-loop parent" if value == position else "the out-of-range parent"
            _fail(parents_path, line, f"{what} {shorten(raw)} of token {position} "
                  f"({words[position - 1]!r})", f"an integer from 0 (root) to {n}, not "
                  "the token itself", "fix the parents line (1-based token numbers)")
        roots += value == 0
        heads.append(value)
    if roots != 1:
        _fail(parents_path, line, f"{roots} roots (parent 0)", "exactly one root",
              "attach the other roots to a token of the sentence" if roots
              else "give the sentence's head word the parent 0")
    cycle = find_cycle(heads)
    if cycle is not None:
        loop = " -> ".join(str(t) for t in [*cycle, cycle[0]])
        _fail(parents_path, line, f"the cycle {loop} in the parents", "a tree: following "
              "parents from every token reaches 0", "fix the parents of the tokens on the "
              "cycle")
    return DepTree.from_heads(words, tuple(heads))


def _score(raw: str, path: Path, line: int) -> float:
    try:
        score = float(raw)
    except ValueError:
        score = math.nan
    low, high = SIM_RANGE
    if not low <= score <= high:  # also rejects nan
        _fail(path, line, f"the score {shorten(raw.strip())}",
              f"a number from {low:g} to {high:g}", "write the relatedness on the 1-5 scale")
    return score


def load_sick(folder: str | Path) -> list[SickPair]:
    """Load one split of SICK with its dependency trees.

    Args:
        folder: A folder with the five files of :data:`SICK_FILES`, e.g.
            ``data/sick/train``.

    Returns:
        The pairs in file order.

    Raises:
        FileNotFoundError: If a file is missing (the message names it).
        DataFormatError: On unequal line counts (at the first line one file lacks), a blank
            or malformed line, a token/parent count mismatch, a bad parent, a tree with no
            root, several roots or a cycle, a score outside [1, 5], or empty files.
    """
    root = Path(folder)
    paths = [root / name for name in SICK_FILES]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; a SICK split folder holds "
                                    f"{', '.join(SICK_FILES)}")
    columns = [read_lines(path) for path in paths]
    counts = [len(c) for c in columns]
    if len(set(counts)) > 1:
        shortest = min(counts)
        longer = paths[counts.index(max(counts))]
        short = paths[counts.index(shortest)]
        _fail(longer, shortest + 1, f"line {shortest + 1} while {short.name} has only "
              f"{shortest} lines", f"the same number of lines in {', '.join(SICK_FILES)}",
              "keep the five files line-aligned (one pair per line)")
    if not counts[0]:
        _fail(paths[0], 1, "an empty file (no pairs)", "one sentence per line",
              "check the folder")
    pairs: list[SickPair] = []
    a_toks, a_par, b_toks, b_par, sims = paths
    with gc_paused():
        for index, (ta, pa, tb, pb, sim) in enumerate(zip(*columns, strict=True)):
            line = index + 1
            pairs.append(SickPair(_tree(ta, pa, a_toks, a_par, line),
                                  _tree(tb, pb, b_toks, b_par, line),
                                  _score(sim, sims, line), line))
    return pairs
