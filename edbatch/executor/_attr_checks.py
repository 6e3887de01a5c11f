"""Checks of attrs that index or count. In the kernels, where they read them (CPU; on other
devices unchecked rather than wait on the device): an id or label outside its table or
classes, or counts that do not match a batch's repeated operands, is a ``ValueError``
naming the batch row and the value (the executor names the batch and op type around it),
not torch's ``IndexError`` or rows paired with the wrong nodes. When a program is compiled
(every device): each node's operand count against the attr of a cell kind declaring
``counts_attr`` (:func:`check_operand_counts`, a ``GraphError`` naming the node).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.errors import GraphError
from edbatch.executor._fused import _jit
from edbatch.graph import Graph

__all__ = ["check_operand_counts", "check_range", "check_slot_counts", "embedding",
           "out_of_range"]


def check_slot_counts(counts: Tensor, sizes: Sequence[int]) -> None:
    """``ValueError`` unless the nodes' repeated-operand ``counts`` (CPU) match the slots'
    row counts ``sizes``: ``sizes[k]`` nodes count more than ``k``, none more than
    ``len(sizes)`` (else :func:`~edbatch.executor.kernels.slot_nodes` would pair rows with
    the wrong nodes)."""
    c = counts.numpy()
    k = len(sizes)
    bad = np.flatnonzero((c < 0) | (c > k))
    if len(bad):
        raise ValueError(
            f"row {int(bad[0])} of the batch has attr {int(c[bad[0]])}, but its nodes "
            f"have 0..{k} repeated operands; the attr must count the node's own operands "
            "after the fixed ones (e.g. its children)")
    have = np.bincount(c, minlength=k + 1)[::-1].cumsum()[::-1][1:].tolist()
    if have != list(sizes):
        raise ValueError(
            f"the nodes' attrs give {have} nodes with more than 0, 1, ... repeated operands, "
            f"the operands {list(sizes)}; the attr must count the node's own operands after "
            "the fixed ones (e.g. its children)")


def embedding(ids: Tensor, table: Tensor,
              fix: str = "its attr must be a row of the table (a vocabulary index)") -> Tensor:
    """``F.embedding(ids, table)`` (``ValueError`` naming an id outside the table's rows,
    then ``fix``)."""
    try:
        return F.embedding(ids, table)
    except IndexError:
        out_of_range(ids, table.shape[0], "id", f"{table.shape[0]} rows of the embedding table",
                     fix)
        raise


def out_of_range(values: Tensor, n: int, what: str, of: str, fix: str, low: int = 0) -> None:
    """Raise ``ValueError`` naming the first of ``values`` outside ``low .. n-1`` (if any)."""
    bad = torch.nonzero((values < low) | (values >= n)).view(-1)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"row {i} of the batch has {what} {int(values.view(-1)[i])}, outside "
                         f"{low}..{n - 1} ({of}); {fix}")


def check_range(values: Tensor, n: int, what: str, of: str, fix: str, low: int = 0) -> None:
    """:func:`out_of_range` where ``values`` are on the CPU (one numpy min and max when they
    are in range; elsewhere unchecked: no host sync)."""
    if values.device.type == "cpu" and values.numel():
        a = values.numpy()
        if a.min() < low or a.max() >= n:
            out_of_range(values, n, what, of, fix, low)


@_jit
def _first_miscount(op_ids, ptr, attrs, fixed, mask):  # type: ignore[no-untyped-def]
    """The first node whose op has a rule (``fixed[op] >= 0``) and whose attr (``&
    mask[op]``; ``mask`` -1: all of it) is negative or not its operand count after the first
    ``fixed[op]``; -1 if none (one pass; its twin: :func:`_first_miscount_numpy`)."""
    for v in range(op_ids.shape[0]):
        k = op_ids[v]
        f = fixed[k]
        if f >= 0:
            a = attrs[v]
            if a < 0 or (a & mask[k]) != ptr[v + 1] - ptr[v] - f:
                return v
    return -1


def _first_miscount_numpy(op_ids, ptr, attrs, fixed, mask):  # type: ignore[no-untyped-def]
    """:func:`_first_miscount` in numpy (the oracle of the compiled loop in the tests)."""
    f = fixed[op_ids]
    bad = (f >= 0) & ((attrs < 0) | ((attrs & mask[op_ids]) != np.diff(ptr) - f))
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else -1


def check_operand_counts(graph: Graph, rules: dict[str, tuple[int, int]]) -> None:
    """``GraphError`` naming the first node of an op type in ``rules`` whose attr does not
    count its repeated operands: ``rules[name] = (fixed, bits)``, the cell kind's
    ``counts_attr``: the node's operands after the first ``fixed`` are counted by its attr
    (its low ``bits`` bits; ``0``: the whole attr). Run once per compiled program, on every
    device (a host pass over the graph's arrays): a node whose attr miscounts would have its
    rows paired with another node's."""
    vocab, ptr = graph.vocab, graph.operand_ptr
    fixed = np.full(len(vocab), -1, dtype=np.int64)
    mask = np.full(len(vocab), -1, dtype=np.int64)
    for name, (f, bits) in rules.items():
        fixed[vocab.id(name)] = f
        mask[vocab.id(name)] = (1 << bits) - 1 if bits else -1
    v = int(_first_miscount(graph.op_ids, ptr, graph.attrs, fixed, mask))
    if v < 0:
        return
    name = vocab[int(graph.op_ids[v])].name
    f, bits = rules[name]
    attr, have = int(graph.attrs[v]), int(ptr[v + 1] - ptr[v]) - f
    got = attr & ((1 << bits) - 1) if bits else attr
    raise GraphError(
        f"node {v} (instance {int(graph.instance[v])}, op type {name!r}) has attr {attr}, "
        f"which counts {got} operands" + (f" after the first {f}" if f else "")
        + f", but the node has {have}; give it the count of those operands"
        + (f" in the attr's low {bits} bits" if bits else ""))
