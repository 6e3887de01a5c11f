"""``route``: every slot of a top-``k`` routing recorded in one call (see :func:`route`),
its common case in C where built (``_fastrec_map.h``)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from edbatch.api._bulk import Handles, Routed, switch, switch_cells
from edbatch.api._handles import Cell, Handle, _fastrec
from edbatch.errors import GraphError

__all__ = ["route"]

#: ``route``'s common case in C (``None``: not built, or the Python path asked for, as the
#: tests compare them), recording what the Python path of :func:`route` records.
_fast_route: Any = getattr(_fastrec, "route", None)


def route(cells: Sequence[Cell], top: Sequence[Sequence[int]], *operands: Sequence[Handle]
          ) -> list[Handles]:
    """Every slot of a top-``k`` routing in one call: ``top[i]`` holds node row ``i``'s
    ``k`` cell indices (what ``yield topk(...)`` hands back); returns ``k`` blocks, node ``i``
    of block ``j`` running ``cells[top[i][j]]`` on ``operands[0][i], ...``. Records exactly
    what ``[switch(cells, slot, *operands) for slot in zip(*top)]`` records (the same nodes
    in the same order), with one list extension per column for all slots and no tuple per
    slot made by the caller; operands other than :class:`Handles` blocks take that path.

    Raises:
        GraphError: rows of different lengths, or a choice outside ``0..len(cells)-1``.
    """
    n = len(top)
    if not n or not cells:
        return [switch(cells, slot, *operands) for slot in zip(*top, strict=True)]
    if _fast_route is not None and type(top) is list:  # the common case in C
        got = _route_c(cells, top, operands)
        if got is not None:
            return got
    try:
        slots = list(zip(*top, strict=True))
    except ValueError:
        raise GraphError(f"route: rows of top have different lengths (the first "
                         f"{len(top[0])}); give every node the same number of choices") from None
    first = cells[0]
    batch = first.batch
    rec, known = batch._rec, batch._switches.get(id(cells))
    if known is None or known[0] != cells:
        known = switch_cells(cells)
    shapes = first.in_shapes
    if known is None or len(operands) != len(shapes):
        return [switch(cells, slot, *operands) for slot in slots]  # (its errors too)
    ids: list[int] = []
    for slot, want in zip(operands, shapes):
        if type(slot) is not Handles or slot.rec is not rec or slot.n != n or slot.shape != want:
            return [switch(cells, slot, *operands) for slot in slots]
        ids.append(slot.first)
    kinds, op_ids = known[1], known[2]
    try:  # (the op id table is a dict: a choice outside it raises; one C call per slot)
        new = [itemgetter(*slot)(op_ids) for slot in slots] if n > 1 else \
            [(op_ids[slot[0]],) for slot in slots]
    except (KeyError, TypeError):
        bad = next(c for slot in slots for c in slot if c not in op_ids)
        raise GraphError(f"route: choice {bad!r} is not a cell index 0..{len(cells) - 1}; "
                         f"pass one cell per choice value") from None
    start, ops, shape = len(rec.ops), rec.ops, first.op.out_shape
    blocks, firsts = rec.blocks, rec.block_firsts
    out = []
    at = start
    for ops_j, slot in zip(new, slots, strict=True):  # what switch() records, slot by slot
        ops.extend(ops_j)
        if ids:
            blocks.extend((len(rec.operands), at, n, len(firsts)))
            firsts.extend(ids)
        out.append(Handles(rec, at, n, Routed(kinds, slot), shape))
        at += n
    rec.attrs.extend([-1] * (n * len(slots)))
    return out


def _route_c(cells: Sequence[Cell], top: list[Any], operands: tuple[Any, ...]
             ) -> list[Handles] | None:
    """:func:`route` recorded by :data:`_fast_route` (``None``: not its common case, nothing
    recorded)."""
    first = cells[0]
    batch = first.batch
    known = batch._switches.get(id(cells))
    if known is None or known[0] != cells:
        known = switch_cells(cells)
    if known is None:
        return None
    return _fast_route(batch._rec, top, operands, first.in_shapes, known[3],  # type: ignore[no-any-return]
                       known[1], first.op.out_shape)
