"""A cell kind is one class: declared parameters, forward, optional in-place and backward.

A subclass of :class:`CellKind` says everything the executor needs about an op kind, in the
spirit of PyTorch Geometric's ``MessagePassing`` (one small class a user fills in):

* ``kind``: the ``OpType.kind`` it runs (a tuple for a class that serves several kinds);
  defining the class registers it in :data:`~edbatch.executor.kernels.KERNELS`;
* ``params``: its parameters **by name**, each a :class:`Param` with a shape rule
  (``"4H, D+H"``: symbols from :meth:`CellKind.dims`, or bound by their first bare use)
  and an initialiser (``init="embedding"`` for a table; otherwise Glorot for a matrix and
  zeros for a vector, :mod:`~edbatch.executor.params`). An op type lists its parameter
  names in this order (:meth:`CellKind.op_type` builds one by name);
* ``forward(op, inputs, p, attrs)``: ``p`` holds the tensors by name (``p.W``); a
  ``forward`` that takes ``out=`` fills that ``[B, width]`` region (in-place executor);
* optional ``backward(op, saved, grad, p, attrs, grads)``: ``saved`` holds what the forward
  put into its ``save`` dict, by the names ``saves`` declares (a mismatch is an error);
  ``grads`` records parameter gradients by name (:class:`RoleGrads`);
* optional ``hoist`` (:class:`Hoist`): the input projection split out of the batch loop
  (:mod:`~edbatch.executor._hoist`), and ``head_reads``: the LSTM-state operands of which
  only ``h`` is read; both name operands from ``inputs``;
* optional ``counts_attr = (fixed, bits)`` (a variadic kind whose attr counts its operands
  after the first ``fixed``, in its low ``bits`` bits, ``0``: the whole attr): every
  compiled program checks each node's attr against its operands (``GraphError`` naming
  the node, :func:`~edbatch.executor._attr_checks.check_operand_counts`).

The registered object is a :class:`CellKernel` with the plain kernel calling convention
(``kernel(op, inputs, params, attrs, out=..., save=...)``, ``kernel.backward``,
``kernel.writes_out``), so the executors, the hoisting pass and the API need nothing new.

Example (a new kind, ``h' = tanh(W [x; h] + b)``, with its hand backward; ``registry=None``
keeps this one out of :data:`KERNELS`, leave it out to register the kind):

    >>> import torch, torch.nn.functional as F
    >>> class Elman(CellKind, registry=None):
    ...     kind = "demo.elman"
    ...     inputs = ("x", "h")
    ...     params = (Param("W", "H, X+H"), Param("b", "H"))
    ...     saves = ("xh", "y")
    ...     dims = staticmethod(lambda op: {"H": op.out_shape[0], "X": op.in_shapes[0][0]})
    ...
    ...     def forward(self, op, inputs, p, attrs, save=None):
    ...         xh = torch.cat(list(inputs), dim=1)
    ...         y = torch.tanh(F.linear(xh, p.W, p.b))
    ...         if save is not None:
    ...             save.update(xh=xh, y=y)
    ...         return y
    ...
    ...     def backward(self, op, saved, grad, p, attrs, grads):
    ...         dz = grad * (1 - saved.y * saved.y)
    ...         grads.linear(("W", "b"), dz, saved.xh)
    ...         dxh = dz @ p.W
    ...         return [dxh[:, :op.in_shapes[0][0]], dxh[:, op.in_shapes[0][0]:]]
    >>> op = Elman.op_type("rnn.step", ((3,), (4,)), (4,), W="rnn.W", b="rnn.b")
    >>> params = {"rnn.W": torch.zeros(4, 7), "rnn.b": torch.ones(4)}
    >>> Elman.kernel(op, [torch.ones(2, 3), torch.ones(2, 4)], params, torch.tensor([-1, -1]))
    tensor([[0.7616, 0.7616, 0.7616, 0.7616],
            [0.7616, 0.7616, 0.7616, 0.7616]])
    >>> hasattr(Elman.kernel, "backward"), Elman.kernel.writes_out
    (True, False)

Run it with ``TorchExecutor(kernels={"demo.elman": Elman.kernel})`` (or register it) and
create its parameters with :func:`~edbatch.executor.init_params`
(``tests/executor/test_cell_kind.py`` runs this kind batched, node by node and backward).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import namedtuple
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from torch import Tensor

from edbatch.errors import ExecutionError, GraphError, UnknownNameError, did_you_mean
from edbatch.executor._shape_rules import check_shapes
from edbatch.executor.kernels import KERNELS, ParamGrads
from edbatch.graph import OpType
from edbatch.registry import Registry

__all__ = ["CELL_KINDS", "HEAD_READS", "HOISTS", "INITS", "CellKernel", "CellKind", "Hoist",
           "HoistSpec", "Param", "RoleGrads", "cell_kind_of"]

#: The initialisers a :class:`Param` may name (``None``: by rank, Glorot or zeros).
INITS = ("embedding", "glorot", "zeros")


class Param(NamedTuple):
    """One declared parameter: its name, shape rule and initialiser.

    Attributes:
        name: the name the forward reads it by (``p.<name>``); a Python identifier.
        shape: comma-separated dimensions, each an integer expression over symbols
            (``"4H, D+H"``): :meth:`CellKind.dims` gives some; a bare unknown symbol is
            bound by its first use (``"V, D"``). Empty: not checked.
        init: ``"embedding"`` (uniform in [-0.1, 0.1]), ``"glorot"``, ``"zeros"`` or
            ``None`` (Glorot for two or more dimensions, zeros for a vector).
    """

    name: str
    shape: str = ""
    init: str | None = None


class Hoist(NamedTuple):
    """How an LSTM cell kind splits into a hoisted input projection and a recurrent step.

    Attributes:
        project: the projection's kind class (not registered; ``kind = None``); it reads
            the hoisted operands and the cell's parameters and returns ``W_x x + b``.
        recurrent: the recurrent half's base class; a subclass reading ``weight`` is made.
        hoisted: names (from ``inputs``) of the operands the projection reads.
        state: name of the recurrent state operand.
        weight: name of the gate weight parameter.
        heads: the hoisted operands are LSTM states of which only ``h`` is read.
    """

    project: type[CellKind]
    recurrent: type[CellKind]
    hoisted: tuple[str, ...]
    state: str
    weight: str
    heads: bool = False


@dataclass(frozen=True)
class HoistSpec:
    """A :class:`Hoist` resolved to operand slots and kernels (what ``_hoist`` reads).

    Attributes:
        hoisted: operand slots the projection reads (none: it reads only ``attrs``).
        state: operand slot of the recurrent state ``[h; c]``.
        weight: position of the gate weight ``W`` (``(4H, in + H)``) in ``op.params``.
        project: kernel ``(op, hoisted operands, params, attrs) -> [B, 4H]``.
        cell: kernel ``(op, (state, projection), params, attrs) -> [B, 2H]``.
        heads: the projection reads only the ``h`` columns of its state operands.
    """

    hoisted: tuple[int, ...]
    state: int
    weight: int
    project: Any
    cell: Any
    heads: bool = False

    @staticmethod
    def gate_width(op: OpType) -> int:
        """``4H`` for an LSTM cell whose output is the state ``[h; c]`` (``2H``)."""
        return 2 * math.prod(op.out_shape)


#: Op kind -> its hoisting (filled as hoisting kinds are defined).
HOISTS: dict[str, HoistSpec] = {}
#: Op kind -> operand slots of LSTM states of which its kernel reads only ``h``.
HEAD_READS: dict[str, tuple[int, ...]] = {}
#: Op kind -> its cell kind class.
CELL_KINDS: dict[str, type[CellKind]] = {}
#: Op types a kernel keeps bound at most (then it starts over; binding is cheap).
_BOUND_MAX = 4096


class RoleGrads:
    """:class:`~edbatch.executor.param_grads.ParamGrads` addressed by declared names."""

    __slots__ = ("acc", "names")

    def __init__(self, acc: ParamGrads, names: Any) -> None:
        self.acc, self.names = acc, names

    def linear(self, roles: Sequence[str], d_out: Tensor, x: Tensor, start: int = 0) -> None:
        """``acc.linear`` for parameters ``roles = (W, b)`` or ``(W,)`` (see ParamGrads)."""
        self.acc.linear([getattr(self.names, r) for r in roles], d_out, x, start)

    def rows(self, role: str, index: Tensor, grad: Tensor) -> None:
        """``acc.rows`` for the table ``role``."""
        self.acc.rows(getattr(self.names, role), index, grad)

    def add(self, role: str, grad: Tensor) -> None:
        """``acc.add``: a whole gradient of parameter ``role`` (its shape)."""
        self.acc.add(getattr(self.names, role), grad)

    def addmm(self, role: str, a: Tensor, b: Tensor, like: Tensor, start: int = 0) -> None:
        """``acc.addmm``: ``d role[:, start:] += a @ b`` in place (see ParamGrads)."""
        self.acc.addmm(getattr(self.names, role), a, b, like, start)


class CellKind:
    """Base of a cell kind (see the module doc for what a subclass declares).

    Class keyword ``registry``: where defining the class registers its kinds
    (:data:`KERNELS` by default; ``None``: nowhere, e.g. for a projection or a test).
    """

    kind: ClassVar[str | tuple[str, ...] | None] = None
    params: ClassVar[tuple[Param, ...]] = ()
    inputs: ClassVar[tuple[str, ...] | None] = None
    saves: ClassVar[tuple[str, ...]] = ()
    hoist: ClassVar[Hoist | None] = None
    head_reads: ClassVar[tuple[str, ...]] = ()
    counts_attr: ClassVar[tuple[int, int] | None] = None
    #: The registered kernel (set when the class is defined).
    kernel: ClassVar[CellKernel]

    def __init_subclass__(cls, registry: Registry[Any] | None = KERNELS, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_declaration(cls)
        cls.kernel = CellKernel(cls)
        kinds = (cls.kind,) if isinstance(cls.kind, str) else (cls.kind or ())
        for kind in kinds:
            if registry is not None:
                registry.register(kind)(cls.kernel)
            if registry is KERNELS:
                CELL_KINDS[kind] = cls
                _register_hoist(cls, kind)

    @staticmethod
    def dims(op: OpType) -> dict[str, int]:
        """Shape symbols of ``op`` for the :class:`Param` shape rules (override)."""
        return {}

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor
                ) -> Tensor:
        """``[B, width]`` outputs of a batch (override; may take ``out=`` and ``save=``)."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    @classmethod
    def op_type(cls, name: str, in_shapes: tuple[tuple[int, ...], ...] | None,
                out_shape: tuple[int, ...], *, kind: str | None = None,
                batchable: bool = True, **params: str) -> OpType:
        """An op type of this kind whose parameters are given by declared name.

        Raises:
            GraphError: a declared parameter is not given, or an undeclared one is.
        """
        declared = [q.name for q in cls.params]
        missing = [n for n in declared if n not in params]
        extra = [n for n in params if n not in declared]
        if missing or extra:
            raise GraphError(
                f"op type {name!r} ({cls.__name__}): "
                + (f"parameter {missing[0]!r} is not given" if missing else
                   f"parameter {extra[0]!r} is not declared"
                   + did_you_mean(extra[0], declared))
                + f"; {cls.__name__} declares {declared}")
        if kind is None:
            if not isinstance(cls.kind, str):
                raise GraphError(f"op type {name!r}: {cls.__name__} serves kinds {cls.kind}; "
                                 f"pass kind=")
            kind = cls.kind
        return OpType(name, kind, in_shapes, out_shape,
                      tuple(params[n] for n in declared), batchable)


