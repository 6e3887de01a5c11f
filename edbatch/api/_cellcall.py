"""The functions :meth:`DynamicBatch.cell <edbatch.api.DynamicBatch.cell>` returns: a cell's
recording hot path.

A registered cell (:class:`~edbatch.api._handles.CellImpl`,
:class:`~edbatch.api._variadic.VariadicCell`) keeps its module, op type and kernel; what the
user calls per node is a plain function made here, as for built-in ops
(:mod:`edbatch.api._builtins`): on CPython 3.11 a call with ``attr=`` passes the keyword to a
function without building a dict, where an object's ``__call__`` builds one (about 0.7 us
of the 1.6 us a node cost through ``Cell.__call__``). The function checks the common case
inline (operands handles of the current recording whose row shapes are the registered ones,
the attr an ``int`` exactly when the cell takes one) and records the node; anything else goes
to the cell's fully checked path, which raises the usual errors.

Row shapes are compared by identity: every :class:`~edbatch.api._handles.Kind` and cell
shape is interned (:func:`~edbatch.api._handles.intern_shape`), so equal shapes are the same
tuple; a shape that is equal but not interned only takes the checked path.
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from edbatch.api._bulk import Handles, cell_map
from edbatch.api._fast import ATTR_COUNT, ATTR_INT, ATTR_NONE, map_call, name_call, op_call
from edbatch.api._handles import Handle, grow_pool, intern_shape
from edbatch.api._result import dtype_hint
from edbatch.api._variadic import VariadicCell
from edbatch.errors import GraphError

__all__ = ["cell_function", "map_function", "probe", "user_function", "variadic_function"]

_NO: Any = type("_Missing", (), {"_rec": None})()  # a missing operand (never a recording)


def _given(*operands: Any) -> tuple[Any, ...]:
    return tuple(h for h in operands if h is not _NO)


class _Cell:
    """What a cell's function closes over (read once when it is made)."""

    def __init__(self, cell: Any, batch: Any) -> None:
        self.kind, self.pool, self.slow = cell.kind, batch._pool, cell.checked
        self.op_id = cell.kind.op_id
        self.shapes = tuple(intern_shape(tuple(s)) for s in cell.in_shapes)
        self.attr_type = int if cell.takes_attr else type(None)


def cell_function(cell: Any, batch: Any) -> Callable[..., Handle]:
    """The per-node function of the fixed-arity cell ``cell`` (registered in ``batch``).

    The handle is taken from the pool before anything is appended: a pool too short raises
    ``IndexError`` there, the pool grows and the checked path records the node.
    """
    c = _Cell(cell, batch)
    make = {0: _call0, 1: _call1, 2: _call2}.get(len(c.shapes), _call_n)
    return make(c, batch)


def _call0(c: _Cell, batch: Any) -> Callable[..., Handle]:
    kind, pool, slow, op_id, attr_type = c.kind, c.pool, c.slow, c.op_id, c.attr_type

    def call0(*more: Handle, attr: int | None = None) -> Handle:
        rec = batch._rec
        try:
            if not more and type(attr) is attr_type:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                rec.attrs.append(-1 if attr is None else attr)
                h._rec = rec
                h._kind = kind
                return h
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(more, attr)
    return call0


def _call1(c: _Cell, batch: Any) -> Callable[..., Handle]:
    kind, pool, slow, op_id, attr_type = c.kind, c.pool, c.slow, c.op_id, c.attr_type
    s0 = c.shapes[0]

    def call1(a: Handle = _NO, *more: Handle, attr: int | None = None) -> Handle:
        rec = batch._rec
        try:
            if a._rec is rec and a._kind.shape is s0 and not more and \
                    type(attr) is attr_type:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                rec.operands.append(a.node_id)
                rec.attrs.append(-1 if attr is None else attr)
                h._rec = rec
                h._kind = kind
                return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow((*_given(a), *more), attr)
    return call1


def _call2(c: _Cell, batch: Any) -> Callable[..., Handle]:
    kind, pool, slow, op_id, attr_type = c.kind, c.pool, c.slow, c.op_id, c.attr_type
    s0, s1 = c.shapes

    def call2(a: Handle = _NO, b: Handle = _NO, *more: Handle,
              attr: int | None = None) -> Handle:
        rec = batch._rec
        try:
            if a._rec is rec and b._rec is rec and a._kind.shape is s0 and \
                    b._kind.shape is s1 and not more and type(attr) is attr_type:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                flat = rec.operands
                flat.append(a.node_id)
                flat.append(b.node_id)
                rec.attrs.append(-1 if attr is None else attr)
                h._rec = rec
                h._kind = kind
                return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow((*_given(a, b), *more), attr)
    return call2


