"""``benchmarks/executor_speed.py --op-counts``: aten ops per mini-batch, split sensibly."""

from __future__ import annotations

import argparse

from benchmarks.executor_speed import COPY_OPS, op_count_table

__all__: list[str] = []


def test_op_counts_split_compute_views_and_copies() -> None:
    args = argparse.Namespace(workloads=["tree_lstm"], sizes=["128x128"], batch_size=4,
                              minibatches=1, schedulers=["depth"], device="cpu")
    rows = op_count_table(args)["rows"]
    assert [r["mode"] for r in rows] == ["infer", "train"]
    infer, train = rows
    for row in rows:
        assert row["batches"] > 0 and row["compute_ops"] > row["batches"]  # >= 1 per batch
        assert row["view_ops"] > 0 and all(row[k] >= 0 for k in COPY_OPS)
    assert train["compute_ops"] > infer["compute_ops"]  # the backward adds work
    assert infer["index_add_"] == 0 and train["index_add_"] > 0  # gradient routes only
