"""Synthetic typed DAGs for training, property tests and scheduler stress tests.

Every generator takes a ``numpy`` :class:`~numpy.random.Generator` and returns a
:class:`~edbatch.graph.Graph` over an abstract vocabulary (:func:`synthetic_vocab`): batchable
op types ``t0 .. t{K-1}`` of kind ``"abstract"`` with unchecked shapes, one unbatchable
``solo`` type and the unbatchable :data:`~edbatch.workloads.base.LOSS_SUM`. Op ids are
``t<k> -> k``, ``solo -> K``, ``loss_sum -> K + 1``. Each generated structure (tree, chain,
lattice, DAG) is one instance of the graph.

Example:
    >>> import numpy as np
    >>> g = random_binary_trees(np.random.default_rng(0), num_trees=2, max_leaves=5)
    >>> g.num_instances, set(g.vocab.names[i] for i in g.op_ids.tolist()) <= {"t0", "t1"}
    (2, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edbatch.errors import GraphError, UnknownNameError, did_you_mean
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.workloads.base import Workload, loss_sum_op

__all__ = [
    "SOLO",
    "SyntheticWorkload",
    "chains",
    "random_binary_trees",
    "random_dag",
    "random_lattices",
    "synthetic_vocab",
]

#: Name of the unbatchable op type of synthetic graphs.
SOLO = "solo"

#: Op types used by the tree and lattice generators.
_TREE_TYPES = 2  # t0 = leaf, t1 = internal node
_LATTICE_TYPES = 4  # t0 = char arc, t1 = word arc, t2 = state (sum of arcs), t3 = start


def synthetic_vocab(num_types: int) -> Vocab:
    """``t0 .. t{K-1}`` (batchable, abstract), ``solo`` and ``loss_sum`` (unbatchable)."""
    if num_types < 1:
        raise GraphError(f"num_types must be >= 1, got {num_types}")
    ops = [OpType(f"t{k}", "abstract", None, ()) for k in range(num_types)]
    ops.append(OpType(SOLO, "abstract", None, (), batchable=False))
    ops.append(loss_sum_op(()))
    return Vocab(ops)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"{name} must be an integer >= 1, got {value!r}")


def _check_options(options: dict[str, Any]) -> None:
    """A synthetic workload's generator options (``num_nodes=-4`` failed in numpy at the
    first graph): counts integers >= 1, ``max_fan_in`` >= 0, ``unbatchable_prob`` in
    [0, 1], ``max_span`` >= 1 or None."""
    _check_positive(**{k: v for k, v in options.items() if k not in (
        "max_fan_in", "unbatchable_prob", "max_span") or (k == "max_span" and v is not None)})
    fan_in, prob = options.get("max_fan_in", 0), options.get("unbatchable_prob", 0.0)
    if isinstance(fan_in, bool) or not isinstance(fan_in, int) or fan_in < 0:
        raise GraphError(f"max_fan_in must be an integer >= 0, got {fan_in!r}")
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob <= 1:
        raise GraphError(f"unbatchable_prob must be a number in [0, 1], got {prob!r}")


# ---------------------------------------------------------------------------- emitters
def _emit_tree(rng: np.random.Generator, b: GraphBuilder, max_leaves: int) -> list[int]:
    """A random binary tree: ``t0`` leaves merged pairwise by ``t1`` nodes; returns the root."""
    num_leaves = int(rng.integers(1, max_leaves + 1))
    roots = [b.add(0) for _ in range(num_leaves)]
    while len(roots) > 1:  # merge a random adjacent pair: a random bracketing
        i = int(rng.integers(0, len(roots) - 1))
        roots[i:i + 2] = [b.add(1, roots[i], roots[i + 1])]
    return roots


def _emit_chain(rng: np.random.Generator, b: GraphBuilder, max_len: int,
                num_types: int) -> list[int]:
    """A chain of random length whose steps have random types; returns its last node."""
    length = int(rng.integers(1, max_len + 1))
    types = rng.integers(0, num_types, size=length).tolist()
    v = b.add(types[0])
    for t in types[1:]:
        v = b.add(t, v)
    return [v]


def _emit_lattice(rng: np.random.Generator, b: GraphBuilder, max_states: int,
                  max_span: int) -> list[int]:
    """A Lattice-LSTM-shaped DAG: state ``i`` sums a char arc from ``i-1`` and word arcs.

    Word arcs come from states ``j`` with ``2 <= i - j <= max_span``, each with probability
    1/2. Returns the final state.
    """
    num_states = int(rng.integers(1, max_states + 1))
    states = [b.add(3)]
    for i in range(1, num_states):
        arcs = [b.add(0, states[i - 1])]
        for j in range(max(0, i - max_span), i - 1):
            if rng.random() < 0.5:
                arcs.append(b.add(1, states[j]))
        states.append(b.add(2, *arcs))
    return [states[-1]]


def _emit_dag(rng: np.random.Generator, b: GraphBuilder, num_nodes: int, num_types: int,
              max_fan_in: int, unbatchable_prob: float, max_span: int | None) -> list[int]:
    """A random DAG of ``num_nodes`` nodes; returns its sinks (nodes without users)."""
    base = len(b)
    solo = num_types  # op id of "solo" in synthetic_vocab
    used = np.zeros(num_nodes, dtype=bool)
    for v in range(num_nodes):
        lo = 0 if max_span is None else max(0, v - max_span)
        fan_in = int(rng.integers(0, min(max_fan_in, v - lo) + 1))
        args: list[int] = []
        if fan_in:
            args = np.sort(lo + rng.choice(v - lo, size=fan_in, replace=False)).tolist()
            used[args] = True
        op = solo if rng.random() < unbatchable_prob else int(rng.integers(0, num_types))
        b.add(op, *(base + u for u in args))
    return (base + np.flatnonzero(~used)).tolist()


def _generate(vocab: Vocab, num: int, emit: Callable[[GraphBuilder], list[int]]) -> Graph:
    b = GraphBuilder(vocab)
    outputs: list[int] = []
    for i in range(num):
        b.instance = i
        outputs.extend(emit(b))
    return b.build(outputs)


# ---------------------------------------------------------------------------- generators
def random_binary_trees(rng: np.random.Generator, num_trees: int, max_leaves: int) -> Graph:
    """``num_trees`` random binary trees with 1..``max_leaves`` leaves each.

    Leaves are ``t0``, internal nodes ``t1`` (a Tree-LSTM / MV-RNN at cell granularity);
    the bracketing merges uniformly random adjacent pairs. Outputs are the roots.
    """
    _check_positive(num_trees=num_trees, max_leaves=max_leaves)
    return _generate(synthetic_vocab(_TREE_TYPES), num_trees,
                     lambda b: _emit_tree(rng, b, max_leaves))


def chains(rng: np.random.Generator, num_chains: int, max_len: int, num_types: int) -> Graph:
    """``num_chains`` chains of 1..``max_len`` nodes, each step of a uniform random type."""
    _check_positive(num_chains=num_chains, max_len=max_len, num_types=num_types)
    return _generate(synthetic_vocab(num_types), num_chains,
                     lambda b: _emit_chain(rng, b, max_len, num_types))


def random_lattices(rng: np.random.Generator, num: int, max_states: int,
                    max_span: int) -> Graph:
    """``num`` lattices with 1..``max_states`` states and word arcs spanning <= ``max_span``.

    Op types: ``t0`` char arc, ``t1`` word arc, ``t2`` state (reads its incoming arcs),
    ``t3`` start state. Outputs are the final states.
    """
    _check_positive(num=num, max_states=max_states, max_span=max_span)
    return _generate(synthetic_vocab(_LATTICE_TYPES), num,
                     lambda b: _emit_lattice(rng, b, max_states, max_span))


def random_dag(rng: np.random.Generator, num_nodes: int, num_types: int, max_fan_in: int,
               unbatchable_prob: float = 0.0, max_span: int | None = None) -> Graph:
    """One random DAG with ``num_types`` batchable types and bounded fan-in.

    Node ``v`` reads ``k`` distinct earlier nodes, ``k`` uniform in ``0..min(max_fan_in,
    candidates)``, drawn among all earlier nodes or, with ``max_span``, among
    ``v - max_span .. v - 1``. With probability ``unbatchable_prob`` a node is ``solo``
    (unbatchable), otherwise of a uniform type ``t0 .. t{K-1}``. Outputs are the sinks.
    """
    _check_positive(num_nodes=num_nodes, num_types=num_types)
    if max_fan_in < 0 or not 0.0 <= unbatchable_prob <= 1.0:
        raise GraphError(f"need max_fan_in >= 0 and 0 <= unbatchable_prob <= 1, got "
                         f"{max_fan_in} and {unbatchable_prob}")
    if max_span is not None and max_span < 1:
        raise GraphError(f"max_span must be >= 1 or None, got {max_span}")
    return _generate(synthetic_vocab(num_types), 1, lambda b: _emit_dag(
        rng, b, num_nodes, num_types, max_fan_in, unbatchable_prob, max_span))


# ---------------------------------------------------------------------------- workload
_KINDS: dict[str, tuple[dict[str, Any], Callable[..., list[int]], Callable[..., int]]] = {
    # kind: (default generator kwargs, emitter, number of op types from the kwargs)
    "dag": (dict(num_nodes=50, num_types=3, max_fan_in=4, unbatchable_prob=0.0, max_span=30),
            _emit_dag, lambda num_types, **_: num_types),
    "trees": (dict(max_leaves=40), _emit_tree, lambda **_: _TREE_TYPES),
    "chains": (dict(max_len=30, num_types=3), _emit_chain, lambda num_types, **_: num_types),
    "lattices": (dict(max_states=30, max_span=4), _emit_lattice, lambda **_: _LATTICE_TYPES),
}
_SPLITS = {"train": (0, 0.8), "dev": (1, 0.1), "test": (2, 0.1)}


class SyntheticWorkload(Workload):
    """Generated instances exposed as a workload (splits ``train``/``dev``/``test``).

    An instance is a per-instance seed; :meth:`emit` regenerates its structure from it, so
    graphs are reproducible and splits never overlap. The mini-batch graph ends with the
    unbatchable ``loss_sum`` like every real workload.

    Args:
        kind: ``"dag"``, ``"trees"``, ``"chains"`` or ``"lattices"``.
        granularity: validated but ignored (synthetic ops are already abstract cells).
        num_instances: instances over all splits (80% train, 10% dev, 10% test).
        seed: base seed of every instance.
        data_dir: unused; accepted for a uniform workload constructor.
        **kwargs: generator options for one instance, e.g. ``num_nodes=40`` for ``"dag"``,
            ``max_leaves=20`` for ``"trees"`` (see the generator functions).

    Example:
        >>> w = SyntheticWorkload("trees", num_instances=10, max_leaves=6)
        >>> len(w.load("train")), w.minibatch("train", [0, 1]).num_instances
        (8, 2)
    """

    name = "synthetic"
    granularities = ("cell",)  # synthetic ops are already abstract cells

    def __init__(self, kind: str = "dag", granularity: str = "cell", num_instances: int = 256,
                 seed: int = 0, data_dir: str | Path | None = None, **kwargs: Any) -> None:
        super().__init__(granularity, data_dir)
        if kind not in _KINDS:
            raise UnknownNameError(f"unknown synthetic kind {kind!r}; expected one of "
                                   f"{sorted(_KINDS)}." + did_you_mean(kind, _KINDS))
        defaults, self._emitter, count = _KINDS[kind]
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise UnknownNameError(f"unknown option(s) {sorted(unknown)} for synthetic kind "
                                   f"{kind!r}; valid options: {sorted(defaults)}")
        _check_positive(num_instances=num_instances)
        self.kind, self.seed, self.num_instances = kind, seed, num_instances
        self.options = {**defaults, **kwargs}
        _check_options(self.options)
        self.vocab = synthetic_vocab(count(**self.options))

    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``."""
        return tuple(_SPLITS)

    def _load(self, split: str) -> Sequence[Any]:
        index, share = _SPLITS[split]
        size = max(1, round(share * self.num_instances))
        return [(self.seed, index, i) for i in range(size)]

    def emit(self, instance: Any, builder: GraphBuilder) -> list[int]:
        """Generate the instance with seed ``instance`` into ``builder``; return its outputs."""
        rng = np.random.default_rng(list(instance))
        return self._emitter(rng, builder, **self.options)  # type: ignore[no-any-return]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Synthetic ops read no parameters."""
        return {}

    def __repr__(self) -> str:
        return f"SyntheticWorkload(kind={self.kind!r}, ops={len(self.vocab)})"