def _call_n(c: _Cell, batch: Any) -> Callable[..., Handle]:
    kind, pool, slow, op_id, attr_type = c.kind, c.pool, c.slow, c.op_id, c.attr_type
    shapes = c.shapes

    def call_n(*operands: Handle, attr: int | None = None) -> Handle:
        rec = batch._rec
        try:
            if len(operands) == len(shapes) and type(attr) is attr_type:
                for h, want in zip(operands, shapes):
                    if h._rec is not rec or h._kind.shape is not want:
                        break
                else:
                    ops = rec.ops
                    node = len(ops)
                    h = pool[node]
                    ops.append(op_id)
                    rec.operands.extend([h.node_id for h in operands])
                    rec.attrs.append(-1 if attr is None else attr)
                    h._rec = rec
                    h._kind = kind
                    return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(operands, attr)
    return call_n


def variadic_function(cell: Any, batch: Any) -> Callable[..., Handle]:
    """The per-node function of the variadic cell ``cell`` (registered in ``batch``).

    With no or one fixed operand (a child-sum node: ``cell(x, *children)``) the fixed one is
    a named parameter; the repeated ones are checked and their ids appended in one loop
    (taken back if one fails). The node's pooled handle is taken before anything is
    appended, as in the fixed-arity functions.
    """
    kind, pool, slow = cell.kind, batch._pool, cell.checked
    op_id = kind.op_id
    fixed, each = tuple(intern_shape(s) for s in cell.fixed), intern_shape(cell.each)
    nfixed = len(fixed)
    if nfixed == 0:
        return _variadic0(kind, pool, slow, op_id, each, batch)
    if nfixed == 1:
        return _variadic1(kind, pool, slow, op_id, fixed[0], each, batch)

    def call(*operands: Handle) -> Handle:
        rec = batch._rec
        flat, start = None, 0
        try:
            if len(operands) >= nfixed:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                flat = rec.operands
                start = len(flat)
                for slot, o in enumerate(operands):
                    if o._rec is not rec or o._kind.shape is not (
                            fixed[slot] if slot < nfixed else each):
                        break
                    flat.append(o.node_id)
                else:
                    ops.append(op_id)
                    rec.counts.append(len(operands))
                    rec.attrs.append(len(operands) - nfixed)
                    h._rec = rec
                    h._kind = kind
                    return h
        except IndexError:
            grow_pool(pool, len(rec.ops))
        except Exception:  # (not a handle: the checked path names it)
            pass
        if flat is not None:
            del flat[start:]
        return slow(operands)

    return call


def _variadic0(kind: Any, pool: list[Handle], slow: Callable[..., Handle], op_id: int,
               each: tuple[int, ...], batch: Any) -> Callable[..., Handle]:
    def call0(*rest: Handle) -> Handle:
        rec = batch._rec
        flat, start = None, 0
        try:
            ops = rec.ops
            node = len(ops)
            h = pool[node]
            flat = rec.operands
            start = len(flat)
            for o in rest:
                if o._rec is not rec or o._kind.shape is not each:
                    break
                flat.append(o.node_id)
            else:
                ops.append(op_id)
                k = len(rest)
                rec.counts.append(k)
                rec.attrs.append(k)
                h._rec = rec
                h._kind = kind
                return h
        except IndexError:
            grow_pool(pool, len(rec.ops))
        except Exception:  # (not a handle: the checked path names it)
            pass
        if flat is not None:
            del flat[start:]
        return slow(rest)
    return call0


def _variadic1(kind: Any, pool: list[Handle], slow: Callable[..., Handle], op_id: int,
               f0: tuple[int, ...], each: tuple[int, ...], batch: Any
               ) -> Callable[..., Handle]:
    def call1(x: Handle = _NO, *rest: Handle) -> Handle:
        rec = batch._rec
        flat, start = None, 0
        try:
            if x._rec is rec and x._kind.shape is f0:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                flat = rec.operands
                start = len(flat)
                flat.append(x.node_id)
                for o in rest:
                    if o._rec is not rec or o._kind.shape is not each:
                        break
                    flat.append(o.node_id)
                else:
                    ops.append(op_id)
                    k = len(rest)
                    rec.counts.append(k + 1)
                    rec.attrs.append(k)
                    h._rec = rec
                    h._kind = kind
                    return h
        except IndexError:
            grow_pool(pool, len(rec.ops))
        except Exception:  # (not a handle: the checked path names it)
            pass
        if flat is not None:
            del flat[start:]
        return slow((*_given(x), *rest))
    return call1


