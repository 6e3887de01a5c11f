"""MV-RNN (matrix-vector RNN, Socher et al. 2012) over binarised SST trees.

Every word and every constituent carries a vector ``v`` (``H`` values) and a matrix ``M``
(``H x H``, stored flattened row-major). Every tree node gets a loss (negative log-likelihood
of its sentiment label), and the mini-batch ends in one unbatchable ``loss_sum``, as in the
DyNet / ED-Batch benchmark. With ``H = hidden_dim``:

* **leaf** (word ``w``): ``v = E_v[w]``, ``M = E_M[w]`` (a lookup each).
* **internal** (children ``(v_l, M_l)``, ``(v_r, M_r)``):
  ``v = tanh(W [M_r v_l; M_l v_r] + b)``; ``M = W_M [M_l; M_r] + b_M``, where
  ``[M_l; M_r]`` is the stacked ``2H x H`` matrix, ``W_M`` is ``H x 2H`` and ``b_M`` (``H``)
  is added to every column.
* **loss** (label ``y``): ``-log softmax(W_out v + b_out)[y]``.

The word vectors have ``H`` values (``embed_dim`` is ``hidden_dim``), and ``hidden_dim``
defaults to 32 rather than 128 because every node carries ``H * H`` matrix entries
(``H = 32``: 1,056 floats per state; ``H = 128`` would be 16,512).

Parameters (same names at both granularities): ``mvrnn.E_v`` ``(num_words, H)``,
``mvrnn.E_M`` ``(num_words, H * H)`` (row-major word matrices), ``mvrnn.W`` ``(H, 2H)``
and ``mvrnn.W.b`` ``(H,)``, ``mvrnn.W_M`` ``(H, 2H)`` and ``mvrnn.W_M.b`` ``(H,)``,
``mvrnn.W_out`` ``(5, H)`` and ``.b``.

Granularities:

* ``"cell"``: ``mvrnn.leaf`` (no operands, attr = word id, out ``(H + H*H,) = [v; vec(M)]``),
  ``mvrnn.internal`` (two such operands), ``mvrnn.loss`` (attr = label, out ``(1,)``),
  ``loss_sum``. A tree of ``n`` nodes gives ``2n`` nodes.
* ``"primitive"``: a leaf is 2 lookups (``lookup.mvrnn.E_v`` and ``lookup.mvrnn.E_M``, attr =
  word id), a binary node 7 nodes (2 ``matvec/HxH``, concat, affine, tanh for ``v``; concat
  of the two flattened matrices and one ``affine_rows.mvrnn.W_M`` for ``M``), a loss 2
  (affine, ``pick_nll/5`` with attr = label). ``affine_rows`` (kind ``"affine_rows"``) is
  the matrix affine: its operand is the flattened ``2H x H`` stack ``(2H*H,)``, which it
  reshapes, multiplies by ``W_M`` from the left, adds ``b_M`` to every column and flattens
  back to ``(H*H,)``.

A unary internal node (none in SST) passes its child's state through and adds only a loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._trees import NUM_CLASSES, TreeWorkload
from edbatch.workloads.primitives import OpSet

__all__ = ["MVRNN"]


class MVRNN(TreeWorkload):
    """The MV-RNN workload (registry name ``"mvrnn"``).

    Args:
        granularity: ``"cell"`` or ``"primitive"``.
        embed_dim: must be ``None`` or equal to ``hidden_dim`` (word vectors are states).
        hidden_dim: size ``H`` of ``v``; ``M`` is ``H x H``. Defaults to 32.
        vocab_size: word ids kept, including the unknown id 0 (``None``: all train words).
        data_dir: data root holding ``trees/{train,dev,test}.txt``.

    Raises:
        ValueError: ``embed_dim`` differs from ``hidden_dim``.

    Example:
        >>> wl = MVRNN(hidden_dim=4)
        >>> wl.vocab[0].out_shape, wl.param_shapes()["mvrnn.E_M"][1]
        ((20,), 16)
    """

    name = "mvrnn"

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """States of 4 (every word carries a 4 x 4 matrix), whatever ``dim``."""
        return {"hidden_dim": 4}

    def __init__(self, granularity: str = "cell", embed_dim: int | None = None,
                 hidden_dim: int = 32, vocab_size: int | None = None,
                 data_dir: str | Path | None = None) -> None:
        if embed_dim is not None and embed_dim != hidden_dim:
            raise GraphError(f"MV-RNN word vectors are states, so embed_dim must equal "
                             f"hidden_dim ({hidden_dim}); got embed_dim={embed_dim}. Pass "
                             f"embed_dim=None or set hidden_dim={embed_dim}")
        super().__init__(granularity, hidden_dim, hidden_dim, vocab_size, data_dir)

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        h = self.hidden_dim
        return {
            "E_v": (self.num_words, h), "E_M": (self.num_words, h * h),
            "W": (h, 2 * h), "W.b": (h,), "W_M": (h, 2 * h), "W_M.b": (h,),
            "W_out": (NUM_CLASSES, h), "W_out.b": (NUM_CLASSES,),
        }

    def _declare_cells(self, ops: OpSet) -> tuple[str, str, str]:
        s = self.hidden_dim + self.hidden_dim**2
        return (self._cell_op(ops, "leaf", (), s, ("E_v", "E_M")),
                self._cell_op(ops, "internal", ((s,), (s,)), s, ("W", "W.b", "W_M", "W_M.b")),
                self._cell_op(ops, "loss", ((s,),), 1, ("W_out", "W_out.b")))

    def _declare_primitives(self, ops: OpSet) -> None:
        h, p = self.hidden_dim, self.name
        self._lookup_v = ops.lookup(f"{p}.E_v", self.num_words, h)
        self._lookup_m = ops.lookup(f"{p}.E_M", self.num_words, h * h)
        self._matvec = ops.matvec(h, h)
        self._concat_v = ops.concat(h, h)
        self._affine = ops.affine(f"{p}.W", 2 * h, h)
        self._tanh = ops.unary("tanh", h)
        self._concat_m = ops.concat(h * h, h * h)
        self._affine_rows = ops.add(
            OpType(f"affine_rows.{p}.W_M", "affine_rows", ((2 * h * h,),), (h * h,),
                   (f"{p}.W_M", f"{p}.W_M.b")),
            {**self._param("W_M"), **self._param("W_M.b")})
        self._out = ops.affine(f"{p}.W_out", h, NUM_CLASSES)
        self._nll = ops.pick_nll(NUM_CLASSES)

    def _leaf(self, b: GraphBuilder, word: int) -> tuple[int, int]:
        return b.add(self._lookup_v, attr=word), b.add(self._lookup_m, attr=word)

    def _internal(self, b: GraphBuilder, left: tuple[int, int], right: tuple[int, int]
                  ) -> tuple[int, int]:
        (v_l, m_l), (v_r, m_r) = left, right
        mixed = b.add(self._concat_v, b.add(self._matvec, m_r, v_l),
                      b.add(self._matvec, m_l, v_r))
        v = b.add(self._tanh, b.add(self._affine, mixed))
        return v, b.add(self._affine_rows, b.add(self._concat_m, m_l, m_r))

    def _loss(self, b: GraphBuilder, state: tuple[int, int], label: int) -> int:
        return b.add(self._nll, b.add(self._out, state[0]), attr=label)
