"""Tree-GRU over binarised SST trees (one reset gate per child, one update gate).

Every tree node gets a state and a loss (negative log-likelihood of its sentiment label), and
the mini-batch ends in one unbatchable ``loss_sum``, as in the DyNet / ED-Batch benchmark.
With ``H = hidden_dim``, ``E`` the word embeddings, ``sig`` the sigmoid and ``⊙`` the
element-wise product, the state is ``h`` (``H`` values):

* **leaf** (word ``w``): ``x = E[w]``; ``[a_z; a_c] = W_zc x + b`` (one fused ``2H`` affine,
  ``W_zc = [W_z; W_c]``); ``z = sig(a_z)``; ``c~ = tanh(a_c)``; ``h = (1 - z) ⊙ c~``.
* **internal** (children ``h1``, ``h2``): ``e = [h1; h2]``;
  ``[a_r1; a_r2; a_z] = U_rz e + b`` (fused ``3H``, ``U_rz = [U_r1; U_r2; U_z]``);
  ``r1, r2, z = sig(a_r1), sig(a_r2), sig(a_z)``; ``c~ = tanh(U_c [r1 ⊙ h1; r2 ⊙ h2] + b_c)``;
  ``h = z ⊙ (h1 + h2) / 2 + (1 - z) ⊙ c~``.
* **loss** (label ``y``): ``-log softmax(W_out h + b_out)[y]``.

Parameters (same names at both granularities): ``tree_gru.E`` ``(num_words, embed_dim)``,
``tree_gru.W_zc`` ``(2H, embed_dim)`` and ``tree_gru.W_zc.b`` ``(2H,)``, ``tree_gru.U_rz``
``(3H, 2H)`` and ``.b``, ``tree_gru.U_c`` ``(H, 2H)`` and ``.b``, ``tree_gru.W_out``
``(5, H)`` and ``.b``.

Granularities:

* ``"cell"``: ``tree_gru.leaf`` (no operands, attr = word id, out ``(H,)``),
  ``tree_gru.internal`` (two ``(H,)`` operands), ``tree_gru.loss`` (attr = label, out
  ``(1,)``), ``loss_sum``. A tree of ``n`` nodes gives ``2n`` nodes.
* ``"primitive"``: DyNet's fine-grained ops. A leaf is 8 nodes (lookup, affine, 2 slices,
  sig, tanh, one_minus, cmult), a binary node 19 (concat, affine, 3 slices, 3 sig, 2 cmult,
  concat, affine, tanh, add, half, cmult, one_minus, cmult, add), a loss 2 (affine,
  ``pick_nll/5`` with attr = label). ``half/H`` (kind ``"half"``) multiplies by 0.5; it is the
  ``/ 2`` of the average and the one op kind no other workload uses.

A unary internal node (none in SST) passes its child's state through and adds only a loss.
"""

from __future__ import annotations

from pathlib import Path

from edbatch.graph import GraphBuilder
from edbatch.workloads._trees import NUM_CLASSES, TreeWorkload
from edbatch.workloads.primitives import OpSet

__all__ = ["TreeGRU"]


class TreeGRU(TreeWorkload):
    """The Tree-GRU workload (registry name ``"tree_gru"``).

    Args:
        granularity: ``"cell"`` or ``"primitive"``.
        embed_dim: word embedding size.
        hidden_dim: state size ``H``.
        vocab_size: word ids kept, including the unknown id 0 (``None``: all train words).
        data_dir: data root holding ``trees/{train,dev,test}.txt``.

    Example:
        >>> wl = TreeGRU(hidden_dim=8, embed_dim=4)
        >>> wl.vocab.names
        ('tree_gru.leaf', 'tree_gru.internal', 'tree_gru.loss', 'loss_sum')
    """

    name = "tree_gru"

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, embed_dim, hidden_dim, vocab_size, data_dir)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        d, h = self.embed_dim, self.hidden_dim
        return {
            "E": (self.num_words, d), "W_zc": (2 * h, d), "W_zc.b": (2 * h,),
            "U_rz": (3 * h, 2 * h), "U_rz.b": (3 * h,), "U_c": (h, 2 * h), "U_c.b": (h,),
            "W_out": (NUM_CLASSES, h), "W_out.b": (NUM_CLASSES,),
        }

    def _declare_cells(self, ops: OpSet) -> tuple[str, str, str]:
        h = self.hidden_dim
        return (self._cell_op(ops, "leaf", (), h, ("E", "W_zc", "W_zc.b")),
                self._cell_op(ops, "internal", ((h,), (h,)), h,
                              ("U_rz", "U_rz.b", "U_c", "U_c.b")),
                self._cell_op(ops, "loss", ((h,),), 1, ("W_out", "W_out.b")))

    def _declare_primitives(self, ops: OpSet) -> None:
        d, h, p = self.embed_dim, self.hidden_dim, self.name
        self._lookup = ops.lookup(f"{p}.E", self.num_words, d)
        self._leaf_affine = ops.affine(f"{p}.W_zc", d, 2 * h)
        self._leaf_gates = (ops.slice(0, h, 2 * h), ops.slice(h, 2 * h, 2 * h))
        self._concat = ops.concat(h, h)
        self._gates_affine = ops.affine(f"{p}.U_rz", 2 * h, 3 * h)
        self._gates = tuple(ops.slice(k * h, (k + 1) * h, 3 * h) for k in range(3))
        self._cand_affine = ops.affine(f"{p}.U_c", 2 * h, h)
        self._sigmoid = ops.unary("sigmoid", h)
        self._tanh = ops.unary("tanh", h)
        self._one_minus = ops.unary("one_minus", h)
        self._half = ops.unary("half", h)
        self._cmult = ops.binary("cmult", h)
        self._add = ops.binary("add", h)
        self._out = ops.affine(f"{p}.W_out", h, NUM_CLASSES)
        self._nll = ops.pick_nll(NUM_CLASSES)

    def _leaf(self, b: GraphBuilder, word: int) -> int:
        zc = b.add(self._leaf_affine, b.add(self._lookup, attr=word))
        z = b.add(self._sigmoid, b.add(self._leaf_gates[0], zc))
        cand = b.add(self._tanh, b.add(self._leaf_gates[1], zc))
        return b.add(self._cmult, b.add(self._one_minus, z), cand)

    def _internal(self, b: GraphBuilder, h1: int, h2: int) -> int:
        sigmoid, cmult, add = self._sigmoid, self._cmult, self._add
        g = b.add(self._gates_affine, b.add(self._concat, h1, h2))
        r1, r2, z = (b.add(sigmoid, b.add(s, g)) for s in self._gates)
        reset = b.add(self._concat, b.add(cmult, r1, h1), b.add(cmult, r2, h2))
        cand = b.add(self._tanh, b.add(self._cand_affine, reset))
        mean = b.add(self._half, b.add(add, h1, h2))
        return b.add(add, b.add(cmult, z, mean),
                     b.add(cmult, b.add(self._one_minus, z), cand))

    def _loss(self, b: GraphBuilder, state: int, label: int) -> int:
        return b.add(self._nll, b.add(self._out, state), attr=label)
