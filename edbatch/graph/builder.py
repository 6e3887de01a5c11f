"""GraphBuilder: the one mutable way to construct a :class:`~edbatch.graph.ir.Graph`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edbatch.errors import GraphError
from edbatch.graph.ir import Graph, Vocab

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Append-only construction of a graph over a fixed vocabulary.

    :meth:`add` hands out node ids in creation order, so the graph is topological by
    construction; it checks the op, the arity and that every operand already exists at
    once. Shapes are checked for all nodes in one vectorized pass by :meth:`build`.

    Example:
        >>> from edbatch.graph import OpType, Vocab
        >>> b = GraphBuilder(Vocab([OpType("x", "lookup", (), (2,))]))
        >>> b.add("x", attr=1)
        0
        >>> b.add("x", 0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        edbatch.errors.GraphError: node %1 (x) gets 1 operands; op type 'x' takes exactly 0...
    """

    __slots__ = ("vocab", "instance", "_ops", "_attrs", "_inst", "_operands", "_ptr", "_depth",
                 "_arity", "_names")

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        #: Instance id stamped on every node added from now on.
        self.instance = 0
        self._ops: list[int] = []
        self._attrs: list[int] = []
        self._inst: list[int] = []
        self._operands: list[int] = []
        self._ptr: list[int] = [0]
        self._depth: list[int] = []
        self._arity = [-1 if op.arity is None else op.arity for op in vocab]
        self._names = {op.name: i for i, op in enumerate(vocab)}

    def __len__(self) -> int:
        return len(self._ops)

    def op_id(self, name: str) -> int:
        """Resolve an op type name to its id (raises with a did-you-mean hint)."""
        return self.vocab.id(name)

    def add(self, op: int | str, *operands: int, attr: int = -1) -> int:
        """Append one node running ``op`` on ``operands``; return its node id.

        Args:
            op: op type id or name.
            *operands: node ids of earlier nodes, one per operand slot.
            attr: integer payload (token id, label), ``-1`` if unused.

        Raises:
            GraphError: unknown op, wrong number of operands, or an operand that is not an
                earlier node (a forward reference, which is how a cycle would show up).
        """
        n = len(self._ops)
        if type(op) is not int:
            op_id = self._names.get(op)  # type: ignore[arg-type]
            if op_id is None:
                op_id = self.vocab.id(str(op))  # raises UnknownNameError with a hint
            op = op_id
        elif not 0 <= op < len(self._arity):
            raise GraphError(f"node %{n}: unknown op id {op}; the vocabulary has "
                             f"{len(self._arity)} op types. Use an id in 0..{len(self._arity) - 1}")
        want = self._arity[op]
        if want >= 0 and want != len(operands):
            name = self.vocab[op].name
            raise GraphError(f"node %{n} ({name}) gets {len(operands)} operands; op type "
                             f"{name!r} takes exactly {want}. Pass {want} operands")
        depth = 0
        if operands:
            dep = self._depth
            try:
                depth = max([dep[u] for u in operands]) + 1
                ok = min(operands) >= 0
            except (IndexError, TypeError):
                ok = False
            if not ok:
                self._raise_operand(n, op, operands)
            self._operands.extend(operands)
        self._ops.append(op)
        self._attrs.append(attr)
        self._inst.append(self.instance)
        self._depth.append(depth)
        self._ptr.append(len(self._operands))
        return n

    def _raise_operand(self, n: int, op: int, operands: Sequence[object]) -> None:
        name = self.vocab[op].name
        for s, u in enumerate(operands):
            if not isinstance(u, (int, np.integer)):
                raise GraphError(f"node %{n} ({name}) operand {s} is {u!r}; operands must be "
                                 f"node ids (ints) returned by GraphBuilder.add")
            if u < 0 or u >= n:
                what = "itself" if u == n else "a node that does not exist yet"
                raise GraphError(
                    f"node %{n} ({name}) operand {s} refers to %{u}, {what}: the builder has "
                    f"{n} nodes (ids 0..{n - 1}). Create operands before their users; a "
                    f"reference to a later node would make a cycle")
        raise AssertionError("unreachable")  # pragma: no cover

    def build(self, outputs: Sequence[int] = (), *, validate: bool = True) -> Graph:
        """Freeze the nodes into a :class:`Graph` (shape checks happen here, vectorized)."""
        return Graph.from_arrays(
            self.vocab,
            np.asarray(self._ops, dtype=np.int32),
            np.asarray(self._ptr, dtype=np.int64),
            np.asarray(self._operands, dtype=np.int32),
            attrs=_int_attrs(self._attrs),
            instance=np.asarray(self._inst, dtype=np.int32),
            outputs=np.asarray(outputs, dtype=np.int32),
            depth=np.asarray(self._depth, dtype=np.int32),
            validate=validate,
        )


def _int_attrs(attrs: list[int]) -> np.ndarray:  # type: ignore[type-arg]
    """The nodes' ``attr`` payloads as int64; a float (``1.5`` was cut to 1), string or
    ``None`` raises :class:`GraphError` naming the node."""
    raw = np.asarray(attrs)
    if raw.dtype.kind in "iub" or not attrs:
        return raw.astype(np.int64, copy=False)
    node = next(i for i, a in enumerate(attrs) if not isinstance(a, (int, np.integer)))
    raise GraphError(f"node %{node}: attr {attrs[node]!r} ({type(attrs[node]).__name__}) is "
                     f"not an integer; pass an int payload (token id, label) or -1 for none")
