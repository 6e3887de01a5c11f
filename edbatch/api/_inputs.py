"""Constant rows as nodes of the user API: :meth:`DynamicBatch.input
<edbatch.api.DynamicBatch.input>` (one row), :meth:`~edbatch.api.DynamicBatch.inputs` (a
block of rows, one autograd node for the block) and their op types ``input/<shape>`` (a
lookup into the stacked rows, registered on first use; ``run_programs`` adds ``value/``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from edbatch.api._handles import Handle, new_handle
from edbatch.errors import GraphError
from edbatch.graph import OpType

__all__ = ["add_input", "add_inputs", "input_op"]

#: A :class:`~edbatch.api.DynamicBatch` (typed loosely: it imports this module).
Batch = Any


def add_input(batch: Batch, row: Tensor) -> Handle:
    """:meth:`DynamicBatch.input <edbatch.api.DynamicBatch.input>`: a node holding ``row``."""
    shape = tuple(row.shape)
    if not shape or not all(shape):
        raise GraphError(f"input rows need a non-empty shape, got {shape}; reshape "
                         f"scalars to (1,)")
    op = input_op(batch, shape)
    rec = batch._rec
    have = rec.nrows.get(op.name, 0)
    rec.rows.setdefault(op.name, []).append(row.reshape(1, -1))
    rec.nrows[op.name] = have + 1
    return batch._add(op, [], have)  # type: ignore[no-any-return]


def add_inputs(batch: Batch, rows: Tensor) -> list[Handle]:
    """:meth:`DynamicBatch.inputs <edbatch.api.DynamicBatch.inputs>`: one node per row."""
    if rows.dim() < 2 or not all(rows.shape):
        raise GraphError(f"inputs() needs a tensor [k, *shape] with k >= 1 and a "
                         f"non-empty row shape, got {tuple(rows.shape)}; use input(row) "
                         f"for one row")
    op = input_op(batch, tuple(rows.shape[1:]))
    rec, kind, k = batch._rec, batch._kinds[op.name], rows.shape[0]
    have = rec.nrows.get(op.name, 0)
    rec.rows.setdefault(op.name, []).append(rows.reshape(k, -1))
    rec.nrows[op.name] = have + k
    first = len(rec.ops)
    rec.ops.extend([kind.op_id] * k)
    rec.attrs.extend(range(have, have + k))
    return [new_handle(rec, first + i, kind) for i in range(k)]


def input_op(batch: Batch, shape: tuple[int, ...], prefix: str = "input") -> OpType:
    """The op type ``<prefix>/<shape>`` of ``batch`` (registered on first use)."""
    name = f"{prefix}/" + "x".join(map(str, shape))
    kind = batch._kinds.get(name)
    if kind is not None:
        return kind.op  # type: ignore[no-any-return]
    op = OpType(name, "lookup", (), shape, (f"api.{name}",))
    batch._register(op)
    return op
