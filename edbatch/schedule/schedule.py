"""Batch and Schedule: the frozen output of every scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import ScheduleError
from edbatch.graph.ir import Graph

__all__ = ["Batch", "Schedule"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Nodes of one op type that run as one kernel call.

    Attributes:
        op_id: the op type of every node in the batch.
        node_ids: ``int32`` node ids, ascending.
        forced: ``True`` for an unbatchable node run alone outside the policy's control.
    """

    op_id: int
    node_ids: NDArray[np.int32]
    forced: bool = False

    def __len__(self) -> int:
        return len(self.node_ids)


@dataclass(frozen=True)
class Schedule:
    """Batches in execution order, and who produced them.

    Example:
        >>> from edbatch.graph import OpType, Vocab, GraphBuilder
        >>> b = GraphBuilder(Vocab([OpType("x", "lookup", (), (1,))]))
        >>> _ = b.add("x"), b.add("x")
        >>> s = Schedule((Batch(0, np.array([0, 1], np.int32)),), "manual")
        >>> s.validate(b.build()); s.num_batches
        1
    """

    batches: tuple[Batch, ...]
    scheduler: str
    seconds: float = field(default=0.0, compare=False)

    @classmethod
    def of_flat(cls, op_ids: NDArray[np.int64], ptr: NDArray[np.int64],
                nodes: NDArray[np.int64], forced: NDArray[np.bool_], scheduler: str,
                seconds: float = 0.0) -> Schedule:
        """The schedule of :meth:`flat` arrays (a compiled scheduler's), its :attr:`batches`
        made from them on first access: the planner and the executor read the arrays alone
        (the ``Batch`` objects cost ~0.65 us each, ~80 us for 64 CLEVR questions)."""
        out = object.__new__(cls)
        object.__setattr__(out, "scheduler", scheduler)
        object.__setattr__(out, "seconds", seconds)
        object.__setattr__(out, "_flat", (op_ids, ptr, nodes, forced))
        return out

    def __getattr__(self, name: str) -> object:
        # only for a field not set: the batches of a schedule made by of_flat, built now
        if name == "batches" and "_flat" in self.__dict__:
            op_ids, ptr, nodes, forced = self.__dict__["_flat"]
            batches = _batches_of(op_ids, ptr, nodes, forced)
            object.__setattr__(self, "batches", batches)
            return batches
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def num_batches(self) -> int:
        """Number of kernel launches, forced singleton batches included."""
        made = self.__dict__.get("batches")
        return len(made) if made is not None else len(self.__dict__["_flat"][0])

    @property
    def num_decisions(self) -> int:
        """Number of batches chosen by the policy (not forced)."""
        return sum(1 for b in self.batches if not b.forced)

    def flat(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                            NDArray[np.bool_]]:
        """``(op ids, batch pointers, nodes, forced)``: every batch's op id, ``int64[B + 1]``
        offsets of each batch's nodes in ``nodes`` (the batches' ``node_ids`` concatenated,
        ``int64``) and forced flags, computed once per schedule (the compiled core hands over
        the arrays it made the batches from: :meth:`with_flat`); shared: do not modify them
        (as the batches' ``node_ids``; writeable, so compiled callees see one array type)."""
        out: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                   NDArray[np.bool_]] | None = self.__dict__.get("_flat")
        if out is None:
            out = _flat_of(self.batches)
            object.__setattr__(self, "_flat", out)
        return out

    def with_flat(self, op_ids: NDArray[np.int64], ptr: NDArray[np.int64],
                  nodes: NDArray[np.int64], forced: NDArray[np.bool_]) -> Schedule:
        """This schedule, its :meth:`flat` arrays set to these (which must be what
        :meth:`flat` computes from :attr:`batches`: the arrays its batches were made from);
        returns ``self``."""
        object.__setattr__(self, "_flat", (op_ids, ptr, nodes, forced))
        return self

    def step_of(self, num_nodes: int) -> NDArray[np.int64]:
        """``int64[N]`` index of the batch that runs each node (``-1`` if none does)."""
        step = np.full(num_nodes, -1, dtype=np.int64)
        if self.batches:
            nodes = np.concatenate([b.node_ids for b in self.batches]).astype(np.int64)
            sizes = [len(b) for b in self.batches]
            step[nodes] = np.repeat(np.arange(len(self.batches)), sizes)
        return step

    def validate(self, graph: Graph) -> None:
        """Check that the schedule runs every node once, by op type, after its operands.

        Raises:
            ScheduleError: naming the first offending batch and node.
        """
        n = graph.num_nodes
        seen = np.zeros(n, dtype=np.int64)
        for i, b in enumerate(self.batches):
            ids = np.asarray(b.node_ids, dtype=np.int64)
            if not len(ids):
                raise ScheduleError(f"batch {i} is empty; drop empty batches")
            if ids.min() < 0 or ids.max() >= n:
                raise ScheduleError(f"batch {i} names node {int(ids.max())} but the graph has "
                                    f"{n} nodes; the schedule was made for another graph")
            wrong = ids[graph.op_ids[ids] != b.op_id]
            if len(wrong):
                v = int(wrong[0])
                raise ScheduleError(
                    f"batch {i} runs op {graph.vocab[b.op_id].name!r} but node %{v} is "
                    f"{graph.vocab[int(graph.op_ids[v])].name!r}; a batch holds one op type")
            if len(ids) > 1 and not graph.vocab[b.op_id].batchable:
                raise ScheduleError(f"batch {i} puts {len(ids)} nodes of unbatchable op "
                                    f"{graph.vocab[b.op_id].name!r} together; run them alone")
            np.add.at(seen, ids, 1)
        bad = np.flatnonzero(seen != 1)
        if len(bad):
            v = int(bad[0])
            raise ScheduleError(f"node %{v} ({graph.vocab[int(graph.op_ids[v])].name}) runs "
                                f"{int(seen[v])} times; every node must run exactly once")
        step = self.step_of(n)
        consumer = np.repeat(np.arange(n), graph.arity)
        late = np.flatnonzero(step[graph.operand_ids] >= step[consumer])
        if len(late):
            e = int(late[0])
            v, u = int(consumer[e]), int(graph.operand_ids[e])
            raise ScheduleError(f"node %{v} runs in batch {int(step[v])} but its operand %{u} "
                                f"runs in batch {int(step[u])}; operands must run earlier")

    @classmethod
    def from_node_lists(cls, graph: Graph, batches: Sequence[Sequence[int]],
                        scheduler: str) -> Schedule:
        """Build a schedule from lists of node ids (op types are read from the graph)."""
        out = []
        for ids in batches:
            arr = np.sort(np.asarray(ids, dtype=np.int32))
            op = int(graph.op_ids[arr[0]]) if len(arr) else -1
            out.append(Batch(op, arr, forced=not graph.vocab[op].batchable))
        return cls(tuple(out), scheduler)


