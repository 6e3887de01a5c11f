"""The compiled read planning of typed segments (``edbatch.api._read_plan.read_plan``)
against its Python twin, and ``_typed._reads`` built on it against the per-read Python it
replaced (kept here as ``_reads_before``), on random segments and a MoE run's segments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from edbatch.api import _segments, _typed
from edbatch.api._bulk_scan import batch_rows, read_layout, read_runs, type_order, type_scan
from edbatch.api._read_plan import read_plan, read_plan_py
from edbatch.api._typed import JOIN_AT, GatherGroup, GroupPart, SliceRead, WholeRead, _read

CPU = torch.device("cpu")


def _reads_before(ops: list[Any], operands: Any, ptr: Any, batch_of: Any, row_of: Any,
                  sizes: Any, device: torch.device) -> list[list[Any]]:
    """``_typed._reads`` as it was before :func:`read_plan` (the reference)."""
    k = len(sizes)
    size_l = sizes.tolist()
    made: list[list[Any]] = [[] for _ in range(k)]
    if not len(operands):
        return made
    pb, lr, e0, edges = read_layout(operands, ptr, batch_of, row_of, sizes)
    bounds: list[tuple[int, int, int, int]] = []
    for b, (op, lo) in enumerate(zip(ops, e0.tolist(), strict=True)):
        if op.arity is None:
            bounds.append((b, 0, lo, lo + int(edges[b])))
        else:
            bounds.extend((b, j, lo + j * size_l[b], lo + (j + 1) * size_l[b])
                          for j in range(op.arity))
    rb = np.array(bounds, np.int64).reshape(-1, 4)
    runs, hit = read_runs(pb, lr, rb[:, 2], rb[:, 3], k)
    whole = runs.tolist()
    used = {r: np.flatnonzero(hit[r]).tolist() for r, w in enumerate(whole) if not w}
    groups: dict[tuple[int, ...], list[tuple[int, int, int, int]]] = {}
    for r, (b, j, lo, hi) in enumerate(bounds):
        if whole[r]:
            first, src = int(lr[lo]), int(pb[lo])
            made[b].append((WholeRead if first == 0 and hi - lo == size_l[src] else SliceRead)(
                src, first, first + hi - lo))
        else:
            made[b].append(None)
            groups.setdefault(tuple(used[r]), []).append((b, j, lo, hi))
    for producers, members in groups.items():
        src = np.array(producers, np.int64)
        total = sum(hi - lo for _, _, lo, hi in members)
        if len(members) == 1 or int(sizes[src].sum()) > JOIN_AT * total:
            for b, j, lo, hi in members:
                made[b][j] = _read(pb[lo:hi], lr[lo:hi], sizes, device)
            continue
        at = np.zeros(k, np.int64)
        at[src] = np.cumsum(sizes[src]) - sizes[src]
        flat = np.concatenate([lr[lo:hi] + at[pb[lo:hi]] for _, _, lo, hi in members])
        group = GatherGroup(list(producers), torch.from_numpy(flat),
                            [hi - lo for _, _, lo, hi in members])
        for i, (b, j, _, _) in enumerate(members):
            made[b][j] = GroupPart(group, i)
    return made


def _desc(x: Any, seen: dict[int, int]) -> Any:
    """A comparable description of reads (a shared group numbered by first sight)."""
    if isinstance(x, list | tuple):
        return [_desc(y, seen) for y in x]
    if isinstance(x, torch.Tensor):
        return (str(x.dtype), x.tolist())
    if isinstance(x, GatherGroup):
        return ("group", seen.setdefault(id(x), len(seen)), x.batches, _desc(x.flat, seen),
                x.sizes)
    slots = getattr(type(x), "__slots__", None)
    if slots is not None:
        return (type(x).__name__, [_desc(getattr(x, s), seen) for s in slots])
    if hasattr(x, "__dict__"):
        return (type(x).__name__, {k: _desc(v, seen) for k, v in vars(x).items()})
    return x


def _inputs(graph: Any) -> tuple[Any, ...] | None:
    """``_reads``'s arguments for a segment, as ``typed_program`` makes them."""
    op_ids, ptr, operands = graph.op_ids, graph.operand_ptr, graph.operand_ids
    types, _, t_node, first = type_scan(op_ids)
    rank = type_order(t_node, ptr, operands, first, len(types))
    if not len(rank):
        return None
    ops = [graph.vocab[o] for o in types[np.argsort(rank)].tolist()]
    batch_of = rank[t_node]
    sizes, _, row_of = batch_rows(batch_of, len(types))
    return ops, operands, ptr, batch_of, row_of, sizes


