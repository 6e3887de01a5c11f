"""Bulk recording: :class:`Handles` (consecutive nodes of one row shape), ``cell.map`` and
:func:`switch` (routed bulk calls; every slot of a top-``k`` at once:
:mod:`edbatch.api._route`), recorded with one list extension per column instead of one call
per node, and operands that are :class:`Handles` blocks as one block record
(no int per operand; :func:`operand_array` makes them an array per segment). See
docs/api.md and ``examples/moe_routing.py``."""

from __future__ import annotations

import array
import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from edbatch.api._bulk_scan import block_operands
from edbatch.api._handles import Cell, Handle, Kind, Recording, _fastrec, fresh_handle
from edbatch.errors import GraphError

__all__ = ["Handles", "Routed", "add_losses", "cell_map", "int_array", "int_list", "interleave",
           "node_ids", "operand_array", "switch", "switch_cells", "with_blocks"]


class Handles(Sequence[Handle]):
    """Consecutive nodes ``first .. first + n - 1`` of one row shape, as :meth:`Cell.map`
    and :func:`~edbatch.api.switch` return them: a sequence of handles made on access
    (``kinds``: one :class:`Kind` for all, or one per node). Passed whole to ``map``,
    ``switch`` or a program's ``yield``, it is checked once and its node ids are a range:
    no per-node Python."""

    __slots__ = ("first", "kinds", "n", "rec", "shape")

    def __init__(self, rec: Recording, first: int, n: int, kinds: Kind | Sequence[Kind],
                 shape: tuple[int, ...]) -> None:
        self.rec, self.first, self.n, self.kinds, self.shape = rec, first, n, kinds, shape

    @property
    def ids(self) -> range:
        """The node ids."""
        return range(self.first, self.first + self.n)

    def __len__(self) -> int:
        return self.n

    def _one(self, i: int) -> Handle:
        # a fresh handle, not the pool's: the pool may serve a later mini-batch by now
        kinds = self.kinds
        h = fresh_handle(self.first + i)
        h._rec = self.rec
        h._kind = kinds if type(kinds) is Kind else kinds[i]
        return h

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._one(i) for i in range(*index.indices(self.n))]
        i = index + self.n if index < 0 else index
        if not 0 <= i < self.n:
            raise IndexError(f"Handles index {index} out of range for {self.n} nodes")
        return self._one(i)

    def __iter__(self) -> Any:
        return (self._one(i) for i in range(self.n))

    def __repr__(self) -> str:
        return f"Handles(%{self.first}..%{self.first + self.n - 1}, shape={self.shape})"


def node_ids(slot: Sequence[Handle], rec: Recording, want: tuple[int, ...]
             ) -> range | list[int] | None:
    """The node ids of ``slot`` if every one is a handle of ``rec`` of shape ``want``
    (``None`` otherwise): one check for a :class:`Handles`."""
    if type(slot) is Handles:
        return slot.ids if slot.rec is rec and slot.shape == want else None
    if all(type(h) is Handle and h._rec is rec and h._kind.shape == want for h in slot):
        return [h.node_id for h in slot]
    return None


def interleave(ids: Sequence[Sequence[int]]) -> list[int]:
    """``[a0, b0, ..., a1, b1, ...]`` of equally long id lists (node-major operand order):
    one strided slice assignment per list (C loops, no Python per node)."""
    if len(ids) == 1:
        return list(ids[0])
    s = len(ids)
    out = [0] * (len(ids[0]) * s)
    for j, slot in enumerate(ids):
        out[j::s] = slot
    return out


def int_list(values: Sequence[int], what: str = "attrs") -> list[int]:
    """``values`` (ints, or a numpy integer array) as a list of Python ints."""
    if type(values) is np.ndarray:
        if values.dtype.kind not in "iu":
            raise GraphError(f"{what} must be integers, got an array of {values.dtype}; "
                             f"convert it with .astype(int)")
        return values.tolist()  # type: ignore[no-any-return]
    return list(map(int, values))


