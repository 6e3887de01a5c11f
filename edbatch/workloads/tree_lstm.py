"""Tree-LSTM over binarised SST trees (child-sum style gates with one forget gate per child).

Every tree node gets a state and a loss (negative log-likelihood of its sentiment label), and
the mini-batch ends in one unbatchable ``loss_sum``, as in the DyNet / ED-Batch benchmark.
With ``H = hidden_dim``, ``E`` the word embeddings, ``sig`` the sigmoid and ``⊙`` the
element-wise product:

* **leaf** (word ``w``): ``x = E[w]``; ``[i; o; u] = W_iou x + b`` (one fused ``3H`` affine);
  ``i, o = sig(·)``, ``u = tanh(·)``; ``c = i ⊙ u``; ``h = o ⊙ tanh(c)``.
* **internal** (children ``(h1, c1)``, ``(h2, c2)``): ``e = [h1; h2]``;
  ``[i; o; u] = U_iou e + b``; ``f1 = sig(U_f1 h1 + b_f)``, ``f2 = sig(U_f2 h2 + b_f)``;
  ``c = i ⊙ u + f1 ⊙ c1 + f2 ⊙ c2``; ``h = o ⊙ tanh(c)``.
* **loss** (label ``y``): ``-log softmax(W_out h + b_out)[y]``.

Parameters (same names at both granularities): ``tree_lstm.E`` ``(num_words, embed_dim)``,
``tree_lstm.W_iou`` ``(3H, embed_dim)`` and ``tree_lstm.W_iou.b`` ``(3H,)``,
``tree_lstm.U_iou`` ``(3H, 2H)`` and ``.b``, ``tree_lstm.U_f1``, ``tree_lstm.U_f2``
``(H, H)``, the shared forget bias ``tree_lstm.b_f`` ``(H,)``, ``tree_lstm.W_out``
``(5, H)`` and ``.b``.

Granularities:

* ``"cell"``: ``tree_lstm.leaf`` (no operands, attr = word id, out ``(2H,) = [h; c]``),
  ``tree_lstm.internal`` (two ``(2H,)`` operands), ``tree_lstm.loss`` (attr = label, out
  ``(1,)``), ``loss_sum``. A tree of ``n`` nodes gives ``2n`` nodes.
* ``"primitive"``: DyNet's fine-grained ops, ``h`` and ``c`` separate nodes. A leaf is 11
  nodes (lookup, affine, 3 slices, sig, sig, tanh, cmult, tanh, cmult), a binary node 19
  (concat, affine, 3 slices, 3 gate activations, 2 forget affines, 2 sig, 3 cmult, 2 add,
  tanh, cmult), a loss 2 (affine, ``pick_nll/5`` with attr = label).

A unary internal node (none in SST) passes its child's state through and adds only a loss.
"""

from __future__ import annotations

from pathlib import Path

from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._trees import NUM_CLASSES, TreeWorkload
from edbatch.workloads.primitives import OpSet

__all__ = ["TreeLSTM"]