def _check(graph: Any) -> int:
    """New against old reads and the compiled plan against its twin; the grouped reads."""
    got = _inputs(graph)
    assert got is not None
    ops, operands, ptr, batch_of, row_of, sizes = got
    new = _typed._reads(ops, operands, ptr, batch_of, row_of, sizes, CPU)
    old = _reads_before(ops, operands, ptr, batch_of, row_of, sizes, CPU)
    assert _desc(new, {}) == _desc(old, {})
    if not len(operands):
        return 0
    arity = np.array([-1 if op.arity is None else op.arity for op in ops], np.int64)
    fast = read_plan(operands, ptr, batch_of, row_of, sizes, arity)
    slow = read_plan_py(operands, ptr, batch_of, row_of, sizes, arity)
    for a, b in zip(fast[:6], slow[:6], strict=True):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
    rb, gid = fast[2], fast[4]
    grouped = np.zeros(len(fast[0]), np.bool_)
    for (_, _, lo, hi), g in zip(rb.tolist(), gid.tolist(), strict=True):
        grouped[lo:hi] = g >= 0
    assert fast[6][grouped].tolist() == slow[6][grouped].tolist()
    return int((gid >= 0).sum())


def _random_segment(seed: int) -> Any:
    """A qualifying segment: sources, then typed layers reading earlier types (fixed-arity
    types, and variadic nodes each alone of its type), rows drawn at random so reads are
    slices, gathers of one batch and gathers over several."""
    from edbatch.graph import Graph, OpType, Vocab
    rng = np.random.default_rng(seed)
    d = 4
    n_src = int(rng.integers(1, 4))
    layers = int(rng.integers(1, 5))
    ops_t: list[OpType] = [OpType(f"s{i}", "abstract", (), (d,)) for i in range(n_src)]
    op_ids: list[int] = []
    operands: list[list[int]] = []
    for i in range(n_src):
        for _ in range(int(rng.integers(1, 12))):
            op_ids.append(i)
            operands.append([])
    for layer in range(layers):
        variadic = rng.random() < 0.3
        arity = None if variadic else int(rng.integers(1, 4))
        t = len(ops_t)
        ops_t.append(OpType(f"l{layer}", "abstract",
                            None if arity is None else ((d,),) * arity, (d,)))
        n = 1 if variadic else int(rng.integers(1, 10))
        pool = np.array(range(len(op_ids)))
        for _ in range(n):
            m = int(rng.integers(1, 6)) if arity is None else arity
            if rng.random() < 0.4:  # consecutive rows of one earlier node run
                s = int(rng.integers(0, len(pool)))
                pick = [int(pool[min(s + i, len(pool) - 1)]) for i in range(m)]
            else:
                pick = rng.choice(pool, m).tolist()
            op_ids.append(t)
            operands.append(pick)
    ptr = np.cumsum([0] + [len(o) for o in operands])
    flat = np.array([v for o in operands for v in o], np.int32)
    return Graph.from_arrays(Vocab(ops_t), np.array(op_ids, np.int32), ptr, flat)


@pytest.mark.parametrize("seed", range(40))
def test_read_plan_matches_twin_and_old_reads_on_random_segments(seed: int) -> None:
    _check(_random_segment(seed))


def test_read_plan_matches_twin_and_old_reads_on_moe_segments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.moe_routing import _example
    from edbatch.workloads.moe import MoETagger
    workload = MoETagger(dim=16, expert_dim=16)
    insts = list(workload.load("train"))[:24]
    model = _example().MoE(workload)
    seen: list[Any] = []
    real = _segments.typed_program

    def keep(graph: Any, kernels: Any, device: torch.device) -> Any:
        seen.append(graph)
        return real(graph, kernels, device)

    monkeypatch.setattr(_segments, "typed_program", keep)
    model.run(insts, "typewise_greedy").loss.backward()
    assert len(seen) >= 3
    assert sum(_check(g) for g in seen) > 0  # (the experts' and combination's gathers)