def int_array(values: list[int], start: int, stop: int, code: str) -> np.ndarray:  # type: ignore[type-arg]
    """``values[start:stop]`` (Python ints) as a writable ``int64`` (``code`` ``"q"``) or
    ``int32`` (``"i"``) array: packed in C where built (``_fastrec.pack``: about 0.3x the
    time of ``np.fromiter`` on a MoE segment's attrs), else (an entry not an exact int in
    range, or no C module) through ``np.fromiter`` on the slice (about 0.75x the time of
    ``array.array`` and half ``np.array``'s), the twin the tests compare with."""
    part = values if start == 0 and stop == len(values) else values[start:stop]
    dtype = np.int64 if code == "q" else np.int32
    if _pack is not None and type(part) is list:
        packed = _pack(part, 8 if code == "q" else 4, _EMPTY)
        if packed is not None:
            return np.frombuffer(packed, dtype).copy()
    return np.fromiter(part, dtype, len(part))


#: ``_fastrec.pack`` (``None``: not built, or pure recording asked for); :func:`int_array`
#: packs through it.
_pack: Any = getattr(_fastrec, "pack", None)
_EMPTY: list[int] = []


def cell_map(self: Any, *operands: Sequence[Handle], attrs: Sequence[int] | None = None
             ) -> Handles:
    """``cell.map(...)``: bulk calls of the cell ``self`` (a
    :class:`~edbatch.api._handles.CellImpl`): node ``i`` runs the cell on ``operands[0][i],
    operands[1][i], ...`` (with ``attrs[i]``); one sequence per operand slot, all of one
    length. Recorded with one list extension per slot instead of a call per node (a
    :class:`Handles` operand is checked once); any check that fails falls back to the
    calls one by one (and their errors). Returns the new nodes as :class:`Handles`."""
    n = len(attrs) if attrs is not None else len(operands[0]) if operands else 0
    kind, rec = self.kind, self.batch._rec
    ok = kind is not None and (attrs is None) is not self.takes_attr and \
        len(operands) == len(self.in_shapes)
    ids: list[Any] = []  # per slot: its first node (a Handles block) or its node ids
    blocks = True  # every slot a Handles block
    if ok:
        for slot, want in zip(operands, self.in_shapes):
            if type(slot) is Handles and slot.rec is rec and slot.n == n and \
                    slot.shape == want:  # (one check for the block)
                ids.append(slot.first)
                continue
            got = node_ids(slot, rec, want) if len(slot) == n else None
            if got is None:
                ok = False
                break
            ids.append(got)
            blocks = False
    if not ok:
        hs = [self.checked([o[i] for o in operands], None if attrs is None else attrs[i])
              for i in range(n)]
        return Handles(rec, hs[0].node_id if hs else len(rec.ops), n,
                       self.kind or self.batch._kinds[self.op.name], self.op.out_shape)
    assert kind is not None
    if attrs is None:
        attr_list: Any = [-1] * n
    elif type(attrs) is list or type(attrs) is tuple:
        try:  # ints (or with ``__index__``) in int64, checked in C: kept as they are
            array.array("q", attrs)
            attr_list = attrs
        except (TypeError, OverflowError):
            attr_list = list(map(int, attrs))  # (may raise: before appending)
    else:
        attr_list = int_list(attrs)
    first = len(rec.ops)
    rec.ops.extend([kind.op_id] * n)
    if ids and n and blocks:  # one block record (the inline :func:`_operands`)
        rec.blocks.extend((len(rec.operands), first, n, len(rec.block_firsts)))
        rec.block_firsts.extend(ids)
    elif ids and n:
        _operands(rec, first, n, ids)
    rec.attrs.extend(attr_list)
    return Handles(rec, first, n, kind, kind.shape)


def _operands(rec: Recording, first: int, n: int, ids: list[Any]) -> None:
    """Record the operands of nodes ``first .. first + n - 1``: one block (no int per
    operand) when every slot is a :class:`Handles` block (``ids``: their first nodes),
    else node-major into ``rec.operands``."""
    for got in ids:
        if type(got) is not int:
            rec.operands.extend(interleave([range(i, i + n) if type(i) is int else i
                                            for i in ids]))
            return
    rec.blocks.extend((len(rec.operands), first, n, len(rec.block_firsts)))
    rec.block_firsts.extend(ids)


