"""The memory plan: where every node's output row lives and how every batch reads its operands.

A :class:`MemoryPlan` is the frozen output of :func:`~edbatch.memory.planner.plan_memory`. It
holds one *arena* (a ``rows x width`` matrix) per distinct flattened output width; every node
owns exactly one row of the arena of its width. Each batch writes its outputs to one
contiguous :class:`Region` (rows in the batch's ``row_order``) and reads each operand slot
either as a zero-copy view (a :class:`Region`: the producers' rows are consecutive, ascending
and aligned with the batch's row order) or as a gather (an ``index_select`` of arena rows).

Example:
    >>> import numpy as np
    >>> r = Region(0, 4, 7)
    >>> len(r), Operand.of_view(r).is_view
    (3, True)
    >>> g = Operand.of_gather(1, np.array([5, 2]))
    >>> g.is_view, g.arena, g.num_rows
    (False, 1, 2)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

__all__ = ["FP32_BYTES", "MemoryPlan", "Operand", "Region"]

#: Bytes per element used by :meth:`MemoryPlan.stats` (the fp32 width).
FP32_BYTES = 4


@dataclass(frozen=True, slots=True)
class Region:
    """Rows ``[start, stop)`` of arena ``arena``.

    Attributes:
        arena: index into :attr:`MemoryPlan.arenas`.
        start: first row.
        stop: one past the last row.
    """

    arena: int
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise ValueError(f"Region rows must satisfy 0 <= start <= stop, got "
                             f"[{self.start}, {self.stop})")

    def __len__(self) -> int:
        return self.stop - self.start

    def __contains__(self, row: object) -> bool:
        return isinstance(row, (int, np.integer)) and self.start <= int(row) < self.stop


@dataclass(frozen=True, slots=True, eq=False)
class Operand:
    """How one operand slot of one batch is read: exactly one of a view or a gather.

    Use :meth:`of_view` / :meth:`of_gather` to build one.

    Attributes:
        view: zero-copy read of these rows, or ``None``.
        gather: ``int64`` arena rows to ``index_select`` (in the batch's row order), or ``None``.
        arena: the arena read (``view.arena`` for a view).
    """

    view: Region | None
    gather: NDArray[np.int64] | None
    arena: int

    def __post_init__(self) -> None:
        if (self.view is None) == (self.gather is None):
            raise ValueError("an Operand is exactly one of a view or a gather")
        if self.view is not None and self.view.arena != self.arena:
            raise ValueError(f"view arena {self.view.arena} != operand arena {self.arena}")

    @classmethod
    def of_view(cls, region: Region) -> Operand:
        """A zero-copy read of ``region``."""
        return cls(region, None, region.arena)

    @classmethod
    def of_gather(cls, arena: int, rows: NDArray[np.integer]) -> Operand:
        """A gather of ``rows`` (global rows of ``arena``, in read order)."""
        g = np.ascontiguousarray(rows, dtype=np.int64)
        g.setflags(write=False)
        return cls(None, g, arena)

    @property
    def is_view(self) -> bool:
        """Whether the read is zero-copy."""
        return self.view is not None

    @property
    def num_rows(self) -> int:
        """Number of rows read."""
        return len(self.view) if self.view is not None else len(self.gather)  # type: ignore[arg-type]

    def rows(self) -> NDArray[np.int64]:
        """The arena rows read, in order (a range for a view)."""
        if self.view is not None:
            return np.arange(self.view.start, self.view.stop, dtype=np.int64)
        return self.gather  # type: ignore[return-value]

    def __repr__(self) -> str:
        if self.view is not None:
            return f"Operand(view=[{self.view.start}:{self.view.stop}] of arena {self.arena})"
        return f"Operand(gather {self.num_rows} rows of arena {self.arena})"


# The planner's fast constructors: the frozen dataclasses' ``__init__`` sets each field
# through ``object.__setattr__`` and validates; these set the slots directly (about half the
# cost, ~1,200 objects per lattice mini-batch). Callers guarantee what ``__post_init__``
# checks: ``0 <= start <= stop``, a view's arena is the operand's, gather rows read-only.
_new = object.__new__
_set_arena, _set_start, _set_stop = (Region.arena.__set__, Region.start.__set__,  # type: ignore[attr-defined]
                                     Region.stop.__set__)  # type: ignore[attr-defined]
_set_view, _set_gather, _set_op_arena = (Operand.view.__set__,  # type: ignore[attr-defined]
                                         Operand.gather.__set__,  # type: ignore[attr-defined]
                                         Operand.arena.__set__)  # type: ignore[attr-defined]


def _region(arena: int, start: int, stop: int) -> Region:
    """``Region(arena, start, stop)`` without the checks (planner use only)."""
    r = _new(Region)
    _set_arena(r, arena)
    _set_start(r, start)
    _set_stop(r, stop)
    return r  # type: ignore[no-any-return]


def _operand(view: Region | None, gather: NDArray[np.int64] | None, arena: int) -> Operand:
    """``Operand(view, gather, arena)`` without the checks (planner use only)."""
    o = _new(Operand)
    _set_view(o, view)
    _set_gather(o, gather)
    _set_op_arena(o, arena)
    return o  # type: ignore[no-any-return]


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """Arenas, node rows, per-batch row orders, output regions and operand reads.

    Batch ``b`` of the schedule writes its outputs, in the order ``row_order[b]``, to the
    contiguous region ``outputs[b]``; ``operands[b][k]`` tells how it reads operand slot ``k``
    (a variadic op's node alone in its batch has one slot holding all its operands, in
    operand order, when they share an arena, else one slot per operand). ``node_row[v]`` is
    the row of node ``v`` in arena ``node_arena[v]``.

    Attributes:
        strategy: the planner strategy that produced it (``"naive"`` or ``"planned"``).
        arenas: ``(rows, width)`` per arena; one arena per distinct flattened output width.
        node_row: ``int64[N]`` row of each node in its arena.
        node_arena: ``int32[N]`` arena of each node.
        row_order: per batch, ``int32`` node ids in output-row order.
        outputs: per batch, the region its outputs are written to.
        operands: per batch, per operand slot, how the slot is read.
        forced: per batch, whether it is an unbatchable forced batch (excluded from the
            zero-copy fraction).
        seconds: planning wall time.
    """

    strategy: str
    arenas: tuple[tuple[int, int], ...]
    node_row: NDArray[np.int64]
    node_arena: NDArray[np.int32]
    row_order: tuple[NDArray[np.int32], ...]
    outputs: tuple[Region, ...]
    operands: tuple[tuple[Operand, ...], ...]
    forced: tuple[bool, ...] = ()
    seconds: float = field(default=0.0, compare=False)

    @classmethod
    def of_flat(cls, strategy: str, arenas: tuple[tuple[int, int], ...],
                node_row: NDArray[np.int64], node_arena: NDArray[np.int32],
                order: NDArray[np.int32], bptr: list[int],
                regions: tuple[list[int], list[int], list[int]],
                operands: tuple[tuple[Operand, ...], ...], forced: tuple[bool, ...],
                seconds: float) -> MemoryPlan:
        """The plan with ``row_order`` given as ``order`` (every batch's row order,
        concatenated, read-only) cut at ``bptr``, and ``outputs`` as ``regions`` (each
        batch's arena, first and stop row): both made on first access (the executor reads
        :meth:`flat_order` and :meth:`output_rows`, not one object per batch)."""
        out = object.__new__(cls)
        for name, value in (("strategy", strategy), ("arenas", arenas), ("node_row", node_row),
                            ("node_arena", node_arena), ("operands", operands),
                            ("forced", forced), ("seconds", seconds),
                            ("_order", (order, bptr)), ("_regions", regions)):
            object.__setattr__(out, name, value)
        return out

    def __getattr__(self, name: str) -> object:
        # only for a field not set: of_flat's row orders and regions, made now
        got = self.__dict__
        if name == "row_order" and "_order" in got:
            order, bptr = got["_order"]
            value: object = tuple(order[lo:hi] for lo, hi in itertools.pairwise(bptr))
        elif name == "outputs" and "_regions" in got:
            value = tuple(map(_region, *got["_regions"]))
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        object.__setattr__(self, name, value)
        return value

    def flat_order(self) -> NDArray[np.int32]:
        """Every batch's row order, concatenated (``int32``, read-only; do not modify)."""
        got = self.__dict__.get("_order")
        if got is not None:
            return got[0]  # type: ignore[no-any-return]
        return np.concatenate(self.row_order) if self.row_order else np.zeros(0, np.int32)

    def row_counts(self) -> NDArray[np.int64]:
        """Each batch's number of rows (the lengths of :attr:`row_order`)."""
        got = self.__dict__.get("_order")
        if got is not None:
            return np.diff(np.asarray(got[1], np.int64))
        return np.fromiter(map(len, self.row_order), np.int64, len(self.row_order))

    def output_rows(self) -> tuple[list[int], list[int]]:
        """``(arena, first row)`` of each batch's output region, as lists."""
        got = self.__dict__.get("_regions")
        if got is not None:
            return got[0], got[1]
        return [r.arena for r in self.outputs], [r.start for r in self.outputs]

    @property
    def num_batches(self) -> int:
        """Number of batches planned."""
        got = self.__dict__.get("_order")
        return len(got[1]) - 1 if got is not None else len(self.outputs)

    def arena_width(self, arena: int) -> int:
        """Row width (elements) of ``arena``."""
        return self.arenas[arena][1]

    def stats(self) -> dict[str, float]:
        """Plan metrics with ``memory/`` keys.

        ``zero_copy_fraction`` is the share of operand reads (one read = one operand slot of
        one batch) of batched, non-forced batches that are views (1.0 when there are none);
        ``zero_copy_row_fraction`` weights reads by their rows. ``gather_kernels`` counts
        gathers over all batches, ``gathered_bytes`` their fp32 bytes, ``arena_bytes`` the fp32
        size of all arenas.
        """
        reads = views = rows = view_rows = 0
        gathers = gathered = 0
        forced = self.forced or (False,) * self.num_batches
        for b, slots in enumerate(self.operands):
            for op in slots:
                if not op.is_view:
                    gathers += 1
                    gathered += op.num_rows * self.arena_width(op.arena) * FP32_BYTES
                if forced[b]:
                    continue
                reads += 1
                rows += op.num_rows
                if op.is_view:
                    views += 1
                    view_rows += op.num_rows
        return {
            "memory/zero_copy_fraction": views / reads if reads else 1.0,
            "memory/zero_copy_row_fraction": view_rows / rows if rows else 1.0,
            "memory/operand_reads": float(reads),
            "memory/gather_kernels": float(gathers),
            "memory/gathered_bytes": float(gathered),
            "memory/arena_bytes": float(sum(r * w for r, w in self.arenas) * FP32_BYTES),
            "memory/plan_seconds": self.seconds,
        }

    def __repr__(self) -> str:
        s = self.stats()
        return (f"MemoryPlan({self.strategy!r}, {self.num_batches} batches, "
                f"{len(self.arenas)} arenas, zero_copy={s['memory/zero_copy_fraction']:.3f}, "
                f"gathers={int(s['memory/gather_kernels'])})")
