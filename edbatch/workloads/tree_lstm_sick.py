"""Child-sum Tree-LSTM relatedness on SICK (Tai, Socher, Manning 2015), registry name
``"tree_lstm_sick"``.

Each pair's two dependency trees (``data/sick/{train,dev,test}``, see
:mod:`edbatch.data.sick`) are encoded bottom-up by a child-sum Tree-LSTM whose node reads
its word and **any number of children**. With ``H = hidden_dim``, ``sig`` the sigmoid:

* **node** (word ``x = E[w]``, children ``(h_k, c_k)``, ``k = 1..K``, ``K >= 0``):
  ``h~ = sum_k h_k``; ``[i; o; u] = W_iou x + U_iou h~ + b_iou``;
  ``f_k = sig(W_f x + U_f h_k + b_f)``; ``c = sig(i) * tanh(u) + sum_k f_k * c_k``;
  ``h = sig(o) * tanh(c)``.
* **similarity head** (root states ``h_a``, ``h_b``): ``h_x = h_a * h_b``,
  ``h_+ = |h_a - h_b|``, ``h_s = sig(W_x h_x + W_abs h_+ + b_s)``,
  ``p = softmax(W_p h_s + b_p)`` over the scores 1..5; the loss is ``KL(t || p)`` with
  ``t`` the sparse target of :func:`~edbatch.data.sick.similarity_target`; the predicted
  score is ``sum_k k p_k``.

Op types (cell granularity only):

* ``tree_lstm_sick.embed``: kind ``lookup``, no operands, attr = word id, out ``(D,)``.
* ``tree_lstm_sick.node``: **variadic** (``in_shapes=None``), operands ``x`` then the ``K``
  children's ``(2H,)`` states ``[h; c]``, attr = ``K``; out ``(2H,)``. Nodes with 0, 1 or 5
  children are one op type and batch together (the kernel in
  :mod:`edbatch.executor.cells_sick` reads child slot ``j`` from the nodes with ``K > j``).
* ``tree_lstm_sick.sim``: operands the two root states, attr = ``round(1000 * score)``,
  out ``(1,)`` = the pair's KL loss.
* ``loss_sum``: the mini-batch's final sum.

A pair of trees with ``n_a`` and ``n_b`` tokens gives ``2 (n_a + n_b) + 1`` nodes. Word ids
come from the train split, lower-cased, most frequent first; id 0 is the unknown word. The
embeddings are trained from random initialisation (no GloVe ships with the repository).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from edbatch.data.sick import DepTree, SickPair, load_sick
from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

__all__ = ["NUM_SCORES", "SickInstance", "TreeLSTMSick", "relatedness_metrics", "tree_rows"]

#: The relatedness classes 1..5.
NUM_SCORES = 5
#: A score travels as the attr ``round(score * SCORE_SCALE)`` (see ``cells_sick``).
SCORE_SCALE = 1000
_P = "tree_lstm_sick"

#: One tree in post-order: ``(word id, post-order positions of the children)`` per token.
Rows = tuple[tuple[int, tuple[int, ...]], ...]


def tree_rows(tree: DepTree, ids: dict[str, int]) -> Rows:
    """Post-order rows of a dependency tree: every node after its children, root last."""
    order = tree.postorder()
    position = {tok: k for k, tok in enumerate(order)}
    return tuple((ids.get(tree.words[tok - 1].lower(), 0),
                  tuple(position[kid] for kid in tree.children[tok])) for tok in order)


@dataclass(frozen=True, slots=True)
class SickInstance:
    """A SICK pair with word ids resolved: both trees' post-order rows and the score."""

    pair: SickPair
    a: Rows
    b: Rows

    @property
    def score(self) -> float:
        """The gold relatedness in [1, 5]."""
        return self.pair.score

    @property
    def score_attr(self) -> int:
        """The attr of the pair's ``sim`` node."""
        return round(self.pair.score * SCORE_SCALE)


