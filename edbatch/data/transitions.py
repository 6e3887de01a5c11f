"""Arc-standard transition parsing: a static oracle from gold heads, and its replay.

The parser state is a stack, whose bottom is the virtual root 0, and a buffer holding the
words ``next .. n`` (1-based). Three transitions (Nivre 2004, as in Chen & Manning 2014):

* ``SHIFT``: move the buffer's first word onto the stack.
* ``LEFT_ARC``: the top ``s0`` becomes the head of the word below it, ``s1``; ``s1`` is
  popped. Illegal when ``s1`` is the root 0.
* ``RIGHT_ARC``: ``s1`` becomes the head of ``s0``; ``s0`` is popped. With ``s1 = 0`` (the
  sentence's root word gets attached) only legal once the buffer is empty, so every parse
  has exactly one root.

A sentence of ``n`` words takes exactly ``2n`` transitions. The static oracle builds a
sentence's gold tree exactly when the tree is **projective** (no two arcs cross when drawn
above the words, the root's arc from position 0 included). Non-projective sentences have no
arc-standard derivation: :func:`oracle` refuses them and :func:`projective_only` leaves them
out of a training set, counting them (EWT v2.16: 288 of 12,544 train sentences, 31 of 2,001
dev and 26 of 2,077 test; see ``data/README.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from edbatch.errors import DataFormatError, InvalidActionError

__all__ = [
    "ACTIONS",
    "LEFT_ARC",
    "RIGHT_ARC",
    "SHIFT",
    "ArcStandardState",
    "crossing_arcs",
    "is_projective",
    "labelled_oracle",
    "oracle",
    "projective_only",
    "replay",
]

SHIFT, LEFT_ARC, RIGHT_ARC = 0, 1, 2
#: Action names by id.
ACTIONS: tuple[str, ...] = ("SHIFT", "LEFT_ARC", "RIGHT_ARC")


class ArcStandardState:
    """A parser configuration; apply transitions to it one at a time.

    Attributes:
        n: Number of words.
        stack: Word numbers on the stack, bottom first; ``stack[0]`` is the root 0.
        next: The first word of the buffer (``n + 1`` once it is empty).
        heads: ``heads[i - 1]`` is the head given to word ``i`` so far (-1 = none yet).

    Example:
        >>> state = ArcStandardState(2)
        >>> [state.apply(action) for action in (SHIFT, SHIFT, LEFT_ARC, RIGHT_ARC)]
        [0, 0, 1, 2]
        >>> state.done, state.heads
        (True, [2, 0])
    """

    __slots__ = ("heads", "n", "next", "stack")

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"a sentence needs at least one word, got n={n!r}")
        self.n = n
        self.stack: list[int] = [0]
        self.next = 1
        self.heads: list[int] = [-1] * n

    @property
    def done(self) -> bool:
        """Whether the buffer is empty and only the root is left on the stack."""
        return self.next > self.n and len(self.stack) == 1

    def legal(self) -> tuple[bool, bool, bool]:
        """Which of ``SHIFT``, ``LEFT_ARC``, ``RIGHT_ARC`` may be applied now."""
        depth = len(self.stack)
        buffer = self.next <= self.n
        return (buffer, depth >= 3,
                depth >= 3 or (depth == 2 and not buffer))

    def apply(self, action: int) -> int:
        """Apply one transition.

        Returns:
            The word that got its head (the arc's dependent, whose label a labelled parser
            predicts now), or 0 for ``SHIFT``.

        Raises:
            InvalidActionError: If ``action`` is not a transition id or is illegal now.
        """
        if action not in (SHIFT, LEFT_ARC, RIGHT_ARC) or not self.legal()[action]:
            name = ACTIONS[action] if action in (0, 1, 2) else repr(action)
            raise InvalidActionError(
                f"transition {name} is not legal with stack {self.stack} and buffer "
                f"{self.next}..{self.n}; legal: "
                f"{[ACTIONS[a] for a, ok in enumerate(self.legal()) if ok]}")
        stack = self.stack
        if action == SHIFT:
            stack.append(self.next)
            self.next += 1
            return 0
        if action == LEFT_ARC:
            top = stack.pop()
            dependent = stack.pop()
            self.heads[dependent - 1] = top
            stack.append(top)
            return dependent
        top = stack.pop()
        self.heads[top - 1] = stack[-1]
        return top


def crossing_arcs(heads: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Two crossing arcs ``(head, dependent)`` of a tree, or ``None`` if it is projective.

    Arcs are drawn above the words with the root 0 left of word 1, so the root's arc
    ``(0, root)`` crosses any arc spanning over the root word.

    Example:
        >>> crossing_arcs([0, 4, 1, 1]), crossing_arcs([2, 0, 2])
        (((1, 3), (4, 2)), None)
    """
    spans = sorted(((min(h, d), max(h, d), h, d) for d, h in enumerate(heads, start=1)),
                   key=lambda span: (span[0], -span[1]))
    open_spans: list[tuple[int, int, int, int]] = []  # nested, outermost first
    for span in spans:
        while open_spans and open_spans[-1][1] <= span[0]:
            open_spans.pop()
        if open_spans and span[1] > open_spans[-1][1]:
            outer = open_spans[-1]
            return (outer[2], outer[3]), (span[2], span[3])
        open_spans.append(span)
    return None


