"""Scheduling-speed benchmark: microseconds per node for graph building and each scheduler.

Runs every contender side by side in one process on the same 64-instance mini-batch graphs
(SST Tree-LSTM and Lattice-LSTM by default), repeats each measurement and reports medians.
It asserts nothing about wall time; it prints a table and writes JSON.

    python benchmarks/schedule_speed.py [--repeats 7] [--out results/schedule_speed.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from edbatch.graph import Graph
from edbatch.schedule import (
    HEURISTICS,
    Schedule,
    make_scheduler,
    type_chain_lengths,
    typewise_graph,
)
from edbatch.tracking import machine_info
from edbatch.workloads import make_workload


def _median_seconds(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up (caches, imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fresh(graph: Graph) -> Graph:
    """A copy of ``graph`` with no cached analyses attached."""
    return Graph.from_arrays(graph.vocab, graph.op_ids, graph.operand_ptr, graph.operand_ids,
                             attrs=graph.attrs, instance=graph.instance, outputs=graph.outputs,
                             depth=graph.depth, validate=False)


def main() -> None:
    """Parse arguments, run the benchmark, print and save the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tree_lstm", "lattice_lstm"])
    parser.add_argument("--granularity", default="cell", choices=["cell", "primitive"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="results/schedule_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": machine_info(), "rows": []}
    print(f"machine: {results['machine']}")
    header = f"{'workload':<14} {'contender':<28} {'us/node':>9} {'batches':>8}"
    print(header + "\n" + "-" * len(header))
    for name in args.workloads:
        _bench_workload(name, args, results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


def _bench_workload(name: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Measure every contender on one workload's first mini-batch graph."""
    wl = make_workload(name, granularity=args.granularity)
    split = wl.default_eval_split
    insts = wl.load(split)[: args.batch_size]
    idx = list(range(len(insts)))
    graph = wl.build_graph(insts)
    wl.minibatch(split, idx)  # fill the per-instance cache
    contenders: list[tuple[str, Callable[[], Any], Callable[[Graph], Schedule] | None]] = [
        ("build_graph", lambda: wl.build_graph(insts), None),
        ("merge cached instances", lambda: wl.minibatch(split, idx), None),
        ("analysis: chain lengths (LB)", lambda: type_chain_lengths(_fresh(graph)), None),
        ("analysis: type-wise graph", lambda: typewise_graph(_fresh(graph)), None),
    ]
    # Every scheduler call gets a fresh copy of the graph, so cached analyses (LB chains,
    # the type-wise graph) are paid inside the measured time, as on a new mini-batch.
    for sched_name in HEURISTICS:
        sched = make_scheduler(sched_name)
        contenders.append((sched_name, lambda s=sched: s(_fresh(graph)), sched))
    n = graph.num_nodes
    for label, fn, sched in contenders:
        us = 1e6 * _median_seconds(fn, args.repeats) / n
        batches = None if sched is None else sched(graph).num_batches
        print(f"{name:<14} {label:<28} {us:9.3f} {'' if batches is None else batches:>8}")
        results["rows"].append({"workload": name, "granularity": args.granularity,
                                "num_nodes": n, "contender": label, "us_per_node": us,
                                "num_batches": batches})
    print(f"{name:<14} ({n} nodes in the {len(insts)}-instance {split} graph)")


if __name__ == "__main__":
    main()