def cell_kind_of(kernel: object) -> type[CellKind] | None:
    """The cell kind class behind a registered kernel (``None`` for a plain function)."""
    return kernel.cell if isinstance(kernel, CellKernel) else None


def _check_declaration(cls: type[CellKind]) -> None:
    where = f"cell kind {cls.__name__}"
    names = [q.name for q in cls.params]
    for q in cls.params:
        if not q.name.isidentifier() or names.count(q.name) > 1:
            raise TypeError(f"{where}: parameter name {q.name!r} must be a unique identifier")
        if q.init is not None and q.init not in INITS:
            raise TypeError(f"{where}: parameter {q.name!r} has init {q.init!r}; expected "
                            f"one of {INITS} or None" + did_you_mean(q.init, INITS))
    sig = inspect.signature(cls.forward).parameters
    if getattr(cls, "backward", None) is not None and "save" not in sig:
        raise TypeError(f"{where} defines backward, so its forward must take save=")
    hoisted = (*cls.hoist.hoisted, cls.hoist.state) if cls.hoist else ()
    for n in (*cls.head_reads, *hoisted):
        if cls.inputs is None or n not in cls.inputs:
            raise TypeError(f"{where}: operand {n!r} (hoist / head_reads) is not in "
                            f"inputs {cls.inputs}")
    if cls.hoist is not None and cls.hoist.weight not in names:
        raise TypeError(f"{where}: hoist weight {cls.hoist.weight!r} is not a parameter "
                        f"({names})")


