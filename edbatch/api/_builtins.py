"""Built-in op types in the user API (graph assembly: :mod:`edbatch.api._assemble`).

:meth:`DynamicBatch.from_workload <edbatch.api.DynamicBatch.from_workload>` registers a
workload's op types (its fused cells, whose kernels have hand-written backwards) in a
:class:`~edbatch.api.DynamicBatch` together with their parameters, so that per-instance
model code written against the public API does exactly the work of the workload's own graph
builder: same op types, same kernels, same parameters. :meth:`DynamicBatch.op
<edbatch.api.DynamicBatch.op>` returns a :class:`BuiltinOp` to call on handles.

Example:
    >>> import torch
    >>> from edbatch.api import DynamicBatch
    >>> from edbatch.executor import init_params
    >>> from edbatch.workloads import make_workload
    >>> wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=3)
    >>> batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    >>> leaf, internal, loss = (batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))
    >>> with batch.instance():
    ...     a, b = leaf(attr=1), leaf(attr=2)
    ...     for h in (a, b, internal(a, b)):
    ...         batch.add_loss(loss(h, attr=3))
    >>> out = batch.run("depth", grad=False)
    >>> out.graph.num_nodes, out.num_batches
    (7, 5)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from edbatch.api._fast import ATTR_ANY, name_call, op_call
from edbatch.api._handles import Handle, Recording, grow_pool
from edbatch.errors import GraphError, UnknownNameError, did_you_mean
from edbatch.executor import KERNELS
from edbatch.graph import OpType, Vocab

__all__ = ["BuiltinOp", "builtin_op", "register_workload"]

#: A :class:`~edbatch.api.DynamicBatch` (typed loosely: this module is imported by it).
Batch = Any

LOSS_SUM = "loss_sum"  # the API appends its own loss sum (the same op type as workloads')


@runtime_checkable
class BuiltinOp(Protocol):
    """A built-in op type (e.g. ``tree_lstm.internal``) of a :class:`DynamicBatch`, as
    :meth:`DynamicBatch.op <edbatch.api.DynamicBatch.op>` returns it.

    Call it on handles (``h = internal(left, right)``, ``leaf(attr=word)``) to add a node;
    the executor runs the op kind's registered kernel with the batch's parameters. ``op``
    is its :class:`~edbatch.graph.OpType`, ``batch`` the batch that records it. Checks are
    the cheap ones (operand count, handle of the current mini-batch); shapes are checked
    for the whole graph at once when it is assembled.

    It is a function-like callable (``isinstance(f, BuiltinOp)`` checks for ``op`` and
    ``batch``): a C call (:mod:`edbatch.api._fast`) where the extension is built, else the
    plain Python function made here (on CPython 3.11 calling a function with ``attr=``
    passes the keyword without building a dict, where an object's ``__call__`` builds one).
    """

    op: OpType
    batch: Batch

    def __call__(self, *operands: Handle, attr: int = -1) -> Handle:
        """Add one node of this op on ``operands`` (``attr``: its integer payload).

        Raises:
            GraphError: wrong operand count, or an operand that is not a handle of the
                current mini-batch of this batch.
        """


def _generic(batch: Batch, op: OpType) -> Callable[..., Handle]:
    """Any arity (variadic included): the checks of every op call, and its errors."""
    kind = batch._kinds[op.name]
    arity, op_id, pool = kind.arity, kind.op_id, batch._pool

    def call(*operands: Handle, attr: int = -1) -> Handle:
        # ``h._rec is rec`` checks batch and generation at once (see Recording).
        rec = batch._rec
        if len(operands) != arity:
            if arity >= 0:
                _bad_count(op, operands)
            rec.counts.append(len(operands))
        flat = rec.operands
        try:
            for h in operands:
                if h._rec is not rec:
                    break
                flat.append(h.node_id)
            else:
                ops = rec.ops
                node = len(ops)
                ops.append(op_id)
                rec.attrs.append(attr)
                try:
                    h = pool[node]
                except IndexError:
                    h = grow_pool(pool, node)
                h._rec = rec
                h._kind = kind
                return h
        except Exception:  # (not a handle, whatever reading it raised: named below)
            pass
        _undo(rec, operands, arity)
        for slot, h in enumerate(operands):
            batch._check_handle(h, f"op {op.name!r} operand {slot}")
        raise GraphError(f"op {op.name!r}: operands {operands!r} are not handles of "
                         f"the current mini-batch; record them with this batch")

    return call


def _bad_count(op: OpType, operands: Sequence[Any]) -> None:
    raise GraphError(f"op {op.name!r} takes {op.arity} operands (in_shapes="
                     f"{list(op.in_shapes or ())}), got {len(operands)}; pass "
                     f"one handle per slot")


def _undo(rec: Recording, operands: Sequence[Any], arity: int) -> None:
    """Take back the operand ids appended before the first bad operand."""
    good = 0
    for h in operands:
        if type(h) is not Handle or h._rec is not rec:
            break
        good += 1
    if good:
        del rec.operands[-good:]
    if arity < 0:
        rec.counts.pop()


# ---------------------------------------------------------------------------- fixed arity
# One function per small fixed arity: named parameters instead of a ``*operands`` loop, one
# ``try`` around the common case (every operand a handle of the current recording, no extra
# operand; the node's handle is its batch's pooled one, see ``_handles.recycle``). Anything
# else (a missing, extra or foreign operand, a non-handle) falls back to the generic call,
# which raises its usual errors. ``_NO`` marks a missing operand: its ``_rec`` is never a
# recording.
_NO: Any = type("_Missing", (), {"_rec": None})()


def _fixed(batch: Batch, op: OpType) -> Callable[..., Handle]:
    """The call of op type ``op``: one of ``_op0.._op3`` for its arity, else generic. Each
    takes the node's pooled handle before appending anything: a pool too short raises
    ``IndexError`` there, the pool grows and the generic call records the node."""
    kind = batch._kinds[op.name]
    make = {0: _op0, 1: _op1, 2: _op2, 3: _op3}.get(kind.arity)
    slow = _generic(batch, op)
    return slow if make is None else make(batch, kind, slow)


def _op0(batch: Batch, kind: Any, slow: Callable[..., Handle]) -> Callable[..., Handle]:
    op_id, pool = kind.op_id, batch._pool

    def op0(*more: Handle, attr: int = -1) -> Handle:
        rec = batch._rec
        try:
            if not more:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                rec.attrs.append(attr)
                h._rec = rec
                h._kind = kind
                return h
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(*more, attr=attr)
    return op0


def _op1(batch: Batch, kind: Any, slow: Callable[..., Handle]) -> Callable[..., Handle]:
    op_id, pool = kind.op_id, batch._pool

    def op1(a: Handle = _NO, *more: Handle, attr: int = -1) -> Handle:
        rec = batch._rec
        try:
            if a._rec is rec and not more:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                rec.operands.append(a.node_id)
                rec.attrs.append(attr)
                h._rec = rec
                h._kind = kind
                return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(*_given(a), *more, attr=attr)
    return op1


def _op2(batch: Batch, kind: Any, slow: Callable[..., Handle]) -> Callable[..., Handle]:
    op_id, pool = kind.op_id, batch._pool

    def op2(a: Handle = _NO, b: Handle = _NO, *more: Handle, attr: int = -1) -> Handle:
        rec = batch._rec
        try:
            if a._rec is rec and b._rec is rec and not more:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                flat = rec.operands
                flat.append(a.node_id)
                flat.append(b.node_id)
                rec.attrs.append(attr)
                h._rec = rec
                h._kind = kind
                return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(*_given(a, b), *more, attr=attr)
    return op2


def _op3(batch: Batch, kind: Any, slow: Callable[..., Handle]) -> Callable[..., Handle]:
    op_id, pool = kind.op_id, batch._pool

    def op3(a: Handle = _NO, b: Handle = _NO, c: Handle = _NO, *more: Handle,
            attr: int = -1) -> Handle:
        rec = batch._rec
        try:
            if a._rec is rec and b._rec is rec and c._rec is rec and not more:
                ops = rec.ops
                node = len(ops)
                h = pool[node]
                ops.append(op_id)
                flat = rec.operands
                flat.append(a.node_id)
                flat.append(b.node_id)
                flat.append(c.node_id)
                rec.attrs.append(attr)
                h._rec = rec
                h._kind = kind
                return h
        except AttributeError:
            pass
        except IndexError:
            grow_pool(pool, len(rec.ops))
        return slow(*_given(a, b, c), *more, attr=attr)
    return op3


def _given(*operands: Any) -> tuple[Any, ...]:
    """The operands the caller passed (the named parameters not left at ``_NO``)."""
    return tuple(h for h in operands if h is not _NO)


def builtin_op(batch: Batch, name: str) -> BuiltinOp:
    """:meth:`DynamicBatch.op <edbatch.api.DynamicBatch.op>`: op type ``name`` of ``batch``.

    Raises:
        UnknownNameError: no such built-in op type in the batch (with a did-you-mean hint).
    """
    if name not in batch._op_ids or name.startswith(("user.", "input/", "value/")):
        names = [o.name for o in batch._ops if not o.name.startswith(("user.", "input/", "value/"))]
        raise UnknownNameError(f"no built-in op type {name!r} in this batch; register a "
                               f"workload with DynamicBatch.from_workload. Known: "
                               f"{names[:8]}" + did_you_mean(name, names))
    op = batch._ops[batch._op_ids[name]]
    call: Any = op_call(batch, batch._kinds[name], _fixed(batch, op), None, ATTR_ANY)
    call.op, call.batch = op, batch
    name_call(call, name, f"Add one node of op type {name!r} (a :class:`BuiltinOp`).")
    return call  # type: ignore[no-any-return]


def register_workload(batch: Batch, workload: Any,
                      params: Mapping[str, Tensor] | None = None) -> Batch:
    """Register every op type of ``workload.vocab`` (but ``loss_sum``, which the API adds
    itself) in ``batch``, with its registered kernel, and ``params`` as the batch's
    parameters; return ``batch``.

    Registered first in a fresh batch, the batch's graphs have exactly the workload's
    vocabulary, so its trained FSM policies apply.

    Raises:
        GraphError: a name clash with a cell already registered, or missing parameters.
        UnknownNameError: an op kind without a registered kernel.
    """
    vocab: Vocab = workload.vocab
    for op in vocab:
        if op.name == LOSS_SUM:
            continue
        known = batch._op_ids.get(op.name)
        if known is not None and batch._ops[known] != op:
            raise GraphError(f"op type {op.name!r} is already registered differently in this "
                             f"batch; register the workload in a fresh DynamicBatch")
        batch.kernels[op.kind] = KERNELS.get(op.kind)
        batch._register(op)
    if params is not None:
        needed = {p for op in vocab for p in op.params}
        missing = sorted(needed - set(params))
        if missing:
            raise GraphError(f"params lacks {missing[:4]} (of {len(missing)} missing) that "
                             f"{getattr(workload, 'name', 'the workload')}'s op types read; "
                             f"pass init_params(workload, ...)")
        shapes = workload.param_shapes() if hasattr(workload, "param_shapes") else {}
        for name in sorted(needed):
            value, want = params[name], shapes.get(name)
            if not isinstance(value, Tensor):
                raise GraphError(f"params[{name!r}] is {type(value).__name__}; pass torch "
                                 f"tensors (init_params(workload, ...))")
            if want is not None and tuple(value.shape) != tuple(want):
                raise GraphError(f"params[{name!r}] has shape {tuple(value.shape)}, the "
                                 f"workload's is {tuple(want)}; pass init_params(workload, ...)"
                                 f" or tensors of its shapes")
            if value.dtype != batch.dtype:
                raise GraphError(f"params[{name!r}] is {value.dtype}, the batch runs in "
                                 f"{batch.dtype}; pass DynamicBatch.from_workload(..., dtype="
                                 f"{value.dtype}) or the tensors as .to({batch.dtype})")
        batch.params.update(params)
    return batch