class TreeLSTMSick(Workload):
    """Child-sum Tree-LSTM over both dependency trees of a SICK pair (module docstring).

    Args:
        granularity: ``"cell"`` only (a child-sum node has no fixed primitive spelling:
            the number of forget gates varies).
        embed_dim: word embedding size ``D``.
        hidden_dim: Tree-LSTM memory size ``H``.
        sim_dim: hidden size of the similarity head.
        vocab_size: word ids kept including the unknown id 0 (``None``: every train word).
        data_dir: data root holding ``sick/{train,dev,test}``.

    Example:
        >>> wl = TreeLSTMSick(embed_dim=4, hidden_dim=4, sim_dim=3)
        >>> wl.vocab.names
        ('tree_lstm_sick.embed', 'tree_lstm_sick.node', 'tree_lstm_sick.sim', 'loss_sum')
        >>> inst = wl.load("dev")[0]
        >>> wl.minibatch("dev", [0]).num_nodes == 2 * (len(inst.a) + len(inst.b)) + 2
        True
    """

    name = _P
    default_eval_split = "dev"
    real_data = True
    hand_backward = True
    granularities = ("cell",)

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small embeddings, states and head; ``short``: 50 word ids."""
        return {"embed_dim": dim, "hidden_dim": dim if hidden is None else hidden,
                "sim_dim": 4, **({"vocab_size": 50} if short else {})}

    def __init__(self, granularity: str = "cell", embed_dim: int = 150, hidden_dim: int = 150,
                 sim_dim: int = 50, vocab_size: int | None = None,
                 data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, data_dir)
        if self.granularity != "cell":
            raise GraphError(f"workload {_P!r} has only the 'cell' granularity (its child-sum "
                             f"node takes any number of children), got {granularity!r}; "
                             f"pass granularity=cell")
        for arg, value in (("embed_dim", embed_dim), ("hidden_dim", hidden_dim),
                           ("sim_dim", sim_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"{arg} must be a positive int, got {value!r}")
        if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
            raise GraphError(f"vocab_size must be a positive int (it includes the unknown "
                             f"word id 0), got {vocab_size!r}; pass None to keep every word")
        self.embed_dim, self.hidden_dim, self.sim_dim = embed_dim, hidden_dim, sim_dim
        self._pairs: dict[str, list[SickPair]] = {}
        counts = Counter(w.lower() for p in self.load_pairs("train") for t in (p.a, p.b)
                         for w in t.words)
        ranked = sorted(counts, key=lambda w: (-counts[w], w))
        kept = ranked if vocab_size is None else ranked[:vocab_size - 1]
        self.words: tuple[str, ...] = ("<unk>", *kept)
        self.word_ids: dict[str, int] = {w: i for i, w in enumerate(kept, start=1)}
        self.num_words = len(self.words)
        self._declare_vocab()
        self._ops = tuple(self.vocab.id(f"{_P}.{k}") for k in ("embed", "node", "sim"))

    # ------------------------------------------------------------------ vocabulary
    def _declare_cells(self, ops: OpSet) -> None:
        d, h, s = self.embed_dim, self.hidden_dim, self.sim_dim
        ops.add(OpType(f"{_P}.embed", "lookup", (), (d,), (f"{_P}.E",)),
                {f"{_P}.E": (self.num_words, d)})
        node = {f"{_P}.W_iou": (3 * h, d), f"{_P}.W_iou.b": (3 * h,),
                f"{_P}.U_iou": (3 * h, h), f"{_P}.W_f": (h, d), f"{_P}.W_f.b": (h,),
                f"{_P}.U_f": (h, h)}
        ops.add(OpType(f"{_P}.node", f"{_P}.node", None, (2 * h,), tuple(node)), node)
        sim = {f"{_P}.W_x": (s, h), f"{_P}.W_abs": (s, h), f"{_P}.W_x.b": (s,),
               f"{_P}.W_p": (NUM_SCORES, s), f"{_P}.W_p.b": (NUM_SCORES,)}
        ops.add(OpType(f"{_P}.sim", f"{_P}.sim", ((2 * h,), (2 * h,)), (1,), tuple(sim)), sim)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter the vocabulary names."""
        return dict(self._params)

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``."""
        return ("train", "dev", "test")

    def load_pairs(self, split: str) -> list[SickPair]:
        """The raw pairs of ``split`` (``data_dir/sick/<split>``)."""
        if split not in self.splits:
            return list(self.load(split))  # raises the UnknownNameError
        if split not in self._pairs:
            self._pairs[split] = load_sick(self.data_dir / "sick" / split)
        return self._pairs[split]

    def _load(self, split: str) -> list[SickInstance]:
        return [SickInstance(p, tree_rows(p.a, self.word_ids), tree_rows(p.b, self.word_ids))
                for p in self.load_pairs(split)]

    # ------------------------------------------------------------------ emission
    def _tree(self, rows: Rows, builder: GraphBuilder) -> int:
        embed, node, _ = self._ops
        add = builder.add
        state: list[int] = []
        for word, kids in rows:
            state.append(add(node, add(embed, attr=word), *[state[k] for k in kids],
                             attr=len(kids)))
        return state[-1]

    def emit(self, instance: SickInstance, builder: GraphBuilder) -> list[int]:
        """Append both trees and the pair's loss; return ``[loss node]``."""
        if builder.vocab is not self.vocab and builder.vocab != self.vocab:
            raise GraphError(f"the builder's vocabulary is not {_P}'s; create it with "
                             f"GraphBuilder(workload.vocab)")
        if not isinstance(instance, SickInstance):
            raise GraphError(f"{_P} emits SickInstance objects (workload.load(split)[i]), "
                             f"got {type(instance).__name__}")
        root_a, root_b = self._tree(instance.a, builder), self._tree(instance.b, builder)
        return [builder.add(self._ops[2], root_a, root_b, attr=instance.score_attr)]

    def instances(self, split: str, indices: Sequence[int]) -> list[SickInstance]:
        """The instances of ``split`` at ``indices``."""
        data = self.load(split)
        return [data[int(i)] for i in indices]

    def __repr__(self) -> str:
        return (f"TreeLSTMSick(embed_dim={self.embed_dim}, hidden_dim={self.hidden_dim}, "
                f"sim_dim={self.sim_dim}, num_words={self.num_words}, ops={len(self.vocab)})")


def _ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ranks 1..n with ties given their mean rank (as Spearman's rho needs)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1, dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return np.asarray(sums[inverse] / counts[inverse], dtype=np.float64)


def _pearson(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    dx, dy = x - x.mean(), y - y.mean()
    denom = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum()) / denom if denom > 0 else float("nan")


def relatedness_metrics(predicted: ArrayLike, gold: ArrayLike) -> dict[str, float]:
    """Pearson r, Spearman rho and the mean squared error of predicted scores.

    Example:
        >>> m = relatedness_metrics([1.0, 2.0, 3.5], [1.0, 2.5, 3.0])
        >>> round(m["pearson"], 4), m["spearman"], round(m["mse"], 4)
        (0.9226, 1.0, 0.1667)
    """
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    g = np.asarray(gold, dtype=np.float64).reshape(-1)
    if p.shape != g.shape or len(p) < 2:
        raise ValueError(f"need as many predictions as gold scores, at least 2; got "
                         f"{len(p)} and {len(g)}")
    return {"pearson": _pearson(p, g), "spearman": _pearson(_ranks(p), _ranks(g)),
            "mse": float(((p - g) ** 2).mean())}
