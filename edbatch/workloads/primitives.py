"""Shared op-type constructors and primitive-level cell emitters.

Workloads declare their vocabulary through an :class:`OpSet`, so that a primitive op has
one name everywhere (``tanh/150``, ``affine.W_iou``) and the batching signature is exactly
(kind, shapes, parameters). The emitters spell an LSTM or GRU cell out as DyNet's
fine-grained ops; every workload at primitive granularity uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType, Vocab
from edbatch.graph.ir import Shape

__all__ = ["GRUNames", "LSTMNames", "OpSet", "emit_gru", "emit_lstm"]


class OpSet:
    """Collects a workload's op types in declaration order; each constructor returns a name.

    Example:
        >>> ops = OpSet()
        >>> ops.unary("tanh", 4), ops.unary("tanh", 4), ops.affine("W", 4, 8)
        ('tanh/4', 'tanh/4', 'affine.W')
        >>> len(ops.vocab())
        2
    """

    def __init__(self) -> None:
        self._ops: dict[str, OpType] = {}
        self.params: dict[str, tuple[int, ...]] = {}

    def add(self, op: OpType, params: dict[str, tuple[int, ...]] | None = None) -> str:
        """Register ``op`` (idempotent for identical declarations); return its name."""
        old = self._ops.get(op.name)
        if old is not None and old != op:
            raise GraphError(f"op type {op.name!r} declared twice with different signatures "
                             f"({old} vs {op}); give the second one another name")
        self._ops[op.name] = op
        for name, shape in (params or {}).items():
            if self.params.get(name, shape) != shape:
                raise GraphError(f"parameter {name!r} declared with shapes "
                                 f"{self.params[name]} and {shape}")
            self.params[name] = shape
        return op.name

    def vocab(self) -> Vocab:
        """The vocabulary, in declaration order."""
        return Vocab(self._ops.values())

    # ------------------------------------------------------------------ primitives
    def lookup(self, table: str, rows: int, dim: int) -> str:
        """Embedding lookup of row ``attr`` of ``table`` (``rows x dim``)."""
        return self.add(OpType(f"lookup.{table}", "lookup", (), (dim,), (table,)),
                        {table: (rows, dim)})

    def affine(self, weight: str, in_dim: int, out_dim: int) -> str:
        """``W x + b`` with parameters ``weight`` and ``weight + '.b'``."""
        return self.add(OpType(f"affine.{weight}", "affine", ((in_dim,),), (out_dim,),
                               (weight, f"{weight}.b")),
                        {weight: (out_dim, in_dim), f"{weight}.b": (out_dim,)})

    def unary(self, kind: str, dim: int) -> str:
        """Element-wise ``tanh``, ``sigmoid`` or ``one_minus`` on a ``dim`` vector."""
        return self.add(OpType(f"{kind}/{dim}", kind, ((dim,),), (dim,)))

    def binary(self, kind: str, dim: int) -> str:
        """Element-wise ``add`` or ``cmult`` of two ``dim`` vectors."""
        return self.add(OpType(f"{kind}/{dim}", kind, ((dim,), (dim,)), (dim,)))

    def concat(self, *dims: int) -> str:
        """Concatenation of vectors of the given sizes."""
        shapes: tuple[Shape, ...] = tuple((d,) for d in dims)
        return self.add(OpType("concat/" + "+".join(map(str, dims)), "concat", shapes,
                               (sum(dims),)))

    def slice(self, start: int, stop: int, dim: int) -> str:
        """Rows ``start:stop`` of a ``dim`` vector (DyNet's pickrange)."""
        return self.add(OpType(f"slice/{start}:{stop}/{dim}", "slice", ((dim,),),
                               (stop - start,)))

    def zero(self, dim: int) -> str:
        """A zero vector (initial recurrent state); no operands."""
        return self.add(OpType(f"zero/{dim}", "zero", (), (dim,)))

    def pick_nll(self, classes: int) -> str:
        """Negative log-softmax of a ``classes`` vector, picked at label ``attr``."""
        return self.add(OpType(f"pick_nll/{classes}", "pick_nll", ((classes,),), (1,)))

    def matvec(self, rows: int, cols: int) -> str:
        """``M v`` for a node-produced matrix ``M`` (``rows*cols``, row-major) and ``v``."""
        return self.add(OpType(f"matvec/{rows}x{cols}", "matvec", ((rows * cols,), (cols,)),
                               (rows,)))


@dataclass(frozen=True, slots=True)
class LSTMNames:
    """Op names of one primitive LSTM cell (one parameter set)."""

    concat: str
    affine: str
    gates: tuple[str, str, str, str]  # slices i, f, o, u
    sigmoid: str
    tanh: str
    cmult: str
    add: str

    @classmethod
    def declare(cls, ops: OpSet, weight: str, in_dim: int, hidden: int) -> LSTMNames:
        """Declare the ops of an LSTM cell reading ``[x; h]`` with weight ``weight``."""
        return cls(
            concat=ops.concat(in_dim, hidden),
            affine=ops.affine(weight, in_dim + hidden, 4 * hidden),
            gates=tuple(ops.slice(k * hidden, (k + 1) * hidden, 4 * hidden)  # type: ignore[arg-type]
                        for k in range(4)),
            sigmoid=ops.unary("sigmoid", hidden),
            tanh=ops.unary("tanh", hidden),
            cmult=ops.binary("cmult", hidden),
            add=ops.binary("add", hidden),
        )


def emit_lstm(b: GraphBuilder, n: LSTMNames, x: int, h: int, c: int) -> tuple[int, int]:
    """Emit one LSTM step as primitives; return ``(h', c')`` node ids.

    ``g = W [x; h] + b``; ``i, f, o = sigmoid(g[0:H], g[H:2H], g[2H:3H])``;
    ``u = tanh(g[3H:4H])``; ``c' = f*c + i*u``; ``h' = o*tanh(c')``.
    """
    g = b.add(n.affine, b.add(n.concat, x, h))
    i = b.add(n.sigmoid, b.add(n.gates[0], g))
    f = b.add(n.sigmoid, b.add(n.gates[1], g))
    o = b.add(n.sigmoid, b.add(n.gates[2], g))
    u = b.add(n.tanh, b.add(n.gates[3], g))
    c2 = b.add(n.add, b.add(n.cmult, f, c), b.add(n.cmult, i, u))
    return b.add(n.cmult, o, b.add(n.tanh, c2)), c2


@dataclass(frozen=True, slots=True)
class GRUNames:
    """Op names of one primitive GRU cell (one parameter set)."""

    concat: str
    gates_affine: str
    cand_affine: str
    r: str
    z: str
    sigmoid: str
    tanh: str
    cmult: str
    add: str
    one_minus: str

    @classmethod
    def declare(cls, ops: OpSet, weight: str, in_dim: int, hidden: int) -> GRUNames:
        """Declare the ops of a GRU cell reading ``[x; h]`` with weights ``weight.*``."""
        return cls(
            concat=ops.concat(in_dim, hidden),
            gates_affine=ops.affine(f"{weight}.rz", in_dim + hidden, 2 * hidden),
            cand_affine=ops.affine(f"{weight}.c", in_dim + hidden, hidden),
            r=ops.slice(0, hidden, 2 * hidden),
            z=ops.slice(hidden, 2 * hidden, 2 * hidden),
            sigmoid=ops.unary("sigmoid", hidden),
            tanh=ops.unary("tanh", hidden),
            cmult=ops.binary("cmult", hidden),
            add=ops.binary("add", hidden),
            one_minus=ops.unary("one_minus", hidden),
        )


def emit_gru(b: GraphBuilder, n: GRUNames, x: int, h: int) -> int:
    """Emit one GRU step as primitives; return ``h'``.

    ``r, z = sigmoid(W_rz [x; h] + b)``; ``c = tanh(W_c [x; r*h] + b)``;
    ``h' = z*h + (1 - z)*c``.
    """
    rz = b.add(n.gates_affine, b.add(n.concat, x, h))
    r = b.add(n.sigmoid, b.add(n.r, rz))
    z = b.add(n.sigmoid, b.add(n.z, rz))
    c = b.add(n.tanh, b.add(n.cand_affine, b.add(n.concat, x, b.add(n.cmult, r, h))))
    return b.add(n.add, b.add(n.cmult, z, h), b.add(n.cmult, b.add(n.one_minus, z), c))
