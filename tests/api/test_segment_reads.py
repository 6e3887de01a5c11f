"""How ``run_programs`` reads earlier segments' values: one value node per operand (so a
segment's structure, and its cache entry, does not depend on which earlier nodes it reads),
value sources spread over many batches joined once, yields of several shapes in one round."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edbatch.api import DynamicBatch
from edbatch.api._segments import segment_state
from edbatch.api._values import MERGE_AT, Values

D = 3


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * D, D).double()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.cat([a, b], -1))


def _model() -> tuple[DynamicBatch, nn.Linear, _Pair, object, object]:
    torch.manual_seed(0)
    lin, pair = nn.Linear(D, D).double(), _Pair()
    batch = DynamicBatch(dtype=torch.float64)
    return batch, lin, pair, batch.cell(lin, "lin", [D], D), batch.cell(pair, "pair",
                                                                          [D, D], D)


def _program(batch, cell, pair, x, k, j):  # type: ignore[no-untyped-def]
    feats = [batch.input(x)]
    for _ in range(3):
        feats.append(cell(feats[-1]))
    yield feats[-1]
    return (yield pair(feats[k], feats[j]))  # which earlier nodes: by instance


def _reference(lin: nn.Linear, pair: _Pair, x: torch.Tensor, k: int, j: int
               ) -> torch.Tensor:
    feats = [x]
    for _ in range(3):
        feats.append(lin(feats[-1]))
    return pair(feats[k], feats[j])


def test_segments_reading_other_earlier_nodes_hit_the_cache() -> None:
    batch, lin, pair, cell, c_pair = _model()
    xs = torch.randn(3, D, dtype=torch.float64)
    first, second = [(0, 1), (1, 2), (2, 3)], [(0, 1), (2, 3), (1, 3)]
    with torch.no_grad():
        # the first mini-batch registers the value op (new kernels: a new cache); then one
        # node read twice, and nodes read in another order, record the same pattern
        for ks in (first, second, [(2, 2), (3, 0), (1, 1)], [(3, 3), (0, 0), (2, 1)]):
            out = batch.run_programs([_program(batch, cell, c_pair, x, k, j)
                                      for x, (k, j) in zip(xs, ks)], grad=False)
            for got, x, (k, j) in zip(out.returns, xs, ks, strict=True):
                assert torch.allclose(got, _reference(lin, pair, x, k, j), atol=1e-12)
            assert out.syncs == 2
            cache = segment_state(batch).cache
            if ks is second:
                misses = cache.misses
            elif ks is not first:  # the same recorded pattern: every segment hits
                assert cache.misses == misses


def _values(parts: list[torch.Tensor]) -> Values:
    values = Values()
    values.outputs.extend(parts)
    sizes = [p.shape[0] for p in parts]
    values.grow(sum(sizes))
    values.batch[:] = np.repeat(np.arange(len(parts)), sizes)
    values.row[:] = np.concatenate([np.arange(s) for s in sizes])
    return values


def test_a_read_over_many_batches_joins_them_once() -> None:
    parts = [torch.randn(2, 4) for _ in range(MERGE_AT + 2)]
    values = _values(parts)
    want = torch.cat(parts)
    nodes = np.array([11, 0, 5, 3, 3, 8], dtype=np.int64)
    assert torch.equal(values.gather(nodes), want[nodes])
    assert len(values.outputs) == len(parts) + 1  # joined into one new source
    back = nodes[::-1].copy()
    assert torch.equal(values.gather(back), want[back])
    assert len(values.outputs) == len(parts) + 1  # not joined again


def test_row_views_of_one_arena_are_joined_without_a_copy() -> None:
    arena = torch.randn(20, 4)
    starts = [0, 3, 7, 10, 12, 15]
    parts = [arena.narrow(0, s, 2) for s in starts]
    values = _values(parts)
    nodes = np.arange(2 * len(starts), dtype=np.int64)[::-1].copy()
    rows = np.concatenate([[s, s + 1] for s in starts])[nodes]
    assert torch.equal(values.gather(nodes), arena[rows])
    assert values.outputs[-1] is arena


def test_one_round_of_yields_of_several_shapes_and_lists() -> None:
    torch.manual_seed(0)
    batch = DynamicBatch(dtype=torch.float64)
    a, b = nn.Linear(D, D).double(), nn.Linear(D, 2).double()
    ca, cb = batch.cell(a, "a", [D], D), batch.cell(b, "b", [D], 2)
    xs = torch.randn(3, D, dtype=torch.float64)

    def program(i: int):  # type: ignore[no-untyped-def]
        h = batch.input(xs[i])
        if i == 0:
            return (yield ca(h))
        if i == 1:
            return (yield cb(h))
        return (yield [ca(h), ca(ca(h))])

    with torch.no_grad():
        out = batch.run_programs([program(i) for i in range(3)], grad=False)
        assert torch.allclose(out.returns[0], a(xs[0]), atol=1e-12)
        assert out.returns[1].shape == (2,)
        assert torch.allclose(out.returns[1], b(xs[1]), atol=1e-12)
        assert torch.allclose(out.returns[2], torch.stack([a(xs[2]), a(a(xs[2]))]),
                              atol=1e-12)
    assert out.syncs == 1
