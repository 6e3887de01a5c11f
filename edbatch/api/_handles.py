"""Handles and cells of the user API (the pieces :class:`DynamicBatch` hands out while
recording; its results are in :mod:`edbatch.api._result`).

They know the batch that made them only through the small :class:`Recorder` protocol, so
this module imports nothing of :mod:`edbatch.api._batch` (the import graph stays one way).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from sys import getrefcount
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from edbatch.errors import GraphError, is_integer
from edbatch.graph import OpType

__all__ = ["Cell", "CellImpl", "Current", "Handle", "Instance", "Kind", "Recorder", "Recording",
           "ShapeLike", "fresh_handle", "grow_pool", "held_handles", "intern_shape", "new_handle",
           "recycle"]


class Recorder(Protocol):
    """What handles and cells need of the batch recording them (a :class:`DynamicBatch`)."""

    _rec: Recording

    def _check_handle(self, handle: object, where: str) -> None: ...

    def _add(self, op: OpType, operands: Sequence[int], attr: int) -> Handle: ...


#: A shape given by the user: an int (a vector width) or a tuple.
ShapeLike = int | Sequence[int]

def _shape(value: ShapeLike, what: str) -> tuple[int, ...]:
    shape = (value,) if isinstance(value, int) else tuple(value) if isinstance(
        value, (tuple, list)) else (0,)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise GraphError(f"{what} must be an int or a tuple of positive ints, got {value!r}")
    return shape


def cell_shapes(name: object, in_shapes: object) -> list[tuple[int, ...]]:
    """Check a cell's ``name`` and ``in_shapes`` (:meth:`DynamicBatch.cell`); return the
    operand shapes."""
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise GraphError(f"cell name {name!r} must be a non-empty str of letters, digits "
                         f"and _")
    if not isinstance(in_shapes, (tuple, list)):
        raise GraphError(f"cell {name!r}: in_shapes must be a list with one shape (or int "
                         f"width) per operand, got {in_shapes!r}")
    return [_shape(s, f"cell {name!r} in_shapes[{k}]") for k, s in enumerate(in_shapes)]


_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}


def intern_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The one tuple equal to ``shape`` that kinds and cells share (the recording's hot
    paths compare row shapes by identity; an equal shape not interned takes the checked
    path)."""
    return _SHAPES.setdefault(shape, shape)


class Kind:
    """What every handle of one op type shares: the op type, its id, its row shape.

    ``arity`` is ``-1`` for a variadic op; ``scalar`` says whether a row is one number
    (a loss term).
    """

    __slots__ = ("arity", "name", "op", "op_id", "scalar", "shape")

    def __init__(self, op: OpType, op_id: int) -> None:
        self.op, self.op_id, self.name = op, op_id, op.name
        self.shape = intern_shape(tuple(op.out_shape))
        self.arity = -1 if op.arity is None else op.arity
        self.scalar = math.prod(op.out_shape) == 1


class Recording:
    """One mini-batch as it is recorded: flat lists that each op call appends to.

    Node ``v`` has op id ``ops[v]`` and attr ``attrs[v]``; its operands follow those of
    node ``v - 1`` in ``operands`` (as many as its op's arity; a variadic op's count is the
    next entry of ``counts``), except the nodes of bulk blocks (:mod:`edbatch.api._bulk`),
    kept as ``blocks``, four ints each (position in ``operands``, first node, nodes,
    offset in ``block_firsts``): node ``first + i`` reads ``block_firsts[offset + j] + i``
    per slot ``j`` (no int per operand; :func:`~edbatch.api._bulk.operand_array` merges).
    ``marks`` holds ``(first node, instance id)`` each time the
    current instance changes. A handle keeps its recording, so a recording is also the
    token of its batch's generation: ``handle._rec is batch._rec`` checks both at once.
    """

    __slots__ = ("attrs", "batch", "block_firsts", "blocks", "counts", "generation", "losses",
                 "marks", "nrows", "operands", "ops", "rows")

    def __init__(self, batch: Any, generation: int) -> None:
        self.batch, self.generation = batch, generation
        self.ops: list[int] = []
        self.operands: list[int] = []
        self.blocks: list[int] = []
        self.block_firsts: list[int] = []
        self.attrs: list[int] = []
        self.counts: list[int] = []
        self.marks: list[tuple[int, int]] = []
        self.losses: list[int] = []
        self.rows: dict[str, list[Tensor]] = {}  # input op name -> blocks [k, d] of rows
        self.nrows: dict[str, int] = {}  # input op name -> rows in its blocks

    def release(self) -> None:
        """Drop the recorded lists (the mini-batch ran); handles keep batch and generation."""
        self.ops = self.operands = self.attrs = self.counts = self.losses = []
        self.blocks, self.block_firsts = [], []
        self.marks, self.rows, self.nrows = [], {}, {}


