"""Repeated-operand bookkeeping of the GGNN cells (:mod:`~edbatch.executor.cells_ggnn`):
which node and bond type every repeated operand row belongs to, the neighbour sums of the
dense message form, and the stacked weights the cells reuse within a run. The compiled
loops are in :mod:`~edbatch.executor._fused_ggnn`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import _fused
from edbatch.executor._fused_ggnn import bond_buckets, repeated_nodes
from edbatch.executor._ggnn_checks import check_counts
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.kernels import untracked
from edbatch.workloads.ggnn_molecules import COUNT_BITS

__all__ = ["compiled", "neighbour_sums", "per_attrs", "repeated_rows", "slot_rows", "stacked"]

_COUNT_MASK = (1 << COUNT_BITS) - 1


def compiled(attrs: Tensor) -> bool:
    """Whether the repeated rows' bookkeeping runs as one compiled loop (fused kernels on,
    CPU attrs) instead of torch's index kernels."""
    return _fused.enabled() and attrs.device.type == "cpu"


def stacked(key: str, parts: Sequence[Tensor], make: Any) -> Any:
    """``make(*parts)`` (weights stacked or sliced for a GEMM), made once per executor run
    and reused by its other batches: kept in the run's scope of
    :data:`~edbatch.executor._weights.TRANSPOSED` (under a key of its own), so it never
    outlives the run (version counters cannot tell whether a weight changed between runs:
    fused Adam, writes through ``.data``). Outside a run, or when autograd records a part,
    it is made afresh."""
    scope = TRANSPOSED.entries
    if scope is None or not untracked(*parts):
        return make(*parts)
    slot: Any = (key, id(parts[0]))
    got: Any = scope.get(slot)
    if got is not None and all(a is b for a, b in zip(got[0], parts, strict=True)):
        return got[1]
    value = make(*parts)
    scope[slot] = (tuple(parts), value)  # held for the run: the parts' ids stay theirs
    return value


def per_attrs(key: Any, attrs: Tensor, make: Any) -> Any:
    """``make()``, a pure function of ``attrs`` (and of ``key``), made once per executor run
    for equal attrs (the rounds of a message-passing net repeat a batch's attrs) and kept in
    the run's scope as :func:`stacked` keeps weights; outside a run, made afresh. A hit
    needs the same attrs tensor or an equal one (``torch.equal``, a few microseconds)."""
    scope = TRANSPOSED.entries
    if scope is None:
        return make()
    slot: Any = ("attrs", key, attrs.shape[0], attrs.device)
    got: Any = scope.get(slot)
    if got is not None and (got[0] is attrs or torch.equal(got[0], attrs)):
        return got[1]
    value = make()
    scope[slot] = (attrs, value)
    return value


def slot_rows(counts: Tensor, sizes: Sequence[int], sync_free: bool | None = None
              ) -> tuple[Tensor, Tensor]:
    """``(node, slot)`` (``int64[N]``) of every repeated operand row, slot after slot, each
    slot's nodes ascending: ``node`` is ``cat(slot_nodes(counts, sizes))`` of
    :func:`~edbatch.executor.kernels.slot_nodes`, in one ``nonzero`` of the ``[K, B]``
    mask ``counts > k`` on the CPU; elsewhere (``sync_free``) the first ``N = sum(sizes)``
    of its stable sort, with no synchronisation with the host."""
    k = torch.arange(len(sizes), device=counts.device)
    mask = counts.unsqueeze(0) > k.unsqueeze(1)
    if not (counts.device.type != "cpu" if sync_free is None else sync_free):
        slot, node = torch.nonzero(mask).unbind(1)
        return node, slot
    flat = torch.argsort(torch.logical_not(mask).view(-1).to(torch.uint8),
                         stable=True)[:sum(sizes)]
    size = counts.shape[0]
    return flat.remainder(size), flat.div(size, rounding_mode="floor")


def _slot_sizes(counts: Tensor, slots: Sequence[Tensor]) -> list[int]:
    """Rows per repeated slot: the operands' own, or on the CPU from the ``counts`` (where
    the executor passes the repeated rows as one merged operand, see ``merge_repeated``)."""
    if counts.device.type != "cpu" or not counts.numel():
        return [t.shape[0] for t in slots]
    hist = np.bincount(counts.numpy())
    return (len(counts) - np.cumsum(hist))[:len(hist) - 1].tolist()  # type: ignore[no-any-return]


def repeated_rows(slots: Sequence[Tensor], counts: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows [N, d], segment int64[N])``: the repeated operand slots stacked, and the node
    (``0..B-1``) each row belongs to, from the nodes' repeated-operand ``counts``."""
    sizes = [t.shape[0] for t in slots]
    if compiled(counts):
        segment = repeated_nodes(counts, sum(sizes), len(sizes))
    else:
        if counts.device.type == "cpu":  # (elsewhere unchecked: no host sync)
            check_counts(counts.numpy(), sum(sizes))
        segment = slot_rows(counts, _slot_sizes(counts, slots))[0]
    return (slots[0] if len(slots) == 1 else torch.cat(list(slots))), segment


def neighbour_sums(slots: Sequence[Tensor], attrs: Tensor, bonds: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """``(s [B, bonds*H], deg [B, bonds], index int64[N])``: each node's neighbour states
    summed per bond type (``s[v, b*H:(b+1)*H] = sum of h_u over v's in-edges of type b``),
    its in-degree per bond type, and the ``node * bonds + bond`` bucket of every repeated
    operand row (in :func:`repeated_rows` order), from the attrs of
    :func:`~edbatch.workloads.ggnn_molecules.update_attr`."""
    if not slots:
        return (attrs.new_zeros(0), attrs.new_zeros(0), attrs.new_zeros(0))
    size, hidden, sizes = attrs.shape[0], slots[0].shape[1], [t.shape[0] for t in slots]
    rows = slots[0] if len(slots) == 1 else torch.cat(list(slots))
    if compiled(attrs):
        index, deg = bond_buckets(attrs, len(rows), len(sizes), bonds, COUNT_BITS, rows.dtype)
    else:
        if attrs.device.type == "cpu":  # (elsewhere unchecked: no host sync)
            check_counts(attrs.numpy(), len(rows), COUNT_BITS)
        counts = torch.bitwise_and(attrs, _COUNT_MASK)
        node, slot = slot_rows(counts, _slot_sizes(counts, slots))
        codes = torch.bitwise_right_shift(attrs, COUNT_BITS).index_select(0, node)
        index = torch.bitwise_right_shift(codes, slot + slot).bitwise_and_(3).add_(node * bonds)
        deg = rows.new_zeros(size * bonds).index_add_(0, index, rows.new_ones(len(index)))
    s = rows.new_zeros(size * bonds, hidden).index_add_(0, index, rows)
    return s.view(size, bonds * hidden), deg.view(size, bonds), index