def operand_array(rec: Recording, op_start: int, node_start: int
                  ) -> np.ndarray:  # type: ignore[type-arg]
    """The operands of nodes ``node_start..`` of ``rec`` in node order (``int64``): those
    listed from position ``op_start`` of ``rec.operands`` merged with its blocks'
    (:class:`~edbatch.api._handles.Recording`): the blocks expanded in one compiled pass
    (:func:`~edbatch.api._bulk_scan.block_operands`), merged in a few array operations."""
    listed = int_array(rec.operands, op_start, len(rec.operands), "q")
    blocks = rec.blocks  # 4 ints per block
    if not blocks or blocks[-3] < node_start:
        return listed
    lo = 4 * bisect.bisect_left(range(len(blocks) // 4), node_start,
                                key=lambda i: blocks[4 * i + 1])
    b = int_array(blocks, lo, len(blocks), "q").reshape(-1, 4)
    off0 = int(b[0, 3])
    firsts = int_array(rec.block_firsts, off0, len(rec.block_firsts), "q")
    values, cnt = block_operands(b, firsts, off0)
    total = len(values)
    if not len(listed):
        return values
    out = np.empty(len(listed) + total, np.int64)
    at = np.repeat(b[:, 0] - op_start, cnt) + np.arange(total)  # blocks keep their order
    out[at] = values
    keep = np.ones(len(out), bool)
    keep[at] = False
    out[keep] = listed
    return out


class Routed(Sequence[Kind]):
    """The kinds of a :func:`switch` block, ``table[choices[i]]``, looked up on access
    (no list per call)."""

    __slots__ = ("choices", "table")

    def __init__(self, table: list[Kind], choices: Sequence[int]) -> None:
        self.table, self.choices = table, choices

    def __len__(self) -> int:
        return len(self.choices)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.table[c] for c in self.choices[i]]
        return self.table[self.choices[i]]

    def __iter__(self) -> Any:
        return map(self.table.__getitem__, self.choices)


def switch_cells(cells: Sequence[Cell]
                 ) -> tuple[Any, list[Kind], dict[int, int], tuple[int, ...]] | None:
    """``(cells copy, kinds, op id by cell index, op ids as a tuple)`` of ``cells`` if they
    can be recorded in bulk (same operand and output shapes and batch, no attr), else
    ``None``; remembered per cell list on their batch (by ``id``, checked against a copy: a
    cell function's kind, shapes and batch never change), so the memo lives and goes with
    the batch."""
    first = cells[0]
    memo = first.batch._switches
    hit = memo.get(id(cells))
    if hit is not None and hit[0] == cells:
        return hit  # type: ignore[no-any-return]
    if not all(getattr(c, "kind", None) is not None and not c.takes_attr and
               c.in_shapes == first.in_shapes and c.op.out_shape == first.op.out_shape and
               c.batch is first.batch for c in cells):
        return None
    kinds = [c.kind for c in cells]
    if len(memo) >= 256:
        memo.clear()
    hit = memo[id(cells)] = (type(cells)(cells) if isinstance(cells, (list, tuple))
                             else tuple(cells), kinds, {i: k.op_id for i, k in enumerate(kinds)},
                             tuple(k.op_id for k in kinds))
    return hit


def _choices(cells: Sequence[Cell], choices: Sequence[int]) -> tuple[int, ...]:
    """``choices`` as a tuple (kept by a block's kinds: not the caller's list), checked.

    Raises:
        GraphError: a choice outside ``0..len(cells)-1`` (or no cells).
    """
    if type(choices) is np.ndarray:
        choices = int_list(choices, "switch: choices")
    choices = tuple(choices)
    if not cells or (choices and (min(choices) < 0 or max(choices) >= len(cells))):
        bad = [c for c in choices if not 0 <= c < len(cells)]
        raise GraphError(f"switch: choice {bad[0] if bad else '(none)'} is not a cell index "
                         f"0..{len(cells) - 1}; pass one cell per choice value")
    return choices


