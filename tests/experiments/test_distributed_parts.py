"""The parts of :class:`DataParallel`: balanced shards, the async count sum, and the gradient
sum over two real gloo ranks (sparse embedding rows, reused table buffers)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from edbatch.executor.distributed import DataParallel, instance_sizes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_weighted_shards_balance_the_cost_where_round_robin_does_not() -> None:
    items, weights = [10, 11, 12, 13, 14], [5.0, 4.0, 3.0, 3.0, 1.0]
    shares = [DataParallel(rank=r, world_size=2).shard(items, weights) for r in range(2)]
    # largest first to the least-loaded rank: 5 -> r0, 4 -> r1, 3 -> r1, 3 -> r0, 1 -> r1
    assert shares == [[10, 13], [11, 12, 14]]  # costs 8 and 8
    assert [DataParallel(rank=r, world_size=2).shard(items) for r in range(2)] == \
        [[10, 12, 14], [11, 13]]  # round robin: costs 9 and 7


@pytest.mark.parametrize("world", [2, 3, 5])
def test_weighted_shards_are_disjoint_ordered_and_within_one_item_of_even(world: int) -> None:
    gen = torch.Generator().manual_seed(world)
    items = sorted(torch.randperm(200, generator=gen)[:61].tolist())
    weights = (torch.rand(61, generator=gen) * 50 + 1).tolist()
    cost = dict(zip(items, weights, strict=True))
    shares = [DataParallel(rank=r, world_size=world).shard(items, weights)
              for r in range(world)]
    assert sorted(x for s in shares for x in s) == items
    assert all(s == sorted(s) for s in shares)
    loads = [sum(cost[x] for x in s) for s in shares]
    assert max(loads) - min(loads) <= max(weights)


def test_weights_must_match_the_items() -> None:
    with pytest.raises(ValueError, match="2 weights for 3 items"):
        DataParallel(rank=0, world_size=2).shard([1, 2, 3], [1.0, 2.0])


def test_instance_sizes_use_node_counts_else_lengths() -> None:
    class Tree:
        num_nodes = 7

    assert instance_sizes([Tree(), [1, 2], object()]).tolist() == [7.0, 2.0, 1.0]


def test_one_process_sum_async_is_the_identity() -> None:
    assert DataParallel().sum_async([1, 2.5, True]).result() == [1.0, 2.5, 1.0]
    pending = DataParallel().sum_grads_async({"W": torch.zeros(2)}, flags=[True, 3])
    assert pending.flags() == [1.0, 3.0]


def test_a_table_buffer_changed_in_place_is_not_reused() -> None:
    dp, p = DataParallel(), torch.zeros(4, 2)
    first = dp._dense_table("E", p, torch.tensor([1]), torch.ones(1, 2))
    again = dp._dense_table("E", p, torch.tensor([2]), torch.ones(1, 2))
    assert again is first and again[:, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    again.add_(5.0)  # e.g. an in-place gradient change by the caller
    fresh = dp._dense_table("E", p, torch.tensor([3]), torch.ones(1, 2))
    assert fresh is not first and fresh[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]


# two steps of two ranks: the rows each rank's embedding gradient holds, and its values
ROWS = {0: ([1, 3, 3], [2]), 1: ([3, 5], [0])}


def _local_grads(rank: int, step: int, sparse: bool) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    rows = torch.tensor(ROWS[rank][step])
    vals = torch.randn(len(rows), 3, generator=gen)
    table = torch.sparse_coo_tensor(rows.unsqueeze(0), vals, (6, 3)) if sparse else \
        torch.zeros(6, 3).index_add_(0, rows, vals)
    return {"E": table, "W": torch.randn(2, 2, generator=gen),
            "only0": torch.randn(3, generator=gen) if rank == 0 else None, "none": None}


def _sum_grads_rank(rank: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dp = DataParallel.from_env("cpu")
    params = {n: torch.nn.Parameter(torch.zeros(s)) for n, s in
              (("E", (6, 3)), ("W", (2, 2)), ("only0", (3,)), ("none", (1,)))}
    pending = dp.sum_async([rank + 1, 10.0])
    result = {"sum": pending.result(), "steps": []}
    for step in range(2):
        for n, g in _local_grads(rank, step, sparse=rank == 0).items():
            params[n].grad = g
        if step == 0:
            dp.sum_grads(params, sparse_rows={"E"})
        else:  # the training loop's staged use, with another collective in between
            staged = dp.sum_grads_async(params, sparse_rows={"E"}, flags=[rank, 1.0])
            result["between"] = dp.sum([1.0])
            result["flags"] = staged.flags()  # waits for the header, sends the grads
            staged.advance()
            staged.finish()
            staged.finish()  # a second finish does nothing
        result["steps"].append({n: None if p.grad is None else p.grad.clone()
                                for n, p in params.items()})
        for p in params.values():
            p.grad = None
    torch.save(result, out / f"rank{rank}.pt")
    dp.close()


def test_two_ranks_sum_dense_grads_and_the_union_of_embedding_rows(tmp_path: Path) -> None:
    mp.start_processes(_sum_grads_rank, args=(_free_port(), tmp_path), nprocs=2,
                       start_method="fork")
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert got[0]["sum"] == got[1]["sum"] == [3.0, 20.0]
    assert got[0]["between"] == got[1]["between"] == [2.0]
    assert got[0]["flags"] == got[1]["flags"] == [1.0, 2.0]  # summed in the header
    for step in range(2):
        local = [_local_grads(r, step, sparse=False) for r in range(2)]
        for n in ("E", "W"):
            want = local[0][n] + local[1][n]
            for r in range(2):
                torch.testing.assert_close(got[r]["steps"][step][n], want, rtol=0, atol=1e-6)
        # step 2 reads rows 2 and 0 only: rows 1, 3, 5 of step 1 must be zero again
        assert got[0]["steps"][1]["E"][[1, 3, 4, 5]].abs().sum() == 0
        for r in range(2):
            torch.testing.assert_close(got[r]["steps"][step]["only0"], local[0]["only0"])
            assert got[r]["steps"][step]["none"] is None