def is_projective(heads: Sequence[int]) -> bool:
    """Whether no two arcs of the tree cross (see :func:`crossing_arcs`)."""
    return crossing_arcs(heads) is None


def oracle(heads: Sequence[int], *, path: str = "<heads>", line: int = 1) -> tuple[int, ...]:
    """The static arc-standard oracle: the transitions that build the gold tree ``heads``.

    At each step: ``LEFT_ARC`` if ``s0`` is the gold head of ``s1``; else ``RIGHT_ARC`` if
    ``s1`` is the gold head of ``s0`` and ``s0`` has all its dependents; else ``SHIFT``.

    Args:
        heads: ``heads[i - 1]`` is the gold head of word ``i`` (0 = root); a tree.
        path: File named in the error (e.g. :attr:`DepSentence.path`).
        line: Line named in the error (e.g. :attr:`DepSentence.line`).

    Returns:
        ``2 * len(heads)`` transition ids; :func:`replay` rebuilds ``heads`` from them.

    Raises:
        DataFormatError: If the tree is not projective (names two crossing arcs).

    Example:
        >>> [ACTIONS[a] for a in oracle([2, 0, 2])]
        ['SHIFT', 'SHIFT', 'LEFT_ARC', 'SHIFT', 'RIGHT_ARC', 'RIGHT_ARC']
    """
    crossing = crossing_arcs(heads)
    if crossing is not None:
        (h1, d1), (h2, d2) = crossing
        raise DataFormatError(path, line, f"a non-projective tree (arcs {h1}->{d1} and "
                              f"{h2}->{d2} cross)", "a projective tree for the arc-standard "
                              "oracle", "leave such sentences out of training with "
                              "projective_only()")
    n = len(heads)
    missing = [0] * (n + 1)  # dependents of each node not attached yet
    for head in heads:
        missing[head] += 1
    state = ArcStandardState(n)
    stack = state.stack
    actions: list[int] = []
    while not state.done:
        if len(stack) >= 3 and heads[stack[-2] - 1] == stack[-1]:
            action = LEFT_ARC
            missing[stack[-1]] -= 1
        elif (len(stack) >= 2 and heads[stack[-1] - 1] == stack[-2]
              and not missing[stack[-1]] and (len(stack) > 2 or state.next > n)):
            action = RIGHT_ARC
            missing[stack[-2]] -= 1
        else:
            action = SHIFT
        state.apply(action)
        actions.append(action)
    return tuple(actions)


def labelled_oracle(heads: Sequence[int], deprels: Sequence[str], *, path: str = "<heads>",
                    line: int = 1) -> tuple[tuple[int, str | None], ...]:
    """The :func:`oracle` transitions, each arc with the relation of the word it attaches.

    Example:
        >>> labelled_oracle([2, 0], ["det", "root"])
        ((0, None), (0, None), (1, 'det'), (2, 'root'))
    """
    if len(deprels) != len(heads):
        raise ValueError(f"one relation per word: {len(heads)} heads, {len(deprels)} deprels")
    actions = oracle(heads, path=path, line=line)
    state = ArcStandardState(len(heads))
    out: list[tuple[int, str | None]] = []
    for action in actions:
        dependent = state.apply(action)
        out.append((action, deprels[dependent - 1] if dependent else None))
    return tuple(out)


def replay(n: int, actions: Iterable[int]) -> tuple[int, ...]:
    """Apply ``actions`` to the initial state of an ``n``-word sentence; return the heads.

    Raises:
        InvalidActionError: If an action is illegal where it is applied, or the actions end
            before the parse is complete.
    """
    state = ArcStandardState(n)
    for action in actions:
        state.apply(action)
    if not state.done:
        raise InvalidActionError(f"the transitions end before the parse is complete (stack "
                                 f"{state.stack}, buffer {state.next}..{n}); a sentence of "
                                 f"{n} words needs {2 * n} transitions")
    return tuple(state.heads)


class _HasHeads(Protocol):
    @property
    def heads(self) -> tuple[int, ...]: ...
    @property
    def line(self) -> int: ...


S = TypeVar("S", bound=_HasHeads)


def projective_only(sentences: Iterable[S]) -> tuple[list[S], list[int]]:
    """Split sentences into the projective ones and the lines of the others.

    Returns:
        The projective sentences in order, and the ``line`` of every non-projective one
        (the arc-standard oracle cannot derive those, so training leaves them out).
    """
    kept: list[S] = []
    dropped: list[int] = []
    for sentence in sentences:
        if crossing_arcs(sentence.heads) is None:
            kept.append(sentence)
        else:
            dropped.append(sentence.line)
    return kept, dropped
