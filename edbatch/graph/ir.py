"""The graph IR: op types (batching signatures), a vocabulary, and the frozen :class:`Graph`.

"Build with objects, run on arrays": :class:`~edbatch.graph.builder.GraphBuilder` hands out
node ids; the frozen :class:`Graph` holds numpy arrays (op ids, CSR operands, depth, instance
id) that schedulers, the environment and the executor read.

Example:
    >>> from edbatch.graph import OpType, Vocab, GraphBuilder
    >>> vocab = Vocab([OpType("leaf", "lookup", (), (4,)),
    ...                OpType("node", "add", ((4,), (4,)), (4,))])
    >>> b = GraphBuilder(vocab)
    >>> x, y = b.add("leaf", attr=3), b.add("leaf", attr=5)
    >>> z = b.add("node", x, y)
    >>> g = b.build(outputs=[z])
    >>> print(g)
    graph(3 nodes, 2 op types, 1 instances)
      %0 = leaf() attr=3
      %1 = leaf() attr=5
      %2 = node(%0, %1)
    >>> g.depth.tolist()
    [0, 0, 1]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import GraphError, UnknownNameError, did_you_mean
from edbatch.graph._validate import (
    compute_depth,
    shape_tables,
    validate_arrays,
    validated_depth,
)

__all__ = ["COMPLEX_KINDS", "Graph", "Node", "OpType", "Shape", "Vocab"]

Shape = tuple[int, ...]

#: Op kinds DyNet's agenda tie-break treats as "complex" (deferred on ties).
COMPLEX_KINDS = frozenset({"affine", "matmul"})


@dataclass(frozen=True, slots=True)
class OpType:
    """A batching signature: two nodes batch together iff they have the same op type.

    Attributes:
        name: unique name within a vocabulary, ``<workload>.<op>`` or a bare primitive name.
        kind: the kernel family that runs it (``"affine"``, ``"tanh"``, ``"tree_lstm.leaf"``).
        in_shapes: one shape per operand slot, or ``None`` for a variadic / unchecked op.
        out_shape: shape of one node's output (without the batch dimension).
        params: names of the parameters the op reads; part of the signature.
        batchable: ``False`` for ops that always run alone (DyNet's type 0).
    """

    name: str
    kind: str
    in_shapes: tuple[Shape, ...] | None
    out_shape: Shape
    params: tuple[str, ...] = ()
    batchable: bool = True

    @property
    def arity(self) -> int | None:
        """Number of operands, or ``None`` when variadic."""
        return None if self.in_shapes is None else len(self.in_shapes)

    @property
    def is_complex(self) -> bool:
        """Whether DyNet's agenda tie-break defers this op (matrix products)."""
        return self.kind in COMPLEX_KINDS


class Vocab(Sequence[OpType]):
    """An ordered, immutable set of op types; the index of an op type is its ``op_id``.

    The op id doubles as the RL action id, so a workload's vocabulary is fixed up front and
    is identical for every graph it emits.
    """

    __slots__ = ("_ops", "_index", "_batchable", "_tables", "signature")

    def __init__(self, ops: Iterable[OpType]) -> None:
        self._ops: tuple[OpType, ...] = tuple(ops)
        self._index: dict[str, int] = {}
        for i, op in enumerate(self._ops):
            if op.name in self._index:
                raise GraphError(
                    f"duplicate op type name {op.name!r} at positions {self._index[op.name]} "
                    f"and {i}; give every op type of a vocabulary a unique name"
                )
            self._index[op.name] = i
        self._batchable = np.array([op.batchable for op in self._ops], dtype=bool)
        self._batchable.setflags(write=False)
        #: Bytes identifying every op type in full (hashed into Graph.structure_key).
        self.signature: bytes = repr(self._ops).encode()
        self._tables: tuple[NDArray, NDArray, NDArray] | None = None  # type: ignore[type-arg]

    def __len__(self) -> int:
        return len(self._ops)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        return self._ops[i]

    def __iter__(self) -> Iterator[OpType]:
        return iter(self._ops)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._ops == other._ops

    def __hash__(self) -> int:
        return hash(self._ops)

    def __repr__(self) -> str:
        return f"Vocab({[op.name for op in self._ops]})"

    @property
    def names(self) -> tuple[str, ...]:
        """Op type names in op-id order."""
        return tuple(op.name for op in self._ops)

    def id(self, name: str) -> int:
        """Return the op id of ``name``; raise :class:`UnknownNameError` with a hint."""
        try:
            return self._index[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown op type {name!r}; this vocabulary has {len(self)} op types "
                f"({', '.join(self.names[:8])}{', ...' if len(self) > 8 else ''})."
                + did_you_mean(name, self._index)
                + " Add the op type to the workload's vocabulary or fix the name."
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def shape_tables(self) -> tuple[NDArray, NDArray, NDArray]:  # type: ignore[type-arg]
        """``(arity, out_shape id, in_shape ids)`` per op type, computed once (see
        :func:`edbatch.graph._validate.shape_tables`); read-only."""
        if self._tables is None:
            self._tables = shape_tables(self)
            for a in self._tables:
                a.setflags(write=False)
        return self._tables

    @property
    def batchable(self) -> NDArray[np.bool_]:
        """Boolean mask over op ids: which op types may form batches."""
        return self._batchable


@dataclass(frozen=True, slots=True)
class Node:
    """A read-only view of one node, for debugging and tests."""

    id: int
    op: OpType
    operands: tuple[int, ...]
    attr: int
    depth: int
    instance: int

    def __str__(self) -> str:
        args = ", ".join(f"%{u}" for u in self.operands)
        tail = f" attr={self.attr}" if self.attr >= 0 else ""
        return f"%{self.id} = {self.op.name}({args}){tail}"


def _frozen(a: NDArray, dtype: type) -> NDArray:  # type: ignore[type-arg]
    out: NDArray = np.ascontiguousarray(a, dtype=dtype)  # type: ignore[type-arg]
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Graph:
    """A typed dataflow DAG in topological order, stored as read-only numpy arrays.

    Node ``v`` runs op ``vocab[op_ids[v]]`` on the outputs of nodes
    ``operand_ids[operand_ptr[v]:operand_ptr[v + 1]]`` (in slot order). Every operand id is
    smaller than the node id, so node id order is a topological order. Construct graphs with
    :class:`~edbatch.graph.builder.GraphBuilder` or :func:`~edbatch.graph.merge.merge_graphs`.

    Attributes:
        vocab: the op types; ``op_ids`` index into it.
        op_ids: ``int32[N]`` op id per node.
        operand_ptr: ``int64[N+1]`` CSR row pointers into ``operand_ids``.
        operand_ids: ``int32[E]`` producer node ids, by slot.
        attrs: ``int64[N]`` one integer payload per node (token id, label), ``-1`` if unused.
        instance: ``int32[N]`` which data instance of the mini-batch a node belongs to.
        outputs: ``int32[M]`` nodes whose values the caller wants (losses, roots).
        depth: ``int32[N]`` longest path (in edges) from a source to the node.
    """

    vocab: Vocab
    op_ids: NDArray[np.int32]
    operand_ptr: NDArray[np.int64]
    operand_ids: NDArray[np.int32]
    attrs: NDArray[np.int64]
    instance: NDArray[np.int32]
    outputs: NDArray[np.int32]
    depth: NDArray[np.int32] = field(repr=False)

    @classmethod
    def from_arrays(
        cls,
        vocab: Vocab,
        op_ids: NDArray,  # type: ignore[type-arg]
        operand_ptr: NDArray,  # type: ignore[type-arg]
        operand_ids: NDArray,  # type: ignore[type-arg]
        *,
        attrs: NDArray | None = None,  # type: ignore[type-arg]
        instance: NDArray | None = None,  # type: ignore[type-arg]
        outputs: Sequence[int] | NDArray | None = None,  # type: ignore[type-arg]
        depth: NDArray | None = None,  # type: ignore[type-arg]
        validate: bool = True,
    ) -> Graph:
        """Freeze arrays into a graph, computing depth if absent, and validate it."""
        n = len(op_ids)
        op_ids = _frozen(op_ids, np.int32)
        operand_ptr = _frozen(operand_ptr, np.int64)
        operand_ids = _frozen(operand_ids, np.int32)
        attrs = _frozen(np.full(n, -1) if attrs is None else attrs, np.int64)
        instance = _frozen(np.zeros(n) if instance is None else instance, np.int32)
        outputs = _frozen(np.zeros(0) if outputs is None else np.asarray(outputs), np.int32)
        if validate:
            checked = validated_depth(vocab, op_ids, operand_ptr, operand_ids, attrs,
                                      instance, outputs)
            depth = checked if depth is None else depth
        elif depth is None:
            depth = compute_depth(operand_ptr, operand_ids)
        return cls(vocab, op_ids, operand_ptr, operand_ids, attrs, instance, outputs,
                   _frozen(depth, np.int32))

    # ------------------------------------------------------------------ basic facts
    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N``."""
        return len(self.op_ids)

    @property
    def num_edges(self) -> int:
        """Number of operand references ``E``."""
        return len(self.operand_ids)

    @functools.cached_property
    def num_instances(self) -> int:
        """Number of data instances merged into this graph."""
        return int(self.instance.max()) + 1 if self.num_nodes else 0

    def operands(self, node_id: int) -> NDArray[np.int32]:
        """Producer ids of ``node_id``'s operands, in slot order."""
        return self.operand_ids[self.operand_ptr[node_id]:self.operand_ptr[node_id + 1]]

    def node(self, node_id: int) -> Node:
        """A readable view of one node."""
        if not 0 <= node_id < self.num_nodes:
            raise GraphError(f"node id {node_id} out of range; the graph has "
                             f"{self.num_nodes} nodes")
        return Node(node_id, self.vocab[int(self.op_ids[node_id])],
                    tuple(int(u) for u in self.operands(node_id)), int(self.attrs[node_id]),
                    int(self.depth[node_id]), int(self.instance[node_id]))

    @functools.cached_property
    def arity(self) -> NDArray[np.int64]:
        """``int64[N]`` number of operands per node."""
        return np.diff(self.operand_ptr)

    @functools.cached_property
    def type_counts(self) -> NDArray[np.int64]:
        """``int64[K]`` number of nodes per op type."""
        return np.bincount(self.op_ids, minlength=len(self.vocab))

    @functools.cached_property
    def operand_free_types(self) -> NDArray[np.bool_]:
        """``bool[K]``: op types none of whose nodes in this graph has an operand."""
        with_operands = np.bincount(self.op_ids, weights=self.arity > 0,
                                    minlength=len(self.vocab))
        return with_operands == 0

    @functools.cached_property
    def batchable_node(self) -> NDArray[np.bool_]:
        """``bool[N]``: whether each node's op type is batchable."""
        return self.vocab.batchable[self.op_ids] if self.num_nodes else np.zeros(0, bool)

    # ------------------------------------------------------------------ derived structure
    @functools.cached_property
    def users(self) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        """Consumers in CSR form ``(user_ptr int64[N+1], user_ids int32[E])``.

        A node that reads the same producer in two slots appears twice, matching the
        per-slot operand counts the frontier keeps.
        """
        from edbatch.graph._csr import users_csr  # numba, loaded on first use

        return users_csr(self.operand_ptr, self.operand_ids,  # type: ignore[no-any-return]
                         self.num_nodes)

    @functools.cached_property
    def levels(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Nodes grouped by depth: ``(order, level_ptr)``; level d is ``order[ptr[d]:ptr[d+1]]``."""
        order = np.argsort(self.depth, kind="stable").astype(np.int64)
        counts = np.bincount(self.depth) if self.num_nodes else np.zeros(0, np.int64)
        ptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        return order, ptr

    def structure_key(self) -> bytes:
        """A hash of the graph's structure, for caching schedules and memory plans.

        Covers the op ids, the operands and the vocabulary's full op signatures (names,
        kinds, shapes, parameters), so two workloads with equal op names but other sizes
        never share a plan; ``attrs`` are not covered.
        """
        import hashlib

        h = hashlib.blake2b(digest_size=16)
        for a in (self.op_ids, self.operand_ptr, self.operand_ids):
            h.update(a.tobytes())
        h.update(self.vocab.signature)
        return h.digest()

    # ------------------------------------------------------------------ checks and dumps
    def validate(self) -> None:
        """Check every invariant; raise :class:`GraphError` naming the node and the fix."""
        validate_arrays(self.vocab, self.op_ids, self.operand_ptr, self.operand_ids,
                         self.attrs, self.instance, self.outputs)

    def __str__(self) -> str:
        lines = [f"graph({self.num_nodes} nodes, {len(self.vocab)} op types, "
                 f"{self.num_instances} instances)"]
        limit = 200
        for v in range(min(self.num_nodes, limit)):
            lines.append("  " + str(self.node(v)))
        if self.num_nodes > limit:
            lines.append(f"  ... {self.num_nodes - limit} more nodes")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"vocab={len(self.vocab)} ops, instances={self.num_instances})")
