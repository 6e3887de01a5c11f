"""Op-type vocabularies by name: a policy sees the op types a mini-batch *uses*.

A :class:`~edbatch.api.DynamicBatch` registers op types as the program meets them
(``input/<shape>`` on the first :meth:`~edbatch.api.DynamicBatch.input` of a shape,
``embedding<k>`` on the first lookup, ``value/<shape>`` when a segment of
:meth:`~edbatch.api.DynamicBatch.run_programs` first takes over earlier values, ``loss_sum``
only in mini-batches with losses), so the
vocabulary of its graphs can grow while the program runs. A policy's table refers to op
types by id, so a graph is re-expressed in the policy's vocabulary, by name, before the
policy schedules it (:func:`to_vocab`): a mini-batch is refused only if it uses an op type
the policy never saw. Training graphs of different vocabularies are brought to their
union (:func:`union_vocab`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edbatch.errors import GraphError
from edbatch.graph import Graph, OpType, Vocab
from edbatch.schedule import Batch, Schedule

__all__ = ["VocabMap", "to_vocab", "union_vocab", "used_names"]


def used_names(graph: Graph) -> list[str]:
    """The names of the op types ``graph`` has nodes of, in op-id order."""
    names = graph.vocab.names
    return [names[i] for i in np.flatnonzero(graph.type_counts)]


def union_vocab(graphs: Sequence[Graph]) -> Vocab:
    """The op types of every graph, each name once, in order of first appearance."""
    ops: dict[str, OpType] = {}
    for g in graphs:
        for op in g.vocab:
            ops.setdefault(op.name, op)
    return Vocab(ops.values())


class VocabMap:
    """Maps graphs of one vocabulary onto the op-type names ``target`` (and schedules back).

    Op types of ``target`` the graphs' vocabulary lacks become placeholders (kind
    ``abstract``, no nodes); op types of the graphs that ``target`` lacks are allowed only
    while no node uses them.
    """

    def __init__(self, source: Vocab, target: Sequence[str]) -> None:
        own = {op.name: op for op in source}
        self.vocab = Vocab(own.get(n) or OpType(n, "abstract", None, (1,)) for n in target)
        self.missing = [n for n in source.names if n not in self.vocab]
        fwd = np.array([self.vocab.id(n) if n in self.vocab else -1 for n in source.names],
                       dtype=np.int64)
        self.fwd = fwd.astype(np.int32)
        self.back = np.full(len(self.vocab), -1, dtype=np.int64)
        ok = fwd >= 0
        self.back[fwd[ok]] = np.flatnonzero(ok)

    def graph(self, graph: Graph) -> Graph:
        """``graph`` over :attr:`vocab` (the same nodes; raises if it uses a missing op)."""
        if self.missing:
            used = set(used_names(graph)) & set(self.missing)
            if used:
                raise GraphError(f"this mini-batch uses op types {sorted(used)} that the "
                                 f"policy was not trained on (it knows {list(self.vocab.names)})"
                                 f"; train it on mini-batches that use them too, or run this "
                                 f"one with a scheduler name")
        return Graph.from_arrays(self.vocab, self.fwd[graph.op_ids], graph.operand_ptr,
                                 graph.operand_ids, attrs=graph.attrs, instance=graph.instance,
                                 outputs=graph.outputs, depth=graph.depth, validate=False)

    def schedule(self, schedule: Schedule) -> Schedule:
        """A schedule of the mapped graph as a schedule of the original one."""
        back = self.back
        return Schedule(tuple(Batch(int(back[b.op_id]), b.node_ids, b.forced)
                              for b in schedule.batches), schedule.scheduler, schedule.seconds)


def to_vocab(graph: Graph, vocab: Vocab) -> Graph:
    """``graph`` re-expressed over ``vocab`` by op-type name (see :class:`VocabMap`)."""
    if graph.vocab.names == vocab.names:
        return graph
    mapped = VocabMap(graph.vocab, vocab.names)
    mapped.vocab = vocab  # the caller's own op types (same names)
    return mapped.graph(graph)