def _flat_of(batches: Sequence[Batch]) -> tuple[NDArray[np.int64], NDArray[np.int64],
                                                NDArray[np.int64], NDArray[np.bool_]]:
    """:meth:`Schedule.flat` of ``batches``."""
    n = len(batches)
    ops = np.fromiter((b.op_id for b in batches), np.int64, n)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter((len(b.node_ids) for b in batches), np.int64, n), out=ptr[1:])
    nodes = (np.concatenate([b.node_ids for b in batches]).astype(np.int64) if n
             else np.zeros(0, np.int64))
    return ops, ptr, nodes, np.fromiter((b.forced for b in batches), np.bool_, n)


# Batch's slots set directly: the frozen dataclass's __init__ goes through
# object.__setattr__ three times (about 40% of building a lattice schedule's ~300 batches).
_new, _set_op, _set_ids, _set_forced = (object.__new__, Batch.op_id.__set__,  # type: ignore[attr-defined]
                                        Batch.node_ids.__set__, Batch.forced.__set__)  # type: ignore[attr-defined]


def _batches_of(op_ids: NDArray[np.int64], ptr: NDArray[np.int64], nodes: NDArray[np.int64],
                forced: NDArray[np.bool_]) -> tuple[Batch, ...]:
    """The batches of :meth:`Schedule.flat` arrays (``node_ids``: ``int32`` slices of one
    copy of ``nodes``)."""
    ids = nodes.astype(np.int32)
    bounds = ptr.tolist()
    out = []
    for a, lo, hi, f in zip(op_ids.tolist(), bounds, bounds[1:], forced.tolist()):
        b = _new(Batch)
        _set_op(b, a)
        _set_ids(b, ids[lo:hi])
        _set_forced(b, f)
        out.append(b)
    return tuple(out)
