"""The recorder's per-node hot path in C, where it is built (``edbatch/api/_fastrec.c``).

:func:`op_call` wraps the Python function that records one node of an op type or a cell
(variadic ones included; :mod:`edbatch.api._builtins`, :mod:`edbatch.api._cellcall`) in a C callable
that takes the common case itself (operands handles of the current recording, of the
registered row shapes where the cell has them, the attr as the function takes it inline) and
appends exactly what the Python function appends; anything else goes to the Python function,
which records it or raises its usual error. :func:`bind_methods` does the same for
:meth:`DynamicBatch.add_loss <edbatch.api.DynamicBatch.add_loss>` and
:meth:`~edbatch.api.DynamicBatch.lookup`, :func:`map_call` for ``cell.map`` (whole
:class:`~edbatch.api._bulk.Handles` blocks; ``route`` too, in :mod:`edbatch.api._route`).
A Python call frame was most of what a recorded node cost: through the C calls a Tree-LSTM
node records in about half the time (``benchmarks/recording_speed.py``; figures in
``docs/throughput.md``).

The extension is optional (``setup.py`` builds it with ``optional=True``): without it, or
with ``EDBATCH_PURE_RECORDING=1`` in the environment (then :mod:`edbatch.api._handles` does
not load it), or :data:`ENABLED` set false before a batch registers its ops, the Python
functions record (the twin the tests compare with).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edbatch.api._bulk import Handles, Routed
from edbatch.api._handles import Handle, Kind, _fastrec  # (set up there)

__all__ = ["ATTR_ANY", "ATTR_COUNT", "ATTR_INT", "ATTR_NONE", "ENABLED", "bind_methods",
           "map_call", "name_call", "op_call"]

#: Whether new op and cell functions take the C path (read when they are made).
ENABLED: bool = _fastrec is not None

#: Whether the C module knows the Handles' slots (``setup_bulk``; a module built before
#: ``MapCall`` has neither: then ``cell.map`` records in Python).
_BULK_READY = False
if _fastrec is not None and hasattr(_fastrec, "setup_bulk"):
    _fastrec.setup_bulk(Handles, Routed)
    _BULK_READY = True

#: How a call's ``attr`` is taken inline: any value (default -1; built-in ops), an ``int``
#: exactly (cells with ``takes_attr``), none or ``None`` recorded as -1 (other cells), none
#: with the count of repeated operands recorded (variadic cells).
ATTR_ANY, ATTR_INT, ATTR_NONE, ATTR_COUNT = 0, 1, 2, 3


def op_call(batch: Any, kind: Kind, fallback: Callable[..., Handle],
            shapes: Sequence[tuple[int, ...]] | None, attr_mode: int,
            each: tuple[int, ...] | None = None) -> Callable[..., Handle]:
    """The C call recording nodes of ``kind`` in ``batch`` (``fallback``: the Python function
    of the same op, for everything else; ``shapes``: the operands' interned row shapes to
    check, ``None`` for none; a variadic op's fixed ones, then any number of ``each``),
    or ``fallback`` itself where the C path is off."""
    if not ENABLED:
        return fallback
    variadic = kind.arity < 0
    arity = (0 if shapes is None else len(shapes)) if variadic else kind.arity
    call: Callable[..., Handle] = _fastrec.OpCall(
        batch._current, kind, kind.op_id, batch._pool, fallback,
        None if shapes is None else tuple(shapes), arity, attr_mode, variadic, each)
    return call


def map_call(batch: Any, cell: Any, fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``cell.map`` with its common case in C (``_fastrec_map.h``: every operand a
    ``Handles`` block of the current recording of the cell's row shape and the call's length,
    attrs a list or tuple of ints in int64 exactly when the cell takes them), recording what
    ``fallback`` (the Python function, :func:`~edbatch.api._cellcall.map_function`'s
    closure) records; ``fallback`` itself where the C path is off or the built module
    predates ``MapCall``."""
    make = getattr(_fastrec, "MapCall", None) if ENABLED else None
    if make is None or not _BULK_READY:
        return fallback
    kind = cell.kind
    return make(batch._current, kind, kind.op_id, kind.shape, tuple(cell.in_shapes),  # type: ignore[no-any-return]
                bool(cell.takes_attr), fallback)


def bind_methods(batch: Any, base: Any) -> None:
    """Give ``batch`` its ``add_loss`` and ``lookup`` with the common case in C (the bound
    methods of ``base`` for the rest) where the C path is on and its class keeps ``base``'s
    (a subclass's own method is left alone)."""
    if not ENABLED:
        return
    cls = type(batch)
    if cls.add_loss is base.add_loss:
        batch.add_loss = _fastrec.AddLoss(batch._current, batch.add_loss)
    if cls.lookup is base.lookup:
        batch.lookup = _fastrec.Lookup(batch._current, batch._pool, batch._lookup_kinds,
                                       batch.lookup)


def name_call(call: Any, name: str, doc: str) -> None:
    """Name ``call`` and the Python function it falls back to, if any (a ``TypeError`` about
    its arguments names ``name``, from either)."""
    for f in (call, getattr(call, "fallback", call)):
        f.__name__ = f.__qualname__ = name
        f.__doc__ = doc
