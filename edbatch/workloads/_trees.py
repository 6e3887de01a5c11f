"""Shared machinery of the SST tree workloads (Tree-LSTM, Tree-GRU, MV-RNN).

* :class:`WordVocab`: word -> id, built once from the *train* split (most frequent first,
  ties by word; id 0 is the unknown word).
* :class:`TreeInstance`: one sentence tree flattened in post-order, with word ids resolved
  at load time so that graph emission never hashes a string.
* :func:`fold_tree`: the one recursion over a flattened tree (leaf, internal, loss callbacks).
* :class:`TreeWorkload`: the :class:`~edbatch.workloads.base.Workload` part the three models
  share: splits, loading ``<data_dir>/trees/{train,dev,test}.txt``, the word vocabulary,
  parameter shapes and both granularities' emission. Subclasses only declare op types and,
  at primitive granularity, spell out the cell.

Every tree node (pre-terminal and internal) gets a loss node, as in the DyNet / ED-Batch
benchmark. SST trees are binary; a unary internal node (one child that is itself a
constituent) passes its child's state through unchanged and only adds its own loss.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from edbatch.data._text import file_key, gc_paused, read_lines
from edbatch.data.trees import Tree, load_trees
from edbatch.errors import DataFormatError, GraphError
from edbatch.graph import Graph, GraphBuilder, OpType
from edbatch.workloads._tree_arrays import NodeRow, TreeInstance, build_binary_cells
from edbatch.workloads.base import LOSS_SUM, Workload
from edbatch.workloads.primitives import OpSet

__all__ = [
    "NUM_CLASSES",
    "SPLITS",
    "TreeInstance",
    "TreeWorkload",
    "WordVocab",
    "emit_cells",
    "fold_tree",
    "load_split_trees",
]

#: SST sentiment classes (labels 0..4).
NUM_CLASSES = 5
SPLITS = ("train", "dev", "test")
_UNKNOWN = "<unk>"
_ASCII_WS = " \t\n\r\f\v"  # what load_trees treats as a blank line

S = TypeVar("S")


@functools.lru_cache(maxsize=8)
def _load_cached(key: tuple[str, int, int]) -> tuple[Tree, ...]:
    return tuple(load_trees(key[0]))


@functools.lru_cache(maxsize=4)
def _ranked_cached(key: tuple[str, int, int]) -> tuple[str, ...]:
    return _rank_words(_load_cached(key))


def load_split_trees(path: str | Path) -> tuple[Tree, ...]:
    """Parse a tree file once per process (cached on path, mtime and size).

    Trees are immutable, so every workload object shares the parsed train split.
    """
    return _load_cached(file_key(path))


def _rank_words(trees: Sequence[Tree]) -> tuple[str, ...]:
    counts = Counter(word for tree in trees for word in tree.leaves())
    return tuple(sorted(counts, key=lambda w: (-counts[w], w)))


class WordVocab:
    """Word ids of the pre-terminals: the ``size - 1`` most frequent train words, then 0.

    Words are ranked by train frequency (descending), ties by the word itself, so the ids
    are deterministic. Id 0 is the unknown word: every word not kept maps to it.

    Example:
        >>> from edbatch.data.trees import parse_tree
        >>> v = WordVocab.from_trees([parse_tree("(2 (2 a) (2 (2 b) (2 a)))")])
        >>> v.words, v.id("a"), v.id("zebra"), len(v)
        (('<unk>', 'a', 'b'), 1, 0, 3)
    """

    __slots__ = ("ids", "words")

    def __init__(self, ranked: Sequence[str], size: int | None = None) -> None:
        if size is not None and (not isinstance(size, int) or size < 1):
            raise GraphError(f"vocab_size must be a positive int (it includes the unknown "
                             f"word id 0), got {size!r}; pass None to keep every train word")
        kept = ranked if size is None else ranked[:size - 1]
        #: Id -> word; ``words[0]`` is ``"<unk>"``.
        self.words: tuple[str, ...] = (_UNKNOWN, *kept)
        #: Word -> id for every kept word (unknown words are absent; look up with :meth:`id`).
        self.ids: dict[str, int] = {w: i for i, w in enumerate(kept, start=1)}

    @classmethod
    def from_trees(cls, trees: Sequence[Tree], size: int | None = None) -> WordVocab:
        """Rank the words of ``trees`` (normally the train split) and keep ``size - 1``."""
        return cls(_rank_words(trees), size)

    @classmethod
    def from_file(cls, path: str | Path, size: int | None = None) -> WordVocab:
        """Rank the words of a tree file (the ranking is cached per file)."""
        return cls(_ranked_cached(file_key(path)), size)

    def __len__(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        """The id of ``word``; 0 if it is unknown."""
        return self.ids.get(word, 0)

    def __repr__(self) -> str:
        return f"WordVocab({len(self)} ids)"


def _flatten(tree: Tree, ids: dict[str, int]) -> tuple[NodeRow, ...] | str:
    """Post-order rows of ``tree``, or a description of what makes it unusable."""
    rows: list[NodeRow] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    index: list[int] = []  # post-order indices of finished nodes whose parent is open
    while stack:
        node, expanded = stack.pop()
        if not 0 <= node.label < NUM_CLASSES:
            return f"the label {node.label}"
        kids = node.children
        if not kids:
            index.append(len(rows))
            rows.append((ids.get(node.word, 0), -1, -1, node.label))  # type: ignore[arg-type]
        elif not expanded:
            if len(kids) > 2:
                return f"a constituent with {len(kids)} children"
            stack.append((node, True))
            stack.extend((kid, False) for kid in reversed(kids))
        else:
            right = index.pop() if len(kids) == 2 else -1
            left = index.pop()
            index.append(len(rows))
            rows.append((-1, left, right, node.label))
    return tuple(rows)


def _line_of(path: Path, tree_index: int) -> int:
    """Line number of the ``tree_index``-th tree (load_trees skips blank lines)."""
    lines = [i for i, text in enumerate(read_lines(path), start=1) if text.strip(_ASCII_WS)]
    return lines[tree_index] if tree_index < len(lines) else tree_index + 1


def fold_tree(nodes: Sequence[NodeRow], leaf: Callable[[int], S],
              internal: Callable[[S, S], S], loss: Callable[[S, int], int]) -> list[int]:
    """Fold a flattened tree bottom-up; return the loss node of every tree node.

    Args:
        nodes: post-order rows of a :class:`TreeInstance`.
        leaf: ``leaf(word_id) -> state`` for a pre-terminal.
        internal: ``internal(left_state, right_state) -> state`` for a binary node.
        loss: ``loss(state, label) -> node id`` of the node's loss.

    A unary node's state is its child's state (pass-through); it still gets a loss.
    """
    state: list[S] = []
    push = state.append
    losses: list[int] = []
    keep = losses.append
    for word, left, right, label in nodes:
        if left < 0:
            s = leaf(word)
        elif right < 0:
            s = state[left]
        else:
            s = internal(state[left], state[right])
        push(s)
        keep(loss(s, label))
    return losses


def emit_cells(nodes: Sequence[NodeRow], builder: GraphBuilder, leaf: int, internal: int,
               loss: int) -> list[int]:
    """:func:`fold_tree` with one node per cell, inlined (the hot path of graph building).

    Args:
        nodes: post-order rows of a :class:`TreeInstance`.
        builder: the builder to append to.
        leaf: op id of the leaf cell (attr = word id).
        internal: op id of the binary cell.
        loss: op id of the loss (attr = label).

    Returns:
        The loss node of every tree node, in post-order.
    """
    add = builder.add
    state: list[int] = []
    push = state.append
    losses: list[int] = []
    keep = losses.append
    for word, left, right, label in nodes:
        if left < 0:
            s = add(leaf, attr=word)
        elif right < 0:
            s = state[left]
        else:
            s = add(internal, state[left], state[right])
        push(s)
        keep(add(loss, s, attr=label))
    return losses


class TreeWorkload(Workload):
    """Base of the SST tree workloads: data, word ids, parameters and emission.

    A subclass sets :attr:`name`, declares its op types in :meth:`_declare_cells` (one leaf,
    one internal and one loss op) and :meth:`_declare_primitives`, and spells the cell out
    in :meth:`_leaf`, :meth:`_internal` and :meth:`_loss` at primitive granularity. The
    vocabulary ends with the unbatchable ``loss_sum``.

    Args:
        granularity: ``"cell"`` (one op type per cell) or ``"primitive"`` (DyNet's ops).
        embed_dim: word embedding size.
        hidden_dim: hidden state size.
        vocab_size: number of word ids including the unknown id 0 (``None``: every train
            word). The embedding tables have ``min(vocab_size, 1 + distinct train words)`` rows.
        data_dir: data root holding ``trees/{train,dev,test}.txt`` (default: ``data/``).

    Attributes:
        word_vocab: the word ids, from the train split.
        num_words: rows of the embedding tables (``len(word_vocab)``).
    """

    num_classes = NUM_CLASSES
    real_data = True

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small embeddings and states (the trees are short already)."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden}

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, data_dir)
        for arg, value in (("embed_dim", embed_dim), ("hidden_dim", hidden_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"{arg} must be a positive int, got {value!r}")
        self.embed_dim, self.hidden_dim = embed_dim, hidden_dim
        self.word_vocab = WordVocab.from_file(self._path("train"), vocab_size)
        self.num_words = len(self.word_vocab)
        self._cell_ops: tuple[int, int, int] | None = None
        names = self._declare_vocab()
        if self.granularity == "cell":
            leaf, internal, loss = (self.vocab.id(n) for n in names)
            self._cell_ops = (leaf, internal, loss)

    # ------------------------------------------------------------------ subclass hooks
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape, by short name (``"E"``; the full name is ``name.E``)."""
        raise NotImplementedError

    def _cell_op(self, ops: OpSet, op: str, in_shapes: tuple[tuple[int, ...], ...],
                 out_dim: int, params: tuple[str, ...]) -> str:
        """Declare the cell op ``<name>.<op>`` reading the parameters with short names."""
        shapes = self._shapes()
        full = tuple(f"{self.name}.{k}" for k in params)
        return ops.add(OpType(f"{self.name}.{op}", f"{self.name}.{op}", in_shapes, (out_dim,),
                              full), {f: shapes[k] for f, k in zip(full, params, strict=True)})

    def _param(self, short: str) -> dict[str, tuple[int, ...]]:
        """``{full name: shape}`` of one parameter, for :meth:`OpSet.add`."""
        return {f"{self.name}.{short}": self._shapes()[short]}

    def _declare_cells(self, ops: OpSet) -> tuple[str, str, str]:
        """Declare the cell-level op types; return the leaf, internal and loss op names."""
        raise NotImplementedError

    def _declare_primitives(self, ops: OpSet) -> None:
        """Declare the primitive op types (remember the names for the emitters)."""
        raise NotImplementedError

    def _leaf(self, b: GraphBuilder, word: int) -> Any:
        """Primitive granularity: emit a pre-terminal's state for word id ``word``."""
        raise NotImplementedError

    def _internal(self, b: GraphBuilder, left: Any, right: Any) -> Any:
        """Primitive granularity: emit a binary node's state from its children's."""
        raise NotImplementedError

    def _loss(self, b: GraphBuilder, state: Any, label: int) -> int:
        """Primitive granularity: emit a node's loss; return the loss node id."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Workload API
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``."""
        return SPLITS

    def _path(self, split: str) -> Path:
        return self.data_dir / "trees" / f"{split}.txt"

    def _load(self, split: str) -> list[TreeInstance]:
        path = self._path(split)
        trees = load_split_trees(path)
        ids = self.word_vocab.ids
        with gc_paused():  # a full collection over the cached trees would triple the time
            flat = [_flatten(tree, ids) for tree in trees]
        instances: list[TreeInstance] = []
        for k, (tree, rows) in enumerate(zip(trees, flat, strict=True)):
            if isinstance(rows, str):
                raise DataFormatError(path, _line_of(path, k), rows,
                                      f"binary SST trees with labels 0..{NUM_CLASSES - 1}",
                                      f"the {self.name} workload reads SST trees only")
            instances.append(TreeInstance(tree, rows))
        return instances

    def emit(self, instance: TreeInstance, builder: GraphBuilder) -> list[int]:
        """Append one tree's nodes; return its loss nodes (one per tree node, root last)."""
        if builder.vocab is not self.vocab and builder.vocab != self.vocab:
            raise GraphError(f"the builder's vocabulary is not {self.name}'s; create it with "
                             f"GraphBuilder(workload.vocab)")
        if self._cell_ops is not None:
            return emit_cells(instance.nodes, builder, *self._cell_ops)
        return fold_tree(instance.nodes, functools.partial(self._leaf, builder),
                         functools.partial(self._internal, builder),
                         functools.partial(self._loss, builder))

    def build_graph(self, instances: Sequence[Any], *, loss_sum: bool = True) -> Graph:
        """Build the mini-batch graph; at cell granularity with numpy, without a builder.

        The result is node for node the graph :meth:`emit` would build (state then loss per
        tree node, post-order); trees with a unary node take the builder path.
        """
        if self._cell_ops is None or not all(
                isinstance(t, TreeInstance) and t.is_binary for t in instances):
            return super().build_graph(instances, loss_sum=loss_sum)
        return build_binary_cells(instances, self.vocab, self._cell_ops,
                                  self.vocab.id(LOSS_SUM) if loss_sum else None)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter the vocabulary names (identical at both granularities)."""
        return dict(self._params)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(granularity={self.granularity!r}, "
                f"embed_dim={self.embed_dim}, hidden_dim={self.hidden_dim}, "
                f"num_words={self.num_words}, ops={len(self.vocab)})")
