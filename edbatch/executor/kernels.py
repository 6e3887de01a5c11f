"""The kernel registry and the primitive kernels (one per ``OpType.kind``).

A kernel runs one op type on a batch of ``B`` nodes::

    kernel(op, inputs, params, attrs) -> Tensor[B, prod(op.out_shape)]

* ``inputs[k]`` is ``[B, prod(op.in_shapes[k])]``: row ``i`` is node ``i``'s ``k``-th operand,
  flattened. A variadic op (``in_shapes is None``, e.g. ``loss_sum``) gets every operand of
  its single node, each ``[1, d]``.
* ``params`` maps parameter names (at least ``op.params``) to tensors: weights
  ``(out, in)``, biases ``(out,)``, embedding tables ``(rows, dim)``. The primitive kernels
  here read them by *position* in ``op.params`` (:func:`op_params`); a cell kind
  (:class:`~edbatch.executor.cell_kind.CellKind`, which also declares their shapes and
  initialisers) by the names it declares, bound to ``op.params`` in declaration order. Either
  way one kernel serves every workload that declares the kind.
* ``attrs`` is ``int64[B]``, the nodes' :attr:`Graph.attrs` (token id or label, ``-1`` if
  unused), on the inputs' device.

Kernels are pure and autograd-friendly: they never write into their inputs or parameters,
and a batch of ``B`` equals ``B`` batches of one up to float rounding. An output may share
memory with an input (``slice`` returns a view), so callers must not write into either.

Slice bounds come from the op type itself: :func:`parse_slice` reads them from the name
``slice/{start}:{stop}/{dim}`` that :meth:`~edbatch.workloads.primitives.OpSet.slice` gives.

Example:
    >>> import torch
    >>> from edbatch.graph import OpType
    >>> op = OpType("slice/1:3/4", "slice", ((4,),), (2,))
    >>> KERNELS.get("slice")(op, [torch.arange(8.0).view(2, 4)], {}, torch.full((2,), -1))
    tensor([[1., 2.],
            [5., 6.]])
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.errors import GraphError, UnknownNameError, did_you_mean
from edbatch.executor._attr_checks import out_of_range
from edbatch.executor.param_grads import ParamGrads
from edbatch.graph import OpType
from edbatch.registry import Registry

__all__ = ["FAST_TANH_MIN", "KERNELS", "Backward", "Kernel", "ParamGrads", "fast_tanh",
           "kernel_for", "new_zeros", "op_params", "parse_slice", "pick_nll", "pick_nll_backward",
           "slot_nodes", "stacked_sum", "untracked", "with_backward", "writes_out"]

#: ``kernel(op, inputs, params, attrs) -> [B, prod(op.out_shape)]``.
Kernel = Callable[[OpType, Sequence[Tensor], Mapping[str, Tensor], Tensor], Tensor]

#: Op kind -> kernel. Importing :mod:`edbatch.executor` registers every kernel.
KERNELS: Registry[Kernel] = Registry(
    "op kind",
    hint="Op kind 'abstract' (ED-Batch graph dumps, synthetic workloads) has no semantics: "
         "such graphs can only be scheduled, not executed. A new op kind needs a kernel: "
         "define an edbatch.executor.CellKind subclass with kind = '<kind>' (or register a "
         "function with @KERNELS.register(kind)) in an imported module.")

#: ``backward(op, saved, d_out, params, attrs, grads) -> operand gradients`` (``None`` for an
#: operand that gets none; one narrower than its operand covers the leading columns, the
#: rest is zero); parameter gradients go to ``grads`` (:class:`ParamGrads`).
Backward = Callable[[OpType, Sequence[Tensor], Tensor, Mapping[str, Tensor], Tensor,
                     ParamGrads], list[Tensor | None]]


def with_backward(backward: Backward) -> Callable[[Kernel], Kernel]:
    """Give a kernel a hand-written backward.

    The kernel must accept ``save=`` (a list it appends the tensors ``backward`` reads to).
    When every kernel of a program has one, the training mode runs the forward in place
    without autograd and the backward by hand (:mod:`edbatch.executor._analytic`); the
    values are the kernel's own and the gradients are checked against autograd through the
    reference executor (``tests/executor/test_equivalence.py``, gradcheck in fp64).
    """
    def mark(kernel: Kernel) -> Kernel:
        kernel.backward = backward  # type: ignore[attr-defined]
        return kernel
    return mark


def writes_out(kernel: Kernel) -> Kernel:
    """Mark a kernel that accepts ``out=`` (a ``[B, width]`` tensor it fills and returns).

    The in-place executor then hands it the batch's arena region, saving a copy; called
    without ``out`` the kernel computes exactly the same values into a new tensor.
    """
    kernel.writes_out = True  # type: ignore[attr-defined]
    return kernel


_SLICE_NAME = re.compile(r"slice/(\d+):(\d+)/(\d+)")


def kernel_for(op: OpType, overrides: Mapping[str, Kernel] | None = None) -> Kernel:
    """The kernel of ``op.kind``: ``overrides[op.kind]`` if given there, else the registered one.

    Raises:
        UnknownNameError: no kernel is registered for the kind; the message names the op
            type, suggests close kinds and says that dump graphs cannot be executed.
    """
    if overrides is not None and op.kind in overrides:
        return overrides[op.kind]
    if op.kind not in KERNELS:
        raise UnknownNameError(f"op type {op.name!r} has no kernel: "
                               + KERNELS.unknown_message(op.kind))
    return KERNELS.get(op.kind)


def op_params(op: OpType, params: Mapping[str, Tensor], count: int) -> tuple[Tensor, ...]:
    """The tensors of ``op.params`` in declaration order, checking there are ``count``.

    Raises:
        GraphError: the op type declares another number of parameters than its kind reads.
        UnknownNameError: a declared parameter is missing from ``params``.
    """
    if len(op.params) != count:
        raise GraphError(f"op type {op.name!r} (kind {op.kind!r}) declares parameters "
                         f"{list(op.params)}, but kernel {op.kind!r} reads {count}; declare "
                         f"the op type with {count} parameters in the kernel's order")
    out = []
    for name in op.params:
        tensor = params.get(name)
        if tensor is None:
            raise UnknownNameError(
                f"parameter {name!r} of op type {op.name!r} is missing from params "
                f"({len(params)} given).{did_you_mean(name, params)} Create the parameters "
                f"with edbatch.executor.init_params(workload)")
        out.append(tensor)
    return tuple(out)


def new_zeros(batch: int, width: int, params: Mapping[str, Tensor], attrs: Tensor) -> Tensor:
    """``zeros[batch, width]`` on ``attrs``' device, in the parameters' (or default) dtype."""
    dtype = next(iter(params.values())).dtype if params else torch.get_default_dtype()
    return torch.zeros(batch, width, dtype=dtype, device=attrs.device)


#: Elements from which :func:`fast_tanh` takes the sigmoid form on the CPU.
FAST_TANH_MIN = 6144


def fast_tanh(x: Tensor) -> Tensor:
    """``tanh(x)``, computed as ``2 sigmoid(2x) - 1`` on the CPU (``torch.tanh`` elsewhere).

    The identity is exact; it is here for speed: torch's CPU ``tanh`` runs several times
    slower than its ``sigmoid`` (on this project's AVX-512 VM, 1 thread, a float32
    ``[1230, 150]`` block: 492 us against 133 us for this form), while the three ops cost
    about 10 us of dispatch, so blocks under :data:`FAST_TANH_MIN` elements (the measured
    break-even was about 4,500) keep ``torch.tanh``. In float32 the two agree to 1.8e-7
    absolute over [-20, 20] (``torch.tanh`` is itself 3e-8 from the float64 value);
    float64 stays at rounding level. Every kernel, and so the reference executor too, uses
    it, so batched and node-by-node results stay equal. Differentiable: without autograd
    the scaling is done in place.
    """
    if x.numel() < FAST_TANH_MIN or x.device.type != "cpu":  # the cheaper test first
        return torch.tanh(x)
    # ``x + x`` is exactly ``2 * x``, and a 0-dim ``1`` of the block's dtype is subtracted:
    # an op with a Python float first converts it to a tensor (about 10 us of dispatch)
    y = torch.sigmoid(x + x)
    one = _ONES.get(y.dtype)
    if one is None:
        one = _ONES[y.dtype] = torch.ones((), dtype=y.dtype)
    if y.requires_grad:
        return (y + y) - one
    return y.add_(y).sub_(one)


_ONES: dict[torch.dtype, Tensor] = {}  # 0-dim CPU ones per dtype, for fast_tanh


def slot_nodes(counts: Tensor, sizes: Sequence[int],
               sync_free: bool | None = None) -> list[Tensor]:
    """For each repeated-operand slot ``k``, the nodes (``0..B-1``, ascending) whose
    ``counts`` exceed ``k``; ``sizes[k]`` is how many there are (the slot's row count,
    known on the host from the operand's shape).

    On the CPU this is ``nonzero(counts > k)``. Elsewhere it takes the first ``sizes[k]``
    of a stable sort of ``counts <= k``: no data-dependent shape and no synchronisation
    with the host, so the kernels that use it can be captured in CUDA graphs
    (``sync_free``: force either form; ``None``, by device).
    """
    if not (counts.device.type != "cpu" if sync_free is None else sync_free):
        return [torch.nonzero(counts > k).reshape(-1) for k in range(len(sizes))]
    return [torch.argsort((counts <= k).to(torch.uint8), stable=True)[:n]
            for k, n in enumerate(sizes)]


def untracked(*tensors: Tensor) -> bool:
    """Whether autograd records none of ``tensors``' uses (no grad mode, or none needs a
    gradient): kernels then compute in place and into ``out`` regions."""
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)


def parse_slice(op: OpType) -> tuple[int, int]:
    """The ``(start, stop)`` bounds of a slice op type named ``slice/{start}:{stop}/{dim}``.

    Raises:
        GraphError: the name does not have that form, or disagrees with the op's shapes.
    """
    m = _SLICE_NAME.fullmatch(op.name)
    if m is None:
        raise GraphError(f"slice op type {op.name!r} has no bounds in its name; expected "
                         f"'slice/{{start}}:{{stop}}/{{dim}}' as OpSet.slice declares it")
    start, stop, dim = (int(g) for g in m.groups())
    in_dim = math.prod(op.in_shapes[0]) if op.in_shapes else -1
    if not 0 <= start < stop <= dim or in_dim != dim or math.prod(op.out_shape) != stop - start:
        raise GraphError(f"slice op type {op.name!r}: bounds {start}:{stop} of a {dim} vector "
                         f"do not match its in_shapes {op.in_shapes} and out_shape "
                         f"{op.out_shape}; expected 0 <= start < stop <= dim, in = (dim,) "
                         f"and out = (stop - start,)")
    return start, stop


def pick_nll(logits: Tensor, labels: Tensor) -> Tensor:
    """``-log_softmax(logits)[label]`` per row, as ``[B, 1]`` (``ValueError`` naming a label
    outside ``0 .. C-1``)."""
    try:
        return F.cross_entropy(logits, labels, reduction="none").unsqueeze(1)
    except IndexError:
        out_of_range(labels, logits.shape[1], "label", f"{logits.shape[1]} classes",
                     "its attr must be a class index")
        raise


def pick_nll_backward(logits: Tensor, labels: Tensor, grad: Tensor) -> Tensor:
    """``d logits`` of :func:`pick_nll` given ``grad`` ``[B, 1]``: ``(softmax - onehot) grad``."""
    d = torch.softmax(logits, dim=1)
    d[torch.arange(len(labels), device=labels.device), labels] -= 1.0
    return d * grad


# ---------------------------------------------------------------------- primitive kernels
# (``lookup`` reads a parameter declared as an embedding table: it is a cell kind,
# :class:`edbatch.executor.cells.Lookup`)
@KERNELS.register("affine")
def affine(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
           attrs: Tensor) -> Tensor:
    """``x W^T + b`` with ``(W, b) = op.params``."""
    weight, bias = op_params(op, params, 2)
    return F.linear(inputs[0], weight, bias)


@KERNELS.register("tanh")
def tanh(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
         attrs: Tensor) -> Tensor:
    """Element-wise ``tanh`` (:func:`fast_tanh`)."""
    return fast_tanh(inputs[0])


@KERNELS.register("sigmoid")
def sigmoid(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
            attrs: Tensor) -> Tensor:
    """Element-wise logistic sigmoid."""
    return torch.sigmoid(inputs[0])


@KERNELS.register("one_minus")
def one_minus(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
              attrs: Tensor) -> Tensor:
    """Element-wise ``1 - x``."""
    return 1.0 - inputs[0]


@KERNELS.register("half")
def half(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
         attrs: Tensor) -> Tensor:
    """Element-wise ``x * 0.5`` (the ``/ 2`` of Tree-GRU's child average)."""
    return inputs[0] * 0.5


@KERNELS.register("add")
def add(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
        attrs: Tensor) -> Tensor:
    """Element-wise ``a + b``."""
    return inputs[0] + inputs[1]


@KERNELS.register("cmult")
def cmult(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
          attrs: Tensor) -> Tensor:
    """Element-wise product ``a * b``."""
    return inputs[0] * inputs[1]


@KERNELS.register("concat")
def concat(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
           attrs: Tensor) -> Tensor:
    """``[a; b; ...]`` per row."""
    return torch.cat(list(inputs), dim=1)


@KERNELS.register("slice")
def slice_(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
           attrs: Tensor) -> Tensor:
    """Columns ``start:stop`` (bounds from the op name, see :func:`parse_slice`); a view."""
    start, stop = parse_slice(op)
    return inputs[0][:, start:stop]


@KERNELS.register("zero")
def zero(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
         attrs: Tensor) -> Tensor:
    """A zero vector per node (initial recurrent state)."""
    return new_zeros(attrs.shape[0], math.prod(op.out_shape), params, attrs)


@KERNELS.register("pick_nll")
def pick_nll_kernel(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                    attrs: Tensor) -> Tensor:
    """``-log_softmax(x)[label]`` with ``label = attr``; output ``[B, 1]``."""
    return pick_nll(inputs[0], attrs)


@KERNELS.register("matvec")
def matvec(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
           attrs: Tensor) -> Tensor:
    """``M v`` for a node-produced matrix ``M`` (``rows * cols``, row-major) and ``v``."""
    m, v = inputs
    rows, cols = math.prod(op.out_shape), v.shape[1]
    return torch.bmm(m.reshape(-1, rows, cols), v.unsqueeze(2)).squeeze(2)


def affine_rows_of(stacked: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``W X + b 1^T`` per row of ``stacked`` (flattened ``X``), flattened back.

    ``X`` is ``(W.shape[1], cols)`` row-major; ``b`` is added to every column.
    """
    x = stacked.reshape(stacked.shape[0], weight.shape[1], -1)
    return (torch.matmul(weight, x) + bias.unsqueeze(1)).reshape(stacked.shape[0], -1)


@KERNELS.register("affine_rows")
def affine_rows(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                attrs: Tensor) -> Tensor:
    """MV-RNN's matrix affine: ``W_M [M_l; M_r] + b_M`` on the flattened ``2H x H`` stack."""
    weight, bias = op_params(op, params, 2)
    return affine_rows_of(inputs[0], weight, bias)


def _sum_backward(op: OpType, saved: Sequence[Tensor], grad: Tensor,
                  params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                  ) -> list[Tensor | None]:
    grad = grad.clone()  # `grad` may be a view of the gradient arena the reads add into
    return [grad] * len(saved)  # saved: the operands


@KERNELS.register("sum")
@with_backward(_sum_backward)
@writes_out
def sum_(op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
         attrs: Tensor, out: Tensor | None = None,
         save: list[Tensor] | None = None) -> Tensor:
    """Element-wise sum of all operands.

    Serves the variadic ``loss_sum`` (every operand ``[1, d]``, output ``[1, d]``: the rows
    are stacked and reduced with :func:`stacked_sum`, which the batched executor calls on the
    stacked read directly) and the batchable ``k``-ary state sums of the lattices (left to
    right). No operands give a zero row.
    """
    if save is not None:
        save += inputs
    if out is not None and len(inputs) >= 2 and op.arity is not None and \
            untracked(*inputs):  # the same additions, the first straight into ``out``
        torch.add(inputs[0], inputs[1], out=out)
        for x in inputs[2:]:
            out.add_(x)
        return out
    if not inputs:
        total = new_zeros(1, math.prod(op.out_shape), params, attrs)
    elif op.arity is None:
        total = stacked_sum(torch.cat(list(inputs)))
    else:
        total = inputs[0]
        for x in inputs[1:]:
            total = total + x
    return total if out is None else out.copy_(total)


def stacked_sum(rows: Tensor) -> Tensor:
    """``[k, d] -> [1, d]``: the variadic sum of ``k`` stacked operand rows."""
    return rows.sum(0, keepdim=True)