def with_blocks(rec: Recording, op_ids: np.ndarray, attr: np.ndarray, loss_op: int  # type: ignore[type-arg]
                ) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    """``(op_ids, operand ids, attrs)`` of a whole recording with bulk blocks (for
    :func:`~edbatch.api._assemble.assemble_graph`), the loss sum appended if any."""
    flat = operand_array(rec, 0, 0).astype(np.int32)
    if rec.losses:
        op_ids = np.append(op_ids, np.int32(loss_op))
        flat = np.concatenate([flat, np.fromiter(rec.losses, np.int32, len(rec.losses))])
        attr = np.append(attr, np.int64(-1))
    return op_ids, flat, attr


def switch(cells: Sequence[Cell], choices: Sequence[int], *operands: Sequence[Handle]
           ) -> Handles:
    """Routed bulk call: node ``i`` runs ``cells[choices[i]]`` on ``operands[0][i], ...``
    (e.g. the expert a gate chose for token ``i``, read from a value). The cells take the
    same operand shapes and no attr; the nodes are recorded with one list extension per
    column (a :class:`Handles` operand as one block). Any check that fails falls back to
    the calls one by one (their errors).

    Raises:
        GraphError: a choice outside ``0..len(cells)-1``, or lists of different lengths.
    """
    n = len(choices)
    if type(choices) is not tuple or not cells or \
            (n and (min(choices) < 0 or max(choices) >= len(cells))):
        choices = _choices(cells, choices)
    first = cells[0]
    batch, shapes = first.batch, first.in_shapes
    rec, known = batch._rec, batch._switches.get(id(cells))  # (the memo's hit inline)
    if known is None or known[0] != cells:
        known = switch_cells(cells)
    if len(operands) != len(shapes):
        known = None
    ids: list[Any] = []
    blocks = True  # every slot a Handles block
    for slot, want in zip(operands, shapes):
        if type(slot) is Handles and slot.rec is rec and slot.n == n and slot.shape == want:
            ids.append(slot.first)
            continue
        got = node_ids(slot, rec, want) if len(slot) == n else None
        if got is None:
            known = None
            break
        ids.append(got)
        blocks = False
    if known is None:
        if any(len(o) != n for o in operands):
            raise GraphError(f"switch: {n} choices but operand lists of lengths "
                             f"{[len(o) for o in operands]}; pass one of each per node")
        hs = [cells[c](*(o[i] for o in operands)) for i, c in enumerate(choices)]
        return Handles(rec, hs[0].node_id if hs else len(rec.ops), n,
                       [h._kind for h in hs], first.op.out_shape)
    kinds, op_ids = known[1], known[2]
    start = len(rec.ops)
    rec.ops.extend(map(op_ids.__getitem__, choices))
    if not ids or not n:
        pass
    elif blocks:
        rec.blocks.extend((len(rec.operands), start, n, len(rec.block_firsts)))
        rec.block_firsts.extend(ids)
    else:
        _operands(rec, start, n, ids)
    rec.attrs.extend([-1] * n)
    return Handles(rec, start, n, Routed(kinds, choices), first.op.out_shape)


def add_losses(batch: Any, handles: Handles) -> None:
    """``batch.add_loss(handles)``: every node of ``handles`` (one number per row, of the
    batch's current recording) a loss term, added with one list extension.

    Raises:
        GraphError: ``handles`` are of another recording or not one number per row.
    """
    rec = batch._rec
    if handles.rec is not rec:
        raise GraphError(f"add_loss: {handles!r} are nodes of another mini-batch (or batch); "
                         f"record the loss in this one")
    kinds = handles.kinds
    if not (kinds.scalar if type(kinds) is Kind else  # (one kind: no generator)
            all(k.scalar for k in (kinds.table if type(kinds) is Routed else set(kinds)))):
        raise GraphError(f"add_loss: {handles!r} are not one number per row; declare the "
                         f"loss cell with out_shape=() and reduce per row")
    rec.losses.extend(handles.ids)