def _register_hoist(cls: type[CellKind], kind: str) -> None:
    slots = {n: k for k, n in enumerate(cls.inputs or ())}
    if cls.head_reads:
        HEAD_READS[kind] = tuple(slots[n] for n in cls.head_reads)
    h = cls.hoist
    if h is None:
        return
    recurrent = type(f"{cls.__name__}Recurrent", (h.recurrent,),
                     {"params": cls.params, "weight": h.weight,
                      "dims": staticmethod(cls.dims)}, registry=None)
    weight = [q.name for q in cls.params].index(h.weight)
    HOISTS[kind] = HoistSpec(tuple(slots[n] for n in h.hoisted), slots[h.state], weight,
                             h.project.kernel, recurrent.kernel, h.heads)


# ---------------------------------------------------------------------- the adapter
class CellKernel:
    """A cell kind under the kernel calling convention (what :data:`KERNELS` holds).

    ``backward`` exists only when the kind defines one, ``writes_out`` says whether its
    forward takes ``out=``. Parameters are bound to an op type once (checked by count and
    shape rule), then read by name on every call.
    """

    __slots__ = ("Names", "Saved", "_all", "_bound", "_out", "_save", "_saves", "backward",
                 "cell", "impl", "writes_out")

    def __init__(self, cell: type[CellKind]) -> None:
        self.cell, self.impl = cell, cell()
        fields = [q.name for q in cell.params]
        self.Names = namedtuple(f"{cell.__name__}Params", fields)  # type: ignore[misc]
        self.Saved = namedtuple(f"{cell.__name__}Saved", cell.saves)  # type: ignore[misc]
        self._saves = frozenset(cell.saves)
        sig = inspect.signature(cell.forward).parameters
        self.writes_out, self._out, self._save = "out" in sig, "out" in sig, "save" in sig
        self._all = "params" in sig  # a forward that needs the whole mapping (its dtype)
        self._bound: dict[int, tuple[OpType, Any]] = {}
        if getattr(cell, "backward", None) is not None:
            self.backward = self._backward

    def __repr__(self) -> str:
        return f"<kernel of cell kind {self.cell.__name__}>"

    def names(self, op: OpType, params: Mapping[str, Tensor]) -> Any:
        """``op``'s parameter names by declared name (checked on the first call per op)."""
        got = self._bound.get(id(op))
        if got is not None and got[0] is op:
            return got[1]
        names = self.Names._make(_bind(self.cell, op))
        check_shapes(self.cell, op, names, params)
        if len(self._bound) >= _BOUND_MAX:  # op types made per program (projections)
            self._bound.clear()
        self._bound[id(op)] = (op, names)
        return names

    def tensors(self, op: OpType, params: Mapping[str, Tensor], names: Any = None) -> Any:
        """``op``'s parameter tensors by declared name."""
        if names is None:
            names = self.names(op, params)
        try:
            return self.Names._make([params[n] for n in names])
        except KeyError:
            missing = next(n for n in names if n not in params)
            raise UnknownNameError(
                f"parameter {missing!r} of op type {op.name!r} is missing from params "
                f"({len(params)} given).{did_you_mean(missing, params)} Create the "
                f"parameters with edbatch.executor.init_params(workload)") from None

    def __call__(self, op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
                 attrs: Tensor, out: Tensor | None = None,
                 save: list[Any] | None = None) -> Tensor:
        got = self._bound.get(id(op))  # the per-batch path: a few dict and tuple operations
        p = self.tensors(op, params, got[1] if got is not None and got[0] is op else None)
        fwd = self.impl.forward
        if self._all:  # a forward that takes the whole mapping (ZeroState: its dtype)
            fwd = functools.partial(fwd, params=params)
        if save is None or not self._save:
            if out is None:
                return fwd(op, inputs, p, attrs)
            if self._out:
                return fwd(op, inputs, p, attrs, out=out)  # type: ignore[call-arg]
            return out.copy_(fwd(op, inputs, p, attrs))
        named: dict[str, Tensor] = {}
        y = fwd(op, inputs, p, attrs, out=out, save=named) if self._out \
            else fwd(op, inputs, p, attrs, save=named)  # type: ignore[call-arg]
        if named.keys() != self._saves:
            raise ExecutionError(
                f"cell kind {self.cell.__name__} (op type {op.name!r}) saved "
                f"{sorted(named)}, but declares saves = {sorted(self._saves)}: missing "
                f"{sorted(self._saves - named.keys())}, undeclared "
                f"{sorted(named.keys() - self._saves)}; make the forward's save and the "
                f"declaration agree")
        save.append(self.Saved(**named))
        if out is not None and not self._out:
            return out.copy_(y)
        return y

    def _backward(self, op: OpType, saved: Sequence[Any], grad: Tensor,
                  params: Mapping[str, Tensor], attrs: Tensor, acc: ParamGrads
                  ) -> list[Tensor | None]:
        names = self.names(op, params)
        p = self.tensors(op, params, names)
        return self.impl.backward(op, saved[0], grad, p, attrs,  # type: ignore[attr-defined,no-any-return]
                                  RoleGrads(acc, names))


def _bind(cell: type[CellKind], op: OpType) -> tuple[str, ...]:
    """``op.params`` checked against the declaration (one name per declared parameter)."""
    declared = [q.name for q in cell.params]
    if len(op.params) != len(declared):
        k = min(len(op.params), len(declared))
        problem = (f"declared parameter {declared[k]!r} has no name in op.params"
                   if len(op.params) < len(declared) else
                   f"parameter {op.params[k]!r} is not declared")
        raise GraphError(
            f"op type {op.name!r} (kind {op.kind!r}) lists parameters {list(op.params)}, "
            f"but cell kind {cell.__name__} declares {declared}: {problem}. List one name "
            f"per declared parameter, in that order (or build the op type with "
            f"{cell.__name__}.op_type(..., name=...))")
    return op.params
