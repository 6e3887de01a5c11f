"""A tighter lower bound on the fewest batches: shortest common supersequences of paths.

ED-Batch's LB (:func:`~edbatch.schedule.bounds.lower_bound`) sums, over op types, the longest
same-type chain. Each chain is met on its own, but the chains of different types lie on
different paths, and no schedule need run them in one order. The bound here uses the order:

* the nodes of one path run in distinct batches, in path order, so the sequence of op types
  of a schedule's batches contains the op-type sequence of **every** path as a subsequence;
* hence a schedule has at least ``SCS(p_1, ..., p_k)`` batchable batches for any paths
  ``p_i`` (their batchable op-type sequences; ``SCS`` = the length of a shortest common
  supersequence), plus one step per unbatchable node.

Conversely a shortest common supersequence of *all* paths can be run as a schedule (each
node at the first position of its type after its operands), so the bound is exact in the
limit; :func:`path_lower_bound` takes the sequences of a few long paths (longest weighted
paths for one-hot, uniform and seeded random op-type weights, from the best sources), the
SCS of every pair, and of three for the best pairs extended by each other path, and returns
``max(LB, best)``. Two chains ``a b`` and ``b a`` show the gap: LB 2, both bounds 3.

Not a hot path: a few seconds per lattice mini-batch of 64 (dominated by the ``SCS`` of
three ~240-long sequences, ``O(n^3)``, compiled in :mod:`edbatch.schedule._compiled_scs`;
:func:`scs_length` is its Python twin). ``benchmarks/dump_protocol.py`` reports it beside LB.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from edbatch.errors import ScheduleError
from edbatch.graph.ir import Graph
from edbatch.schedule.bounds import longest_from, lower_bound

__all__ = ["PathBound", "candidate_paths", "path_lower_bound", "scs_length"]


@dataclass(frozen=True)
class PathBound:
    """Result of :func:`path_lower_bound`.

    Attributes:
        bound: proven lower bound on the batches of any schedule, ``>= lower_bound``.
        lower_bound: ED-Batch's LB of the same graph.
        paths: the batchable op-type sequences of the paths behind ``bound`` (empty when LB
            was larger).
        candidates: how many distinct path sequences were compared.
    """

    bound: int
    lower_bound: int
    paths: tuple[tuple[int, ...], ...]
    candidates: int

    @property
    def gain(self) -> float:
        """``bound / lower_bound`` (1.0 for an empty graph)."""
        return self.bound / self.lower_bound if self.lower_bound else 1.0


def scs_length(seqs: Sequence[Sequence[int]]) -> int:
    """Length of a shortest common supersequence of ``seqs`` (Python, any number of them).

    Exponential in ``len(seqs)``: the oracle of the compiled kernels, for short sequences.
    """
    seqs = [tuple(s) for s in seqs]

    @functools.cache
    def rest(pos: tuple[int, ...]) -> int:
        nxt = {s[p] for s, p in zip(seqs, pos) if p < len(s)}
        if not nxt:
            return 0
        return 1 + min(rest(tuple(p + (p < len(s) and s[p] == x) for s, p in zip(seqs, pos)))
                       for x in nxt)

    return rest(tuple(0 for _ in seqs))


def _trace(graph: Graph, best: NDArray[np.int64], weight: NDArray[np.int64],
           start: int) -> list[int]:
    """Op ids along one path from ``start`` that attains ``best[start]``."""
    uptr, uids = graph.users
    ops, v = [], start
    while True:
        op = int(graph.op_ids[v])
        ops.append(op)
        users = uids[uptr[v]:uptr[v + 1]]
        if not len(users):
            return ops
        want = best[v] - weight[op]
        v = int(users[np.argmax(best[users] == want)])


def candidate_paths(graph: Graph, *, random_weights: int = 30, starts: int = 8,
                    seed: int = 0) -> list[tuple[int, ...]]:
    """Distinct batchable op-type sequences of long paths (see the module docstring)."""
    k = len(graph.vocab)
    batchable = graph.vocab.batchable
    rng = np.random.default_rng(seed)
    weights = [np.eye(k, dtype=np.int64)[t] * 1000 + 1 for t in range(k) if batchable[t]]
    weights.append(np.ones(k, dtype=np.int64))
    weights += [rng.integers(1, 100, size=k) for _ in range(random_weights)]
    roots = np.flatnonzero(graph.arity == 0)
    seen: dict[tuple[int, ...], None] = {}
    for w in weights:
        w = np.where(batchable, w, 0).astype(np.int64)
        best = longest_from(graph, w[graph.op_ids])  # the heaviest path from each node
        top = roots[np.argsort(-best[roots], kind="stable")[:starts]]
        for s in top:
            seq = tuple(op for op in _trace(graph, best, w, int(s)) if batchable[op])
            seen.setdefault(seq, None)
    return list(seen)


def _best_scs(arrs: list[NDArray[np.int32]], pairs: int, max_cells: int
              ) -> tuple[int, tuple[int, ...]]:
    """The largest SCS length over single paths, every pair, and the best ``pairs`` pairs
    extended by each other path (triples over ``max_cells`` DP cells skipped), and which."""
    from edbatch.schedule._compiled_scs import scs2, scs3

    used: tuple[int, ...] = ()
    best = 0
    for i, a in enumerate(arrs):
        if len(a) > best:
            best, used = len(a), (i,)
    scored = []
    for i, j in itertools.combinations(range(len(arrs)), 2):
        v = scs2(arrs[i], arrs[j])
        scored.append((v, i, j))
        if v > best:
            best, used = v, (i, j)
    scored.sort(key=lambda t: (-t[0], t[1], t[2]))
    for _, i, j in scored[:pairs]:
        for q in range(len(arrs)):
            if q in (i, j) or (len(arrs[i]) + 1) * (len(arrs[j]) + 1) * (len(arrs[q]) + 1) \
                    > max_cells:
                continue
            v = scs3(arrs[i], arrs[j], arrs[q])
            if v > best:
                best, used = v, (i, j, q)
    return best, used


def path_lower_bound(graph: Graph, *, random_weights: int = 30, starts: int = 8,
                     pairs: int = 5, max_cells: int = 50_000_000, seed: int = 0) -> PathBound:
    """A lower bound on the batches of every schedule of ``graph``, at least ED-Batch's LB.

    Args:
        graph: the graph.
        random_weights: seeded random op-type weightings whose longest paths are candidates.
        starts: sources traced per weighting (those with the largest weighted path).
        pairs: the best pairs (by their SCS) each extended by every other candidate to a
            triple.
        max_cells: a triple whose DP has more cells (product of the lengths + 1) is skipped.
        seed: seed of the random weightings.

    Returns:
        A :class:`PathBound`; deterministic for a given graph and arguments.

    Raises:
        ScheduleError: a negative count or ``starts < 1``.
    """
    if min(random_weights, pairs, max_cells) < 0 or starts < 1:
        raise ScheduleError(f"path_lower_bound needs random_weights, pairs, max_cells >= 0 and "
                            f"starts >= 1; got {random_weights}, {pairs}, {max_cells}, {starts}")
    lb = lower_bound(graph)
    if graph.num_nodes == 0:
        return PathBound(0, 0, (), 0)
    unbatchable = int((~graph.batchable_node).sum())
    seqs = candidate_paths(graph, random_weights=random_weights, starts=starts, seed=seed)
    best, used = _best_scs([np.asarray(s, dtype=np.int32) for s in seqs], pairs, max_cells)
    bound = best + unbatchable
    if bound <= lb:
        return PathBound(lb, lb, (), len(seqs))
    return PathBound(bound, lb, tuple(seqs[i] for i in used), len(seqs))
