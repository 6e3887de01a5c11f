"""Parameter gradients of the hand-written backwards, batched across batches.

:class:`ParamGrads` collects what each batch's backward contributes to a weight, a bias or
an embedding table and turns it into one gradient per parameter at the end of the run
(:mod:`edbatch.executor._analytic`). Kernels receive it as their ``acc`` argument
(:data:`~edbatch.executor.kernels.Backward`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["ParamGrads"]


class ParamGrads:
    """Parameter gradients of a hand-written backward pass, batched across batches.

    A linear layer's weight gradient is ``sum_b dY_b^T X_b`` over every batch ``b`` that used
    it; instead of one small matmul per batch, :meth:`linear` keeps ``(dY_b, X_b)`` and
    :meth:`result` runs one ``cat(dY)^T cat(X)`` per layer (the many small batches of a
    lattice or tagger become one large, efficient matmul). Embedding rows are likewise
    collected and added with one ``index_add_`` per table, or returned as a sparse COO
    gradient (``sparse_rows=True``: only the rows read, as DyNet updates lookup parameters;
    plain SGD and ``torch.optim.SGD`` take it, Adam does not).
    """

    def __init__(self, *, sparse_rows: bool = False) -> None:
        self.sparse_rows = sparse_rows
        self._linear: dict[tuple[str, int], tuple[str | None, list[Tensor], list[Tensor]]] = {}
        self._rows: dict[str, tuple[list[Tensor], list[Tensor]]] = {}
        self._dense: dict[str, list[Tensor]] = {}
        self._sums: dict[str, Tensor] = {}

    def linear(self, names: Sequence[str], d_out: Tensor, x: Tensor, start: int = 0) -> None:
        """Record ``y = x W^T + b`` for ``names = (W, b)``: ``dW += d_out^T x``,
        ``db += sum(d_out)`` (a bias shared by several weights gets their sum; a vector
        ``W``: ``y = x W + b``, ``d_out`` one column). ``names = (W,)`` has no bias;
        ``start`` > 0 (or an ``x`` narrower than ``W``) means ``x`` reads the column block
        ``W[:, start:start + x.shape[1]]`` only (hoisted input projections)."""
        entry = self._linear.setdefault((names[0], start),
                                        (names[1] if len(names) > 1 else None, [], []))
        entry[1].append(d_out)
        entry[2].append(x)

    def rows(self, name: str, index: Tensor, grad: Tensor) -> None:
        """Record ``table[index]`` read by a lookup: ``d table[index] += grad``."""
        entry = self._rows.setdefault(name, ([], []))
        entry[0].append(index)
        entry[1].append(grad)

    def add(self, name: str, grad: Tensor) -> None:
        """Record a whole gradient of parameter ``name`` (its shape), summed at the end."""
        self._dense.setdefault(name, []).append(grad)

    def addmm(self, name: str, a: Tensor, b: Tensor, like: Tensor, start: int = 0) -> None:
        """``d name[:, start:start + N] += a @ b`` (``b`` ``[K, N]``), accumulated in place in
        one buffer per parameter (zeros of ``like``, the parameter, at the first call): a
        weight used by several batches, or read as column blocks, gets its gradient with
        no per-batch result, ``cat`` or final stack-and-sum."""
        buf = self._sums.get(name)
        if buf is None:
            buf = self._sums[name] = torch.zeros_like(like)
        if buf.dim() != 2 or a.dim() != 2 or b.dim() != 2 or a.shape[0] != buf.shape[0] \
                or start < 0 or start + b.shape[1] > buf.shape[1]:
            raise ValueError(f"addmm into the gradient of {name!r} {tuple(buf.shape)}: "
                             f"{tuple(a.shape)} @ {tuple(b.shape)} at column {start} "
                             "does not fit")
        buf[:, start:start + b.shape[1]].addmm_(a, b)

    def result(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The summed gradient of every parameter recorded (others are absent)."""
        out: dict[str, Tensor] = {}

        def add(name: str, g: Tensor) -> None:
            out[name] = out[name] + g if name in out else g

        for (weight, start), (bias, d_outs, xs) in self._linear.items():
            dy = d_outs[0] if len(d_outs) == 1 else torch.cat(d_outs)
            g = dy.t() @ (xs[0] if len(xs) == 1 else torch.cat(xs))
            if params[weight].dim() == 1:  # a vector weight: y = x w + b, one column
                g = g.reshape(-1)
            elif start or g.shape != params[weight].shape:  # a column block of the weight
                block, g = g, torch.zeros_like(params[weight])
                g[:, start:start + block.shape[1]] = block
            add(weight, g)
            if bias is not None:
                add(bias, dy.sum(0))
        for name, (index, grads) in self._rows.items():
            table, idx, rows = params[name], torch.cat(index), torch.cat(grads)
            if self.sparse_rows:
                add(name, torch.sparse_coo_tensor(idx.unsqueeze(0), rows, table.shape,
                                                  check_invariants=False))
            else:
                add(name, torch.zeros_like(table).index_add_(0, idx, rows))
        for name, grads in self._dense.items():
            add(name, grads[0] if len(grads) == 1 else torch.stack(grads).sum(0))
        for name, buf in self._sums.items():
            add(name, buf)
        return out
