"""The shape rules of declared cell-kind parameters (:class:`~edbatch.executor.cell_kind.Param`).

A rule is comma-separated dimensions, each an integer expression (``+ - * //``, integers,
a leading coefficient as in ``4H``) over symbols: those the kind's ``dims(op)`` gives, and
any bare unknown symbol, bound by its first use (``"V, D"``). Checked once per op type,
when a kernel first binds it: a swapped pair of parameters fails here with both names.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from edbatch.errors import GraphError
from edbatch.graph import OpType

__all__ = ["check_shapes"]


def check_shapes(cell: Any, op: OpType, names: Any, params: Mapping[str, Tensor]) -> None:
    """Every declared shape rule against the given tensors (unknown tensors: skipped)."""
    env = dict(cell.dims(op))
    rules = [(q, [d.strip() for d in q.shape.split(",")]) for q in cell.params if q.shape]
    todo = []
    for q, dims in rules:  # bare unknown symbols first: bound by their first use
        t = params.get(getattr(names, q.name))
        if t is None:
            continue
        if len(dims) != t.dim():
            _shape_error(cell, op, q, getattr(names, q.name), tuple(t.shape), q.shape)
        for d, size in zip(dims, t.shape, strict=True):
            if d.isidentifier() and d not in env:
                env[d] = int(size)
        todo.append((q, dims, t))
    for q, dims, t in todo:
        want = tuple(_eval(d, env, cell) for d in dims)
        if want != tuple(t.shape):
            _shape_error(cell, op, q, getattr(names, q.name), tuple(t.shape),
                         f"({q.shape}) = {want}")


def _shape_error(cell: Any, op: OpType, q: Any, full: str, got: tuple[int, ...],
                 want: str) -> None:
    raise GraphError(f"op type {op.name!r} (kind {op.kind!r}): parameter {q.name!r} "
                     f"({full!r}) has shape {got}, but cell kind {cell.__name__} declares "
                     f"{want}; check the op type's parameter order and the workload's shapes")


def _eval(expr: str, env: Mapping[str, int], cell: Any) -> int:
    """An integer shape expression (``+ - * //``, integers and symbols of ``env``)."""
    return _ev(ast.parse(_implicit_mult(expr), mode="eval").body, expr, env, cell)


def _ev(node: ast.AST, expr: str, env: Mapping[str, int], cell: Any) -> int:
    """:func:`_eval` of one node (a module function: a nested recursive one would be a
    reference cycle left to the garbage collector on every call)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _ev(node.left, expr, env, cell), _ev(node.right, expr, env, cell)
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b,
               ast.FloorDiv: a // b if b else 0}
        if type(node.op) in ops:
            return ops[type(node.op)]
    raise TypeError(f"cell kind {cell.__name__}: shape {expr!r}: cannot evaluate "
                    f"{ast.unparse(node)!r} (symbols: {sorted(env)})")


def _implicit_mult(expr: str) -> str:
    """``"4H"`` -> ``"4*H"`` (a leading coefficient), elsewhere unchanged."""
    out, i = [], 0
    while i < len(expr):
        c = expr[i]
        out.append(c)
        if c.isdigit() and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] == "_")):
            j = i + 1
            while j < len(expr) and expr[j].isdigit():
                out.append(expr[j])
                j += 1
            if j < len(expr) and (expr[j].isalpha() or expr[j] == "_"):
                out.append("*")
            i = j
            continue
        i += 1
    return "".join(out)