class TreeLSTM(TreeWorkload):
    """The Tree-LSTM workload (registry name ``"tree_lstm"``).

    Args:
        granularity: ``"cell"`` or ``"primitive"``.
        embed_dim: word embedding size.
        hidden_dim: size ``H`` of ``h`` and ``c``.
        vocab_size: word ids kept, including the unknown id 0 (``None``: all train words).
        data_dir: data root holding ``trees/{train,dev,test}.txt``.

    Example:
        >>> wl = TreeLSTM(hidden_dim=8, embed_dim=4)
        >>> wl.vocab.names
        ('tree_lstm.leaf', 'tree_lstm.internal', 'tree_lstm.loss', 'loss_sum')
        >>> g = wl.minibatch("dev", [0])
        >>> g.num_nodes == 2 * wl.load("dev")[0].num_nodes + 1
        True
    """

    name = "tree_lstm"
    hand_backward = True

    def __init__(self, granularity: str = "cell", embed_dim: int = 128, hidden_dim: int = 128,
                 vocab_size: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(granularity, embed_dim, hidden_dim, vocab_size, data_dir)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        d, h = self.embed_dim, self.hidden_dim
        return {
            "E": (self.num_words, d), "W_iou": (3 * h, d), "W_iou.b": (3 * h,),
            "U_iou": (3 * h, 2 * h), "U_iou.b": (3 * h,),
            "U_f1": (h, h), "U_f2": (h, h), "b_f": (h,),
            "W_out": (NUM_CLASSES, h), "W_out.b": (NUM_CLASSES,),
        }

    def _declare_cells(self, ops: OpSet) -> tuple[str, str, str]:
        s = 2 * self.hidden_dim
        return (self._cell_op(ops, "leaf", (), s, ("E", "W_iou", "W_iou.b")),
                self._cell_op(ops, "internal", ((s,), (s,)), s,
                              ("U_iou", "U_iou.b", "U_f1", "U_f2", "b_f")),
                self._cell_op(ops, "loss", ((s,),), 1, ("W_out", "W_out.b")))

    def _declare_primitives(self, ops: OpSet) -> None:
        d, h, p = self.embed_dim, self.hidden_dim, self.name
        self._lookup = ops.lookup(f"{p}.E", self.num_words, d)
        self._leaf_affine = ops.affine(f"{p}.W_iou", d, 3 * h)
        self._concat = ops.concat(h, h)
        self._affine = ops.affine(f"{p}.U_iou", 2 * h, 3 * h)
        self._gates = tuple(ops.slice(k * h, (k + 1) * h, 3 * h) for k in range(3))
        # The forget affines share the bias b_f, so they are declared by hand.
        self._forget = tuple(
            ops.add(OpType(f"affine.{p}.U_f{k}", "affine", ((h,),), (h,),
                           (f"{p}.U_f{k}", f"{p}.b_f")),
                    {**self._param(f"U_f{k}"), **self._param("b_f")})
            for k in (1, 2))
        self._sigmoid = ops.unary("sigmoid", h)
        self._tanh = ops.unary("tanh", h)
        self._cmult = ops.binary("cmult", h)
        self._add = ops.binary("add", h)
        self._out = ops.affine(f"{p}.W_out", h, NUM_CLASSES)
        self._nll = ops.pick_nll(NUM_CLASSES)

    def _gate_activations(self, b: GraphBuilder, g: int) -> tuple[int, int, int]:
        i_slice, o_slice, u_slice = self._gates
        return (b.add(self._sigmoid, b.add(i_slice, g)), b.add(self._sigmoid, b.add(o_slice, g)),
                b.add(self._tanh, b.add(u_slice, g)))

    def _leaf(self, b: GraphBuilder, word: int) -> tuple[int, int]:
        i, o, u = self._gate_activations(
            b, b.add(self._leaf_affine, b.add(self._lookup, attr=word)))
        c = b.add(self._cmult, i, u)
        return b.add(self._cmult, o, b.add(self._tanh, c)), c

    def _internal(self, b: GraphBuilder, left: tuple[int, int], right: tuple[int, int]
                  ) -> tuple[int, int]:
        (h1, c1), (h2, c2) = left, right
        i, o, u = self._gate_activations(b, b.add(self._affine, b.add(self._concat, h1, h2)))
        f1 = b.add(self._sigmoid, b.add(self._forget[0], h1))
        f2 = b.add(self._sigmoid, b.add(self._forget[1], h2))
        cmult, add = self._cmult, self._add
        iu, fc1, fc2 = b.add(cmult, i, u), b.add(cmult, f1, c1), b.add(cmult, f2, c2)
        c = b.add(add, b.add(add, iu, fc1), fc2)
        return b.add(self._cmult, o, b.add(self._tanh, c)), c

    def _loss(self, b: GraphBuilder, state: tuple[int, int], label: int) -> int:
        return b.add(self._nll, b.add(self._out, state[0]), attr=label)
