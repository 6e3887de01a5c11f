"""Constant rows as nodes of the user API: :meth:`DynamicBatch.input
<edbatch.api.DynamicBatch.input>` (one row), :meth:`~edbatch.api.DynamicBatch.inputs` (a
block of rows, one autograd node for the block) and their op types ``input/<shape>`` (a
lookup into the stacked rows, registered on first use; ``run_programs`` adds ``value/``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from edbatch.api._handles import Handle, new_handle
from edbatch.errors import GraphError, did_you_mean, is_integer
from edbatch.graph import OpType

__all__ = ["add_input", "add_inputs", "check_params", "input_op", "lookup_index",
           "output_handles"]

#: A :class:`~edbatch.api.DynamicBatch` (typed loosely: it imports this module).
Batch = Any


def _tensor(value: object, where: str) -> None:
    if not isinstance(value, Tensor):
        raise GraphError(f"{where} takes a torch.Tensor, got {type(value).__name__}; "
                         f"convert it first, e.g. torch.as_tensor(x, dtype=torch.float32)")


def lookup_index(cell: str, index: Any) -> int:
    """``batch.lookup``'s row ``index`` as an int: a Python or NumPy integer or a
    one-element integer tensor; a bool, float or string raises (``1.5`` would be cut)."""
    if isinstance(index, Tensor) and index.numel() == 1 and not index.is_floating_point() \
            and index.dtype != torch.bool:
        return int(index.item())
    if is_integer(index):
        return int(index)
    raise GraphError(f"cell {cell!r}: lookup index {index!r} ({type(index).__name__}) is not "
                     f"an integer row number; pass an int, e.g. vocab.get(word, 0)")


def output_handles(outputs: Any, check: Callable[[Handle, str], None]) -> list[int]:
    """``run(outputs=...)`` / ``graph(outputs=...)``'s node ids, each handle ``check``-ed
    (the batch's handle check); something that is no sequence (``outputs=5``) is a
    :class:`GraphError` (was a raw ``TypeError``); a lone handle raises the handle's own
    iteration error in ``tuple()``."""
    if not isinstance(outputs, Iterable) or isinstance(outputs, (str, bytes, Tensor)):
        raise GraphError(f"run(outputs=...) takes a list of handles, got "
                         f"{type(outputs).__name__}; pass e.g. outputs=[h]")
    for h in (outputs := tuple(outputs)):
        check(h, "run(outputs=...)")
    return [h.node_id for h in outputs]


def check_params(params: Any, ops: Iterable[OpType] = (),
                 own: Mapping[str, Tensor] | None = None,
                 dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """``run(params=...)``: a mapping of parameter names to tensors (``None``: none), each a
    parameter of one of ``ops`` (the batch's op types): an unknown name was ignored, so a
    misspelt override ran with the built-in tensor. Each has the shape of the batch's own
    tensor of that name (``own``, where it holds one) and the batch's ``dtype``: a
    transposed table was read as rows of the wrong length."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise GraphError(f"run(params=...) takes a dict of name -> torch.Tensor, got "
                         f"{type(params).__name__}")
    for name, value in params.items():
        if not isinstance(name, str) or not isinstance(value, Tensor):
            raise GraphError(f"run(params=...): entry {name!r} -> {type(value).__name__}; "
                             f"expected a str name -> torch.Tensor (e.g. a module's "
                             f"parameter)")
    known = sorted({name for op in ops for name in op.params if not name.startswith("api.")})
    for name in params:
        if name not in known:
            raise GraphError(f"run(params=...): {name!r} is no parameter of this batch's op "
                             f"types.{did_you_mean(name, known)} A user cell's parameters live "
                             f"in its module; params= replaces built-in op types' ones ("
                             + (f"{len(known)}, e.g. {known[:4]})" if known else "none here)"))
        value, like = params[name], (own or {}).get(name)
        if like is not None and value.shape != like.shape:
            raise GraphError(f"run(params=...): {name!r} has shape {tuple(value.shape)}, the "
                             f"batch's own {tuple(like.shape)}; pass a tensor of that shape")
        if dtype is not None and value.dtype != dtype:
            raise GraphError(f"run(params=...): {name!r} is {value.dtype}, the batch runs in "
                             f"{dtype} (DynamicBatch(dtype=...)); pass it as "
                             f"tensor.to({dtype})")
    return dict(params)


def add_input(batch: Batch, row: Tensor) -> Handle:
    """:meth:`DynamicBatch.input <edbatch.api.DynamicBatch.input>`: a node holding ``row``."""
    _tensor(row, "batch.input(row)")
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
    _tensor(rows, "batch.inputs(rows)")
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
