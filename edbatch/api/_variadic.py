"""Variadic cells for the user API: one op type whatever the number of operands.

A child-sum Tree-LSTM/GRU node or a DAG-RNN node reads a varying number of predecessor
states. Registered with ``DynamicBatch.cell(..., variadic=True)``, such a cell is **one** op
type (``in_shapes=None`` in the graph IR, as the ``sum`` ops), so nodes with 0, 1, 2 or 5
children batch together. The last shape of ``in_shapes`` is the repeated operand; the shapes
before it are fixed operands every call passes first::

    cell = batch.cell(module, "node", in_shapes=[X, H], out_shape=H, variadic=True)
    h = cell(x, *child_states)            # x: shape X; each child state: shape H

Per batch of ``B`` nodes with ``N`` repeated operands in all, the module is called as
``module(*fixed, rows, segment, B)``: ``fixed[k]`` is ``[B, *in_shapes[k]]``, ``rows`` is
``[N, *in_shapes[-1]]`` (every repeated operand of every node) and ``segment`` ``int64[N]``
the node (``0..B-1``) each row belongs to; :func:`segment_sum` reduces rows per node. It
returns ``[B, *out_shape]`` and must treat nodes independently.

How it runs: the executor reads operand slot ``k`` of a batch as the ``k``-th operand of the
nodes that have one, in the batch's row order (see
:meth:`edbatch.memory.plan.MemoryPlan`); each node's attr carries its number of repeated
operands, from which the kernel rebuilds ``segment``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from edbatch.errors import GraphError
from edbatch.graph import OpType

if TYPE_CHECKING:
    from edbatch.api._handles import Handle

__all__ = ["VariadicCell", "segment_sum"]

#: A :class:`~edbatch.api.DynamicBatch` (typed loosely: this module is imported by it).
Batch = Any


def segment_sum(rows: Tensor, segment: Tensor, size: int) -> Tensor:
    """Sum ``rows`` ``[N, ...]`` per node: ``[size, ...]`` (nodes without rows get zeros)."""
    out = rows.new_zeros((size, *rows.shape[1:]))
    return out.index_add(0, segment, rows)


class VariadicCell:
    """A module registered as a variadic op type ``user.<name>`` (see the module docstring).

    Create it with ``DynamicBatch.cell(..., variadic=True)``, which returns the function to
    call per node (``cell(x, *children)``, a :class:`~edbatch.api.Cell`); the batch keeps
    this object (module, op type, kernel).
    """

    takes_attr = False

    def __init__(self, batch: Batch, module: Callable[..., Tensor], name: str,
                 in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> None:
        if not in_shapes:
            raise GraphError(f"variadic cell {name!r} needs in_shapes with at least the "
                             f"repeated operand's shape (the last entry), got []")
        self.batch, self.module, self.name = batch, module, name
        self.fixed, self.each = tuple(in_shapes[:-1]), in_shapes[-1]
        self.op = OpType(f"user.{name}", f"user.{name}", None, out_shape)
        self.kind: Any = None  # set when registered
        self.call: Any = None  # the function users call (edbatch.api._cellcall), ditto

    def __repr__(self) -> str:
        return (f"VariadicCell({self.name!r}, fixed={list(self.fixed)}, each={self.each}, "
                f"out={self.op.out_shape})")

    def checked(self, operands: Sequence[Handle]) -> Handle:
        """Add one node on the fixed operands followed by any number of repeated ones, with
        every check and its error (the slow path of the function users call).

        Raises:
            GraphError: fewer operands than the fixed slots, a handle not of the current
                mini-batch, or a shape other than the registered one.
        """
        if len(operands) < len(self.fixed):
            raise GraphError(f"variadic cell {self.name!r} takes {len(self.fixed)} fixed "
                             f"operands (shapes {list(self.fixed)}) before the repeated ones, "
                             f"got {len(operands)} operands; pass the fixed ones first")
        for slot, handle in enumerate(operands):
            want = self.fixed[slot] if slot < len(self.fixed) else self.each
            self.batch._check_handle(handle, f"cell {self.name!r} operand {slot}")
            if handle.shape != want:
                role = "fixed" if slot < len(self.fixed) else "repeated"
                raise GraphError(
                    f"cell {self.name!r} operand {slot} ({role}) has shape {handle.shape} "
                    f"(node %{handle.node_id}, {handle.op_name}), expected {want}; pass a "
                    f"handle of shape {want}")
        count = len(operands) - len(self.fixed)
        return self.batch._add(self.op, [h.node_id for h in operands], count)

    def kernel(self, op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
        """The executor kernel: ``inputs`` are the fixed slots, then repeated slot ``k``
        holding the ``k``-th repeated operand of every node with more than ``k`` of them;
        ``attrs`` are the nodes' repeated-operand counts."""
        size, f = attrs.shape[0], len(self.fixed)
        fixed = [x.reshape(size, *s) for x, s in zip(inputs[:f], self.fixed)]
        extra = inputs[f:]
        if extra:
            rows = torch.cat(list(extra)).reshape(-1, *self.each)
            segment = torch.cat([torch.nonzero(attrs > k).reshape(-1)
                                 for k in range(len(extra))])
        else:
            rows = attrs.new_zeros((0, *self.each), dtype=fixed[0].dtype if fixed else
                                   torch.get_default_dtype())
            segment = attrs.new_zeros(0)
        return self.forward_rows(fixed, rows, segment, size)

    def forward_rows(self, fixed: Sequence[Tensor], rows: Tensor, segment: Tensor,
                     size: int) -> Tensor:
        """Call the module; check and flatten its ``[size, *out_shape]`` result."""
        out = self.module(*fixed, rows, segment, size)
        want = (size, *self.op.out_shape)
        if not isinstance(out, Tensor) or tuple(out.shape) != want:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise GraphError(
                f"variadic cell {self.name!r}: module {type(self.module).__name__} returned "
                f"{got} for {size} nodes with {len(rows)} repeated operands; expected {want}. "
                f"Fix the module or declare out_shape={got[1:] if isinstance(got, tuple) else ''}")
        return out.reshape(size, -1)

    @property
    def probe_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Operand shapes of the registration probe: the fixed ones and two repeated ones."""
        return (*self.fixed, self.each, self.each)

    def probe(self, device: torch.device, dtype: torch.dtype) -> None:
        """Run the module on one node of zeros with two repeated operands (checks shapes)."""
        fixed = [torch.zeros(1, *s, device=device, dtype=dtype) for s in self.fixed]
        rows = torch.zeros(2, *self.each, device=device, dtype=dtype)
        self.forward_rows(fixed, rows, torch.zeros(2, dtype=torch.int64, device=device), 1)
