"""The benchmark's models written as a user writes them: per-instance code on ``edbatch.api``.

Each ``record_*`` function records one mini-batch into a :class:`~edbatch.api.DynamicBatch`
made by :meth:`DynamicBatch.from_workload <edbatch.api.DynamicBatch.from_workload>` (the
workload's fused cells, kernels and parameters): one ``with batch.instance():`` per data
instance, plain Python recursion or loops over the instance's structure, one built-in op call
per cell. The graph recorded is node for node the one the workload's own builder makes
(``tests/benchmarks/test_models_api.py`` checks it), so the ``api`` construction of
``benchmarks/throughput.py`` does the same work as ``+fastbuild`` after construction.

    batch = DynamicBatch.from_workload(wl, params)
    RECORDERS[wl.name](batch, wl, instances)
    out = batch.run("depth")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edbatch.api import DynamicBatch, Handle

__all__ = ["RECORDERS", "record_bilstm_tagger", "record_lattice_lstm", "record_tree_lstm"]


def record_tree_lstm(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """Tree-LSTM over SST trees: recursion over each parsed tree, a loss at every node."""
    leaf, internal, loss = (batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))
    add_loss, word_id = batch.add_loss, wl.word_vocab.id

    def encode(node: Any) -> Handle:
        kids = node.children
        if not kids:
            state = leaf(attr=word_id(node.word))
        elif len(kids) == 1:  # unary: pass the child's state through (none in SST)
            state = encode(kids[0])
        else:
            left = encode(kids[0])
            state = internal(left, encode(kids[1]))
        add_loss(loss(state, attr=node.label))
        return state

    for inst in instances:
        with batch.instance():
            encode(inst.tree)


def record_lattice_lstm(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """Lattice-LSTM: one arc cell per arc, a ``k``-ary sum per state with ``k`` incoming
    arcs, a loss per state (states in topological order)."""
    start = batch.op("lattice_lstm.start")
    arcs = (batch.op("lattice_lstm.char_arc"), batch.op("lattice_lstm.word_arc"))
    loss = batch.op("lattice_lstm.loss")
    sums: dict[int, Any] = {}
    add_loss = batch.add_loss
    for inst in instances:
        ptr, src, kind, token, tags = (inst.arc_ptr, inst.arc_src, inst.arc_kind,
                                       inst.arc_token, inst.tags)
        with batch.instance():
            states = [start()]
            for i in range(1, inst.num_states):
                incoming = [arcs[kind[a]](states[src[a]], attr=token[a])
                            for a in range(ptr[i], ptr[i + 1])]
                if len(incoming) == 1:
                    state = incoming[0]
                else:
                    k = len(incoming)
                    op = sums.get(k) or sums.setdefault(k, batch.op(f"lattice_lstm.sum{k}"))
                    state = op(*incoming)
                states.append(state)
                add_loss(loss(state, attr=tags[i]))


def record_bilstm_tagger(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """2-layer BiLSTM tagger: embeddings, four recurrences, an MLP loss per token."""
    lookup, zero = batch.op("bilstm.lookup"), batch.op("bilstm.zero_state")
    l1f, l1b, l2f, l2b = (batch.op(f"bilstm.{d}")
                          for d in ("l1_fwd", "l1_bwd", "l2_fwd", "l2_bwd"))
    loss = batch.op("bilstm.loss")
    add_loss = batch.add_loss
    for inst in instances:
        n = len(inst)
        with batch.instance():
            xs = [lookup(attr=w) for w in inst.word_ids]
            f1, b1, f2, b2 = [None] * n, [None] * n, [None] * n, [None] * n
            s = zero()
            for t in range(n):
                s = f1[t] = l1f(xs[t], s)
            s = zero()
            for t in reversed(range(n)):
                s = b1[t] = l1b(xs[t], s)
            s = zero()
            for t in range(n):
                s = f2[t] = l2f(f1[t], b1[t], s)
            s = zero()
            for t in reversed(range(n)):
                s = b2[t] = l2b(f1[t], b1[t], s)
            for t, tag in enumerate(inst.tag_ids):
                add_loss(loss(f2[t], b2[t], attr=tag))


#: Workload name -> recorder.
RECORDERS: dict[str, Callable[[DynamicBatch, Any, Sequence[Any]], None]] = {
    "tree_lstm": record_tree_lstm, "lattice_lstm": record_lattice_lstm,
    "bilstm_tagger": record_bilstm_tagger}