class Current:
    """A batch's current recording in one slot, ``rec``: always ``batch._rec`` (set together
    in ``DynamicBatch._clear``, the one place a batch starts a recording). The C calls of
    :mod:`edbatch.api._fast` read it there (no attribute lookup on the batch per call)."""

    __slots__ = ("rec",)

    rec: Recording


class Instance:
    """``with batch.instance():`` (a plain class: a generator context manager costs about
    four times as much per instance)."""

    __slots__ = ("batch", "previous", "rec")

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __enter__(self) -> int:
        batch = self.batch
        self.previous, self.rec = batch._instance, batch._rec
        return batch.next_instance()

    def __exit__(self, *exc: object) -> None:
        batch, rec = self.batch, self.rec
        if batch._rec is rec:  # (a run() inside the block started a new recording)
            batch._instance = self.previous
            rec.marks.append((len(rec.ops), self.previous))


class Handle:
    """A node of a :class:`DynamicBatch`'s mini-batch ``generation``: pass it to cells.

    ``shape`` is the shape of its value (one row); ``op_name`` names its op type;
    ``node_id`` its node in the mini-batch graph (read-only by convention). Handles compare equal
    only to a handle of the same node of the same mini-batch. A handle is one node with one
    value: it cannot be indexed or iterated (a ``TypeError`` / ``GraphError`` says so);
    read its value with ``result[handle]`` after :meth:`~DynamicBatch.run`, or with
    ``value = yield handle`` in a program of :meth:`~DynamicBatch.run_programs`.
    (Internally three slots, the recording, the node id and the op type's :class:`Kind`,
    set without ``__init__``: creating one is the recorder's hot path.)
    """

    __slots__ = ("_kind", "_rec", "node_id")

    _rec: Recording
    node_id: int
    _kind: Kind

    @property
    def batch(self) -> Any:
        """The :class:`DynamicBatch` that recorded it."""
        return self._rec.batch

    @property
    def generation(self) -> int:
        """The mini-batch (of its batch) it belongs to."""
        return self._rec.generation

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one row of its value."""
        return self._kind.shape  # type: ignore[no-any-return]

    @property
    def op_name(self) -> str:
        """The name of its op type."""
        return self._kind.name

    def __eq__(self, other: object) -> bool:
        return type(other) is Handle and other._rec is self._rec and \
            other.node_id == self.node_id

    def __hash__(self) -> int:
        return hash((id(self._rec), self.node_id))

    def __getitem__(self, index: object) -> Any:
        raise TypeError(f"{self!r} is one node with one value, not a tuple of outputs: it "
                        f"cannot be indexed (got [{index!r}]). A cell has one output; to "
                        f"split one, register cells that return each part, or read the value "
                        f"with result[handle] after run() (or `value = yield handle` in "
                        f"run_programs) and index that tensor")

    def __iter__(self) -> Any:
        raise GraphError(f"{self!r} is one node, not a sequence of values; pass it to a "
                         f"cell, or read its value with result[handle] after run()")

    def __bool__(self) -> bool:  # (was always true: `if h:` silently took one branch)
        raise GraphError(f"{self!r} has no value while recording, so it cannot decide an if "
                         f"or while; branch on values in batch.run_programs (`v = yield h`), "
                         f"or test `h is not None`")

    def __repr__(self) -> str:
        return f"Handle(%{self.node_id} = {self._kind.name}, shape={self._kind.shape})"


_new = object.__new__


def _fresh(node: int) -> Handle:
    """A new handle object of node ``node`` (no recording or kind set yet)."""
    h = _new(Handle)
    h.node_id = node
    return h


def new_handle(rec: Recording, node: int, kind: Kind) -> Handle:
    """The handle of node ``node`` of ``rec``: its batch's pooled one (the hot paths inline
    this: ``h = pool[node]``, set ``_rec`` and ``_kind``; see :func:`grow_pool`)."""
    pool = rec.batch._pool
    try:
        h = pool[node]
    except IndexError:
        h = grow_pool(pool, node)
    h._rec = rec
    h._kind = kind
    return h


# ---------------------------------------------------------------------------- handle pool
# Allocating a handle (and freeing it when the user's code drops it) is most of what a
# recorded node costs in CPython. A batch keeps one handle object per node id instead
# (``pool[v].node_id == v``) and hands ``pool[v]`` out as node ``v``'s handle, setting its
# recording and kind. When a mini-batch ends (:func:`recycle`), a handle that only the pool
# still references (its reference count says so: no variable, list or frame holds it, and
# handles take no weak references) can serve the same node id of the next mini-batch:
# nobody can ever see it again. A handle the user still holds is left to the user, stale
# (its ``_rec`` is the finished recording), and replaced in the pool by a new object.
_FREE = next(map(getrefcount, [_fresh(0)]))  # the count of a handle only the pool holds


def grow_pool(pool: list[Handle], node: int) -> Handle:
    """Extend ``pool`` past ``node`` (at least doubling it); return ``pool[node]``. The new
    handles are made in C where :mod:`edbatch.api._fastrec` is built (~10x faster than
    ``_fresh``: a fresh batch's first mini-batch of 5k nodes grew it for ~3 ms)."""
    size = max(node + 1, 2 * len(pool), 1024)
    pool.extend(map(_fresh, range(len(pool), size)) if _fastrec is None
                else _fastrec.handles(len(pool), size))
    return pool[node]


def recycle(pool: list[Handle], used: int) -> None:
    """After a mini-batch of ``used`` nodes: replace the handles someone still holds (nodes
    recorded in bulk, :class:`Handles`, may lie past the pool: they took none from it)."""
    used = min(used, len(pool))
    if not used:
        return
    held = held_handles(pool, used) if _fastrec is None else \
        _fastrec.held(pool, used, _FREE - 1)  # (C counts without the slice's and call's)
    for node in held:
        pool[node] = _fresh(node)


def held_handles(pool: list[Handle], used: int) -> list[int]:
    """The nodes below ``used <= len(pool)`` whose handle someone besides the pool holds
    (the Python twin of ``_fastrec.held``)."""
    used_handles = pool[:used]  # (one more reference to each: _FREE + 1 means free)
    # Every count is at least _FREE + 1, so the sum is (_FREE + 1) * used exactly when
    # nobody holds any (the common case; sum of small ints adds C longs: 0.7x max's time)
    if sum(map(getrefcount, used_handles)) == (_FREE + 1) * used:
        return []
    counts = np.fromiter(map(getrefcount, used_handles), np.intp, used)
    return np.flatnonzero(counts > _FREE + 1).tolist()  # type: ignore[no-any-return]


@runtime_checkable
class Cell(Protocol):
    """A registered cell, as :meth:`DynamicBatch.cell <edbatch.api.DynamicBatch.cell>`
    returns it: call it on handles (``h = cell(left, right)``, or ``cell(h, attr=label)``
    when it takes an attribute) to add a node of op type ``user.<name>``.

    It is a function-like callable (``isinstance(f, Cell)`` checks for ``op``, ``batch``,
    ``name`` and ``module``), as built-in ops are (:class:`~edbatch.api.BuiltinOp`): a C
    call where :mod:`edbatch.api._fast` is built, else a plain Python function (calling a
    function with ``attr=`` builds no keyword dict). ``module`` is what runs on batches,
    ``op`` the op type; a fixed-arity cell also has ``in_shapes`` and ``takes_attr``, a
    variadic one ``fixed`` and ``each`` (see :mod:`edbatch.api._variadic`).
    """

    op: OpType
    batch: Any
    name: str
    module: Callable[..., Tensor]

    def __call__(self, *operands: Handle, attr: int | None = None) -> Handle:
        """Add one node running this cell on ``operands``; return its handle.

        Raises:
            GraphError: wrong operand count, an operand that is not a handle of the current
                mini-batch, a shape other than ``in_shapes``, a missing or unexpected attr.
        """


class CellImpl:
    """A module registered in a :class:`DynamicBatch` as the op type ``user.<name>``: what
    the batch keeps of a fixed-arity :class:`Cell` (the user calls its function ``call``).

    ``module`` is called on batches as ``module(*inputs[, attrs]) -> [B, *out_shape]``
    (``attrs``: the nodes' ``int64[B]`` attributes, if ``takes_attr``); ``op`` is the op type.
    """

    def __init__(self, batch: Recorder, module: Callable[..., Tensor], name: str,
                 in_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...],
                 takes_attr: bool) -> None:
        self.batch, self.module, self.name, self.takes_attr = batch, module, name, takes_attr
        self.op = OpType(f"user.{name}", f"user.{name}", tuple(in_shapes), out_shape)
        self.in_shapes = tuple(intern_shape(tuple(s)) for s in in_shapes)
        self.kind: Kind | None = None  # set when registered (the fast path needs it)
        self.call: Any = None  # the function users call, set when registered

    def __repr__(self) -> str:
        return f"Cell({self.name!r}, in_shapes={self.op.in_shapes}, out={self.op.out_shape})"

    def checked(self, operands: Sequence[Handle], attr: int | None) -> Handle:
        """Record one node with every check and its error (the call's slow path)."""
        if self.takes_attr != (attr is not None):
            need = "needs attr=<int>" if self.takes_attr else "takes no attr"
            raise GraphError(f"cell {self.name!r} {need} (registered with "
                             f"takes_attr={self.takes_attr}); fix the call or the registration")
        if attr is not None and not is_integer(attr):  # (int() truncated 1.5, raised on "x")
            raise GraphError(f"cell {self.name!r}: attr={attr!r} ({type(attr).__name__}) is no "
                             f"integer; pass an int, e.g. attr=int(x) or an index")
        in_shapes = self.op.in_shapes or ()
        if len(operands) != len(in_shapes):
            raise GraphError(f"cell {self.name!r} takes {len(in_shapes)} operands (in_shapes="
                             f"{list(in_shapes)}), got {len(operands)}; pass one handle per slot")
        rec = self.batch._rec
        for slot, (handle, want) in enumerate(zip(operands, in_shapes)):
            if type(handle) is not Handle or handle._rec is not rec:
                self.batch._check_handle(handle, f"cell {self.name!r} operand {slot}")
            if handle._kind.shape != want:
                raise GraphError(
                    f"cell {self.name!r} operand {slot} has shape {handle.shape} (node "
                    f"%{handle.node_id}, {handle.op_name}), but the cell was registered with "
                    f"in_shapes[{slot}] = {want}; pass a handle of shape {want} or register "
                    f"another cell for shape {handle.shape}")
        return self.batch._add(self.op, [h.node_id for h in operands],
                               -1 if attr is None else int(attr))

    def kernel(self, op: OpType, inputs: Sequence[Tensor], params: Mapping[str, Tensor],
               attrs: Tensor) -> Tensor:
        """The executor kernel of this cell's op kind (``params`` unused: see the module)."""
        return self.forward_rows(inputs, attrs)

    def forward_rows(self, inputs: Sequence[Tensor], attrs: Tensor) -> Tensor:
        """Run the module on flattened rows ``[B, d_k]``; return ``[B, prod(out_shape)]``."""
        size, want = attrs.shape[0], (attrs.shape[0], *self.op.out_shape)
        # (rows already ``[B, d]``: as they are, no view and no ViewBackward per call)
        xs = [x if len(s) == 1 and x.dim() == 2 and x.shape[0] == size and x.shape[1] == s[0]
              else x.reshape(size, *s) for x, s in zip(inputs, self.op.in_shapes or ())]
        out = self.module(*xs, attrs) if self.takes_attr else self.module(*xs)
        if not isinstance(out, Tensor) or tuple(out.shape) != want:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            fix = f"out_shape={got[1:]}" if isinstance(got, tuple) else "a tensor output"
            raise GraphError(
                f"cell {self.name!r}: module {type(self.module).__name__} returned {got} for "
                f"a batch of {size} with input shapes {[tuple(x.shape) for x in xs]}; "
                f"expected {want}. Fix the module or declare {fix}")
        return out if out.dim() == 2 else out.reshape(size, -1)


fresh_handle = _fresh


#: The recorder's C calls (see edbatch.api._fast), told where the slots above lie; ``None``
#: where the extension is not built (no C compiler at install time) or
#: ``EDBATCH_PURE_RECORDING=1`` asks for every recorder call in Python (op and cell calls,
#: pool growth, held handles, assembly's packing). (Imported by name: the C module imports
#: nothing of the project, but an import statement of a module without a .py file reads as
#: one of edbatch.api to tests/test_import_graph.py.)
_fastrec: Any = None
if os.environ.get("EDBATCH_PURE_RECORDING", "") in ("", "0"):
    try:
        _fastrec = import_module("edbatch.api._fastrec")
    except ImportError:
        pass
    else:
        _fastrec.setup(Handle, Kind, Recording, Current)