def user_function(cell: Any, batch: Any) -> Callable[..., Handle]:
    """The function :meth:`DynamicBatch.cell <edbatch.api.DynamicBatch.cell>` returns for
    the registered ``cell`` (a :class:`~edbatch.api.Cell`: its attributes say what it is)."""
    call: Any
    if isinstance(cell, VariadicCell):
        call = op_call(batch, cell.kind, variadic_function(cell, batch),
                       [intern_shape(s) for s in cell.fixed], ATTR_COUNT, intern_shape(cell.each))
        call.fixed, call.each = cell.fixed, cell.each
    else:
        call = op_call(batch, cell.kind, cell_function(cell, batch), cell.in_shapes,
                       ATTR_INT if cell.takes_attr else ATTR_NONE)
        call.in_shapes, call.takes_attr = cell.in_shapes, cell.takes_attr
        # bulk (Cell.map, api.switch): the common case in C where built
        call.kind, call.map = cell.kind, map_call(batch, cell, map_function(cell))
    call.cell, call.op, call.batch, call.name, call.module = (cell, cell.op, batch, cell.name,
                                                              cell.module)
    name_call(call, cell.name, f"Add one node of cell {cell.name!r} (a :class:`Cell`).")
    return call  # type: ignore[no-any-return]


def map_function(cell: Any) -> Callable[..., Handles]:
    """``cell.map`` of the fixed-arity cell ``cell``: the common case inline (every operand
    a :class:`~edbatch.api._bulk.Handles` block of the current recording, of the cell's
    row shape and the attrs' length, and attrs a list or tuple of ints exactly when the
    cell takes them), recorded as :func:`~edbatch.api._bulk.cell_map` records it; anything
    else goes to :func:`~edbatch.api._bulk.cell_map` (its checks and errors). A closure
    over the cell's kind and shapes: no ``partial`` and no attribute reads per call."""
    batch, kind, takes_attr = cell.batch, cell.kind, cell.takes_attr
    op_id, shape, shapes = kind.op_id, kind.shape, cell.in_shapes
    general = partial(cell_map, cell)
    check = array.array

    def map_call(*operands: Any, attrs: Any = None) -> Handles:
        rec = batch._rec
        if attrs is None:
            if takes_attr or not operands:
                return general(*operands, attrs=attrs)
            n = len(operands[0])
        else:
            if not takes_attr or (type(attrs) is not list and type(attrs) is not tuple):
                return general(*operands, attrs=attrs)
            n = len(attrs)
        if len(operands) != len(shapes):
            return general(*operands, attrs=attrs)
        firsts = []
        for slot, want in zip(operands, shapes):
            if type(slot) is not Handles or slot.rec is not rec or slot.n != n or \
                    slot.shape != want:
                return general(*operands, attrs=attrs)
            firsts.append(slot.first)
        if attrs is not None:
            try:  # ints (or with ``__index__``) in int64, checked in C
                check("q", attrs)
            except (TypeError, OverflowError):
                return general(*operands, attrs=attrs)
        ops = rec.ops
        first = len(ops)
        ops.extend([op_id] * n)
        if firsts and n:  # one block record (no int per operand)
            rec.blocks.extend((len(rec.operands), first, n, len(rec.block_firsts)))
            rec.block_firsts.extend(firsts)
        rec.attrs.extend([-1] * n if attrs is None else attrs)
        return Handles(rec, first, n, kind, shape)
    return map_call


def probe(cell: Any, device: torch.device, dtype: torch.dtype) -> None:
    """Run ``cell``'s module once on a zero batch of one row (eval mode, no grad).

    Raises:
        GraphError: the module raised or returned the wrong shape (names the cell, got and
            expected, and a dtype hint where it fits).
    """
    shapes = cell.probe_shapes if isinstance(cell, VariadicCell) else cell.op.in_shapes or ()
    module, training = cell.module, getattr(cell.module, "training", False)
    if isinstance(module, nn.Module):
        module.eval()  # e.g. batch norm cannot run on one row in training mode
    try:
        with torch.no_grad():
            if isinstance(cell, VariadicCell):
                cell.probe(device, dtype)
            else:
                cell.forward_rows([torch.zeros(1, math.prod(s), device=device, dtype=dtype)
                                   for s in shapes],
                                  torch.zeros(1, dtype=torch.int64, device=device))
    except GraphError:
        raise
    except Exception as e:
        hint = dtype_hint([cell], dtype) or (
            f" The batch computes in {dtype}: for another dtype create it with "
            f"DynamicBatch(dtype=...)." if "dtype" in str(e) or "Double" in str(e) else "")
        raise GraphError(f"cell {cell.name!r}: module {type(module).__name__} raised "
                         f"{type(e).__name__}: {e} on a probe batch of zeros with input "
                         f"shapes {[(1, *s) for s in shapes]}; check in_shapes and the "
                         f"module.{hint}") from e
    finally:
        if isinstance(module, nn.Module):
            module.train(training)
