"""The compiled passes of ``edbatch.api._bulk_scan`` against their numpy formulations (the
code they replaced), on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from edbatch.api._bulk_scan import (
    batch_rows,
    block_operands,
    read_layout,
    read_runs,
    type_edges,
    type_order,
    type_scan,
    typed_layout,
)


def _random(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(batch_of, ptr, operands, consumer, k)``: nodes in ``k`` batches, those of batch
    ``b`` reading ``arity[b]`` (0-3) earlier nodes each (batch 0: none, node 0's)."""
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 60)), int(rng.integers(1, 6))
    batch_of = rng.integers(0, k, n).astype(np.int64)
    batch_of[0] = 0
    arity = np.concatenate([[0], rng.integers(0, 4, k - 1)])
    counts = arity[batch_of]
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    consumer = np.repeat(np.arange(n, dtype=np.int64), counts)
    operands = (rng.random(len(consumer)) * np.maximum(consumer, 1)).astype(np.int32)
    return batch_of, ptr, operands, consumer, k


@pytest.mark.parametrize("seed", range(8))
def test_batch_rows_and_type_edges_match_numpy(seed: int) -> None:
    batch_of, ptr, operands, consumer, k = _random(seed)
    sizes, order, row_of = batch_rows(batch_of, k)
    want_order = np.argsort(batch_of, kind="stable")
    starts = np.cumsum(sizes) - sizes
    want_row = np.empty(len(batch_of), np.int64)
    want_row[want_order] = np.arange(len(batch_of)) - np.repeat(starts, sizes)
    assert sizes.tolist() == np.bincount(batch_of, minlength=k).tolist()
    assert order.tolist() == want_order.tolist()
    assert row_of.tolist() == want_row.tolist()
    edge = np.bincount(batch_of[operands] * k + batch_of[consumer], minlength=k * k)
    assert type_edges(batch_of, ptr, operands, k).tolist() == edge.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_read_layout_matches_numpy(seed: int) -> None:
    batch_of, ptr, operands, consumer, k = _random(seed)
    _, _, row_of = batch_rows(batch_of, k)
    sizes = np.bincount(batch_of, minlength=k)
    bc = batch_of[consumer]
    edges = np.bincount(bc, minlength=k)
    e0 = np.cumsum(edges) - edges
    pos = e0[bc] + (np.arange(len(operands)) - ptr[consumer]) * sizes[bc] + row_of[consumer]
    assert sorted(pos.tolist()) == list(range(len(pos)))  # (a tiling)
    pb, lr = np.empty_like(pos), np.empty_like(pos)
    pb[pos], lr[pos] = batch_of[operands], row_of[operands]
    got = read_layout(operands, ptr, batch_of, row_of, sizes)
    assert [a.tolist() for a in got] == [pb.tolist(), lr.tolist(), e0.tolist(), edges.tolist()]


def test_block_operands_node_major() -> None:
    # blocks: (operand position, first node, n, offset): 3 nodes x 2 slots, 2 nodes x 1 slot
    b = np.array([[0, 10, 3, 5], [6, 20, 2, 7]], np.int64)
    firsts = np.array([100, 200, 300], np.int64)  # offsets 5, 6 (block 0), 7 (block 1)
    values, cnt = block_operands(b, firsts, 5)
    assert values.tolist() == [100, 200, 101, 201, 102, 202, 300, 301]
    assert cnt.tolist() == [6, 2]


@pytest.mark.parametrize("seed", range(8))
def test_read_runs_match_numpy(seed: int) -> None:
    """Against the cumulative-sum formulation it replaced: runs of consecutive rows of one
    batch (slices) and the producer batches of every other read."""
    rng = np.random.default_rng(seed)
    k, m = int(rng.integers(1, 5)), int(rng.integers(2, 80))
    pb = rng.integers(0, k, m).astype(np.int64)
    lr = rng.integers(0, 6, m).astype(np.int64)
    for a in range(0, m, 7):  # some slices
        pb[a:a + 5] = pb[a]
        lr[a:a + 5] = lr[a] + np.arange(len(lr[a:a + 5]))
    cuts = np.unique(np.concatenate([[0, m], rng.integers(1, m, int(rng.integers(0, 8)))]))
    lo, hi = cuts[:-1], cuts[1:]
    whole, hit = read_runs(pb, lr, lo, hi, k)
    bad = (pb[1:] != pb[:-1]) | (lr[1:] != lr[:-1] + 1)
    cut = np.concatenate([[0], np.cumsum(bad)])
    assert whole.tolist() == (cut[hi - 1] == cut[lo]).tolist()
    rows = np.repeat(np.arange(len(lo)), hi - lo)
    want = np.bincount(rows * k + pb, minlength=len(lo) * k).reshape(-1, k) > 0
    for r in np.flatnonzero(~whole):
        assert hit[r].tolist() == want[r].tolist()


