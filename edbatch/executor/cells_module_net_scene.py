"""Cell kinds that build a CLEVR scene for the module network (:mod:`edbatch.executor.
cells_module_net` holds the modules): ``module_net.object`` (an object's row from its packed
attr), ``module_net.objects`` (the variadic stack of a scene's rows) and ``module_net.start``
(the ``scene`` module: the mask column). Each has a hand-written ``backward``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fused
from edbatch.executor._attr_checks import check_range
from edbatch.executor._reads import ArenaRows
from edbatch.executor.cell_kind import CellKind, Param, RoleGrads
from edbatch.executor.kernels import slot_nodes
from edbatch.graph import OpType
from edbatch.workloads.module_net import (
    ATTRIBUTE_ROWS,
    MAX_OBJECTS,
    VOCAB_SIZES,
    XY_OFFSET,
    XY_RADIX,
)

__all__ = ["Object", "Objects", "Start"]

_P = "module_net"
#: Codes :func:`~edbatch.workloads.module_net.pack_object` makes: ``0 .. _OBJECT_CODES - 1``.
_OBJECT_CODES = math.prod(VOCAB_SIZES) * XY_RADIX ** 2
Saves = dict[str, Any] | None
Grads = list[Tensor | None]


def _scene(t: Tensor) -> Tensor:
    """``(B, N * F)`` -> ``(B, N, F)``."""
    return t.reshape(t.shape[0], MAX_OBJECTS, -1)


class Object(CellKind):
    """An object's row ``[1, one-hot attributes, E[size] + E[colour] + E[material] +
    E[shape], x, y]``, decoded from its packed attr (``E``: one table, a block of rows per
    attribute)."""

    kind = f"{_P}.object"
    inputs = ()
    params = (Param("E", "V, D", init="embedding"),)
    saves = ("index",)
    dims = staticmethod(lambda op: {"V": ATTRIBUTE_ROWS,
                                    "D": op.out_shape[0] - 3 - ATTRIBUTE_ROWS})

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: Saves = None) -> Tensor:
        check_range(attrs, _OBJECT_CODES, "object code", "the codes pack_object makes",
                    "make it with edbatch.workloads.module_net.pack_object")
        if attrs.is_cpu and _fused.usable(p.E):  # compiled: one pass over the codes
            table = p.E.detach()
            code = attrs.reshape(-1).numpy()
            out = table.new_zeros(len(code), 3 + ATTRIBUTE_ROWS + table.shape[1])
            index = np.empty((len(code), len(VOCAB_SIZES)), dtype=np.int64)
            _object_rows(code, table.numpy(), out.numpy(), index)
            if save is not None:
                save.update(index=torch.from_numpy(index))
            return out
        if attrs.is_cpu:
            return self._forward_cpu(attrs, p.E, save)
        code, offset = attrs.reshape(-1), 0
        rows = []
        for size in VOCAB_SIZES:
            rows.append(offset + torch.remainder(code, size))
            code, offset = torch.div(code, size, rounding_mode="floor"), offset + size
        index = torch.stack(rows, dim=1)
        if save is not None:
            save.update(index=index)
        e = F.embedding(index, p.E).sum(dim=1)
        onehot = e.new_zeros(len(code), ATTRIBUTE_ROWS).scatter_(1, index, 1.0)
        parts = [torch.ones_like(e[:, :1]), onehot, e]
        for _ in range(2):
            xy = torch.remainder(code, XY_RADIX)
            parts.append(((xy - XY_OFFSET).to(e.dtype) / 100).unsqueeze(1))
            code = torch.div(code, XY_RADIX, rounding_mode="floor")
        return torch.cat(parts, dim=1)

    @staticmethod
    def _forward_cpu(attrs: Tensor, table: Tensor, save: Saves) -> Tensor:
        """The CPU form: codes decoded and the constant columns written in numpy (the same
        values; a dozen torch calls on a few hundred objects cost more than the decoding)."""
        code = attrs.reshape(-1).numpy()
        n, d = len(code), table.shape[1]
        index = np.empty((n, len(VOCAB_SIZES)), dtype=np.int64)
        offset = 0
        for j, size in enumerate(VOCAB_SIZES):
            index[:, j] = offset + code % size
            code, offset = code // size, offset + size
        out = table.new_zeros(n, 3 + ATTRIBUTE_ROWS + d)
        host = out.detach().numpy()
        host[:, 0] = 1.0
        host[np.arange(n)[:, None], 1 + index] = 1.0
        for k in (1, 2):
            host[:, -3 + k] = (code % XY_RADIX - XY_OFFSET).astype(host.dtype) / 100
            code = code // XY_RADIX
        index_t = torch.from_numpy(index)
        if save is not None:
            save.update(index=index_t)
        out[:, 1 + ATTRIBUTE_ROWS:1 + ATTRIBUTE_ROWS + d] = F.embedding(index_t, table).sum(1)
        return out

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        index, d = saved.index, p.E.shape[1]
        if not grads.acc.sparse_rows and index.is_cpu and _fused.usable(grad, p.E):
            # compiled: the table's gradient as index_add_ would sum it (same order), not
            # the repeated rows built, concatenated and added by ParamGrads.result
            d_table = torch.zeros_like(p.E)
            _object_grad(index.numpy(), grad.numpy(), d_table.numpy())
            grads.add("E", d_table)
            return []
        g = grad[:, 1 + ATTRIBUTE_ROWS:1 + ATTRIBUTE_ROWS + d]
        grads.rows("E", index.reshape(-1),
                   g.unsqueeze(1).expand(len(g), index.shape[1], d).reshape(-1, d))
        return []


# The attribute sizes as module constants: numba freezes them into the compiled code, so the
# decoding divides by constants (a multiply and shift), not by an array's values (an integer
# division each: 12 per object, most of a 400-object batch's time).
_S0, _S1, _S2, _S3 = VOCAB_SIZES
_O1, _O2, _O3 = _S0, _S0 + _S1, _S0 + _S1 + _S2


@_fused._jit
def _object_rows(code, table, out, index):  # type: ignore[no-untyped-def]
    """:meth:`Object._forward_cpu`'s rows (``out`` zeros, ``index`` each object's table
    rows), compiled: per object its attributes, one-hot, embedding sum and coordinates."""
    d = table.shape[1]
    for i in range(code.shape[0]):
        c = code[i]
        index[i, 0] = c % _S0
        c = c // _S0
        index[i, 1] = _O1 + c % _S1
        c = c // _S1
        index[i, 2] = _O2 + c % _S2
        c = c // _S2
        index[i, 3] = _O3 + c % _S3
        c = c // _S3
        out[i, 0] = 1.0
        for j in range(4):
            out[i, 1 + index[i, j]] = 1.0
        for k in range(d):
            e = 0.0
            for j in range(4):
                e += table[index[i, j], k]
            out[i, 1 + ATTRIBUTE_ROWS + k] = e
        for k in range(2):
            out[i, 1 + ATTRIBUTE_ROWS + d + k] = (c % XY_RADIX - XY_OFFSET) / 100
            c = c // XY_RADIX


@_fused._jit
def _object_grad(index, grad, d_table):  # type: ignore[no-untyped-def]
    """The table's gradient of :meth:`Object.backward`: ``d_table[index[i, j]] += grad[i,
    embedding columns]``, objects ``i`` then attributes ``j`` in order (``index_add_``'s)."""
    d = d_table.shape[1]
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            r = index[i, j]
            for k in range(d):
                d_table[r, k] += grad[i, 1 + ATTRIBUTE_ROWS + k]


def _slots(attrs: Tensor, sizes: Sequence[int]) -> Tensor:
    """Rows of the ``(B * N, F)`` scene block that operand slots ``0..k-1`` fill, slot by
    slot (the order of ``cat(slots)``); ``sizes[j]``: slot ``j``'s row count. On the CPU one
    ``nonzero`` of ``counts > slot`` (row-major: slot by slot, nodes ascending, as
    :func:`~edbatch.executor.kernels.slot_nodes`); elsewhere ``slot_nodes`` (no host sync)."""
    if attrs.device.type == "cpu":
        slot = torch.arange(len(sizes), dtype=attrs.dtype).unsqueeze(1)
        pairs = torch.nonzero(attrs.reshape(1, -1) > slot)  # (slot, node), row-major
        return pairs[:, 1] * MAX_OBJECTS + pairs[:, 0]
    return torch.cat([node * MAX_OBJECTS + j
                      for j, node in enumerate(slot_nodes(attrs, sizes))])


class Objects(CellKind):
    """A scene: its objects' rows stacked into ``(N * F,)``, zero rows after the last (one
    ``index_copy_`` of all slots; the backward one ``index_select``). ``merge_repeated = 0``:
    on the CPU every slot comes as one read of the rows, slot after slot (the object batch
    lays them out so: one view, one gradient route), which one compiled pass places
    (:func:`_objects_place`; the torch body stays the reference)."""

    kind = f"{_P}.objects"
    saves = ("sizes", "rows")
    merge_repeated = 0  # (CPU) the slots as one read: see _program
    counts_attr = (0, 0)  # the attr: the scene's object count

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: Saves = None) -> Tensor:
        sizes = [x.shape[0] for x in inputs]
        if len(inputs) == 1 and attrs.is_cpu and _fused.usable(inputs[0]):
            block = inputs[0]
            out = block.new_empty(attrs.shape[0], MAX_OBJECTS * block.shape[1])
            _placed(_objects_place(block.numpy(), attrs.numpy(), out.numpy(), True),
                    block, attrs)
            if save is not None:
                save.update(sizes=sizes, rows=None)  # (rows: made if the torch path asks)
            return out
        rows = _slots(attrs, sizes if len(inputs) > 1 else _slot_sizes(attrs, sizes[0]))
        if save is not None:
            save.update(sizes=sizes, rows=rows)
        out = inputs[0].new_zeros(attrs.shape[0] * MAX_OBJECTS, inputs[0].shape[1])
        out.index_copy_(0, rows, torch.cat(list(inputs)))
        return out.reshape(attrs.shape[0], -1)

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        rows = saved.rows
        if rows is None:
            if _fused.usable(grad):
                g = grad.new_empty(saved.sizes[0], grad.shape[1] // MAX_OBJECTS)
                _objects_place(g.numpy(), attrs.numpy(), grad.numpy(), False)
                return [g]
            rows = _slots(attrs, _slot_sizes(attrs, saved.sizes[0]))
        g = grad.reshape(grad.shape[0] * MAX_OBJECTS, -1).index_select(0, rows)
        return list(g.split(saved.sizes))


def _slot_sizes(attrs: Tensor, total: int) -> list[int]:
    """Rows of each operand slot (``counts > slot``) of nodes with object counts ``attrs``
    (``total`` rows in all)."""
    sizes = [int((attrs > k).sum()) for k in range(MAX_OBJECTS)]
    return [n for n in sizes if n] or [total]


def _placed(rows: int, block: Tensor, attrs: Tensor) -> None:
    """Refuse a merged read whose rows are not the nodes' objects (``rows``: what
    :func:`_objects_place` returned)."""
    if rows != block.shape[0]:
        raise ExecutionError(
            f"module_net.objects: the merged read has {block.shape[0]} object rows, but the "
            f"object counts (attrs {attrs.tolist()[:8]}{'...' if len(attrs) > 8 else ''}) "
            f"sum to {int(attrs.sum())}; each count must be 0..{MAX_OBJECTS} and the read "
            f"hold one row per object")


@_fused._jit
def _slot_starts(counts, n):  # type: ignore[no-untyped-def]
    """Each slot's first row in the slots' block (``n + 1`` entries, the last the total),
    or ``None``-like ``[-1]`` for a count outside ``0..n``."""
    start = np.zeros(n + 1, np.int64)
    for i in range(counts.shape[0]):
        c = counts[i]
        if c < 0 or c > n:
            start[n] = -1
            return start
        for j in range(c):
            start[j + 1] += 1
    for j in range(n):
        start[j + 1] += start[j]
    return start


@_fused._jit
def _objects_place(block, counts, scene, forward):  # type: ignore[no-untyped-def]
    """Forward: ``scene`` (``(B, N * F)``) the rows of ``block`` placed slot after slot
    (slot ``j``: the ``j``-th object of each node with more than ``j``, nodes ascending),
    zeros elsewhere. Backward: ``block`` the rows of ``scene`` those places hold. Returns
    the rows the counts place (``block``'s when they match; -1 for a count outside
    ``0..N``; nothing is written unless they match)."""
    f, n = block.shape[1], scene.shape[1] // block.shape[1]
    start = _slot_starts(counts, n)
    if start[n] != block.shape[0]:
        return start[n]
    for i in range(counts.shape[0]):
        for j in range(n):
            at = j * f
            if j < counts[i]:
                t = start[j]
                start[j] = t + 1
                _move(block, t, scene, i, at, forward)
            elif forward:
                for k in range(f):
                    scene[i, at + k] = 0.0
    return block.shape[0]


@_fused._jit_inline
def _move(block, t, scene, i, at, forward):  # type: ignore[no-untyped-def]
    """``scene[i, at:at + F] = block[t]`` (forward) or back, element by element (a slice
    assignment per object row cost 3x more)."""
    if forward:
        for k in range(block.shape[1]):
            scene[i, at + k] = block[t, k]
    else:
        for k in range(block.shape[1]):
            block[t, k] = scene[i, at + k]


class Start(CellKind):
    """``scene``: the attention on every real object (the mask column)."""

    kind = f"{_P}.start"
    inputs = ("scene",)
    indexed_reads = ("scene",)  # on the CPU: ArenaRows (the scene arena, rows by index)

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: Saves = None) -> Tensor:
        scene = inputs[0]
        if isinstance(scene, ArenaRows):  # the mask column of each node's arena row
            width = scene.arena.shape[1] // MAX_OBJECTS
            return scene.arena[:, ::width].index_select(0, scene.idx)
        return _scene(scene)[:, :, 0]

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> Grads:
        d = grad.new_zeros(grad.shape[0], op.in_shapes[0][0])  # type: ignore[index]
        _scene(d)[:, :, 0] = grad
        return [d]