@pytest.mark.parametrize("seed", range(8))
def test_type_scan_matches_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    op_ids = rng.integers(0, int(rng.integers(1, 20)), int(rng.integers(1, 80))).astype(np.int32)
    present = np.bincount(op_ids)  # (the numpy formulation typed_program used)
    types = np.flatnonzero(present)
    lut = np.zeros(len(present), np.int64)
    lut[types] = np.arange(len(types))
    t_node = lut[op_ids]
    first = np.full(len(types), len(op_ids), np.int64)
    first[t_node[::-1]] = np.arange(len(op_ids) - 1, -1, -1)
    got = type_scan(op_ids)
    assert [a.tolist() for a in got] == [types.tolist(), present[types].tolist(),
                                         t_node.tolist(), first.tolist()]


@pytest.mark.parametrize("seed", range(12))
def test_type_order_matches_its_python_twin(seed: int) -> None:
    """Random type graphs: acyclic ones (ties broken by first node) and, every third seed,
    reads of any node (edges within a type, cycles: no order)."""
    from edbatch.api._typed import _type_order
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 7))
    n = k + int(rng.integers(0, 30))
    t_node = np.concatenate([rng.permutation(k), rng.integers(0, k, n - k)]).astype(np.int64)
    rank = rng.permutation(k)  # reads go to lower-ranked types (but see above)
    reads: list[list[int]] = []
    for v in range(n):
        lower = [u for u in range(n) if seed % 3 == 0 or rank[t_node[u]] < rank[t_node[v]]]
        reads.append([int(rng.choice(lower)) for _ in range(int(rng.integers(0, 3)))]
                     if lower else [])
    ptr = np.cumsum([0] + [len(r) for r in reads]).astype(np.int64)
    ops = np.array([u for r in reads for u in r], np.int32)
    first = np.array([int(np.flatnonzero(t_node == t)[0]) for t in range(k)], np.int64)
    want = _type_order(t_node, first.tolist(), ops, ptr)
    got = type_order(t_node, ptr, ops, first, k)
    assert (want is None and len(got) == 0) or got.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_typed_layout_is_the_passes_it_joins(seed: int) -> None:
    """One call against type_scan, type_order, the numpy between them and batch_rows, as
    typed_program made them before (random op ids and reads; cycles every third seed)."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 7))
    n = k + int(rng.integers(0, 40))
    op_ids = np.concatenate([rng.permutation(k) * 3 + 1, rng.integers(0, k, n - k) * 3 + 1]
                            ).astype(np.int32)
    level = rng.permutation(k)
    reads = [[int(u) for u in rng.choice(v, int(rng.integers(0, 3)))
              if seed % 3 == 0 or level[op_ids[u] // 3] < level[op_ids[v] // 3]]
             if v else [] for v in range(n)]
    ptr = np.cumsum([0] + [len(r) for r in reads]).astype(np.int64)
    operands = np.array([u for r in reads for u in r], np.int32)
    types, present, t_node, first = type_scan(op_ids)
    rank = type_order(t_node, ptr, operands, first, len(types))
    got = typed_layout(op_ids, ptr, operands)
    assert [a.tolist() for a in got[:3]] == [types.tolist(), present.tolist(), rank.tolist()]
    if not len(rank):
        assert all(len(a) == 0 for a in got[3:])
        return
    batch_of = rank[t_node]
    sizes, order, row_of = batch_rows(batch_of, len(types))
    want = [types[np.argsort(rank)], batch_of, sizes, order, row_of, order.astype(np.int32)]
    assert [(a.dtype, a.tolist()) for a in got[3:]] == [(a.dtype, a.tolist()) for a in want]
    assert seed % 3 == 0 or len(rank) == k


def test_typed_layout_orders_no_more_than_2_15_types() -> None:
    # (typed_program refuses that many: no k * k type edge table is made for them)
    op_ids = np.arange(1 << 15, dtype=np.int32)
    got = typed_layout(op_ids, np.zeros(len(op_ids) + 1, np.int64), np.zeros(0, np.int32))
    assert len(got[0]) == 1 << 15 and all(len(a) == 0 for a in got[2:])
    small = typed_layout(op_ids[:5], np.zeros(6, np.int64), np.zeros(0, np.int32))
    assert small[2].tolist() == list(range(5))
