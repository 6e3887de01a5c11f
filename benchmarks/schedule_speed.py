"""Scheduling-speed benchmark: microseconds per node for graph building and each scheduler.

Runs every contender side by side in one process on the same 64-instance mini-batch graphs
(SST Tree-LSTM and Lattice-LSTM by default), repeats each measurement and reports medians.
It asserts nothing about wall time; it prints a table and writes JSON.

    python benchmarks/schedule_speed.py [--repeats 7] [--out results/schedule_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from edbatch.schedule import HEURISTICS, make_scheduler, type_chain_lengths, typewise_graph
from edbatch.workloads import make_workload


def _median_seconds(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up (caches, imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpu": cpu, "cores": str(os.cpu_count()), "load_1m": f"{load[0]:.2f}",
            "python": platform.python_version()}


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
    results = {"machine": _machine(), "rows": []}
    print(f"machine: {results['machine']}")
    header = f"{'workload':<14} {'contender':<26} {'us/node':>9} {'batches':>8}"
    print(header + "\n" + "-" * len(header))
    for name in args.workloads:
        wl = make_workload(name, granularity=args.granularity)
        split = wl.default_eval_split
        insts = wl.load(split)[: args.batch_size]
        graph = wl.build_graph(insts)
        n = graph.num_nodes
        rows = [("build_graph (GraphBuilder)", _median_seconds(lambda: wl.build_graph(insts),
                                                               args.repeats), None)]
        idx = range(args.batch_size)
        wl.minibatch(split, idx)  # fill the per-instance cache
        rows.append(("merge cached instances", _median_seconds(lambda: wl.minibatch(split, idx),
                                                               args.repeats), None))
        rows.append(("analysis: chain lengths (LB)",
                     _median_seconds(lambda: type_chain_lengths(graph), args.repeats), None))
        rows.append(("analysis: type-wise graph",
                     _median_seconds(lambda: typewise_graph(graph), args.repeats), None))
        for sched_name in HEURISTICS:
            sched = make_scheduler(sched_name)
            batches = sched(graph).num_batches
            rows.append((sched_name, _median_seconds(lambda s=sched: s(graph), args.repeats),
                         batches))
        for label, sec, batches in rows:
            us = 1e6 * sec / n
            print(f"{name:<14} {label:<26} {us:9.3f} {'' if batches is None else batches:>8}")
            results["rows"].append({"workload": name, "granularity": args.granularity,
                                    "num_nodes": n, "contender": label, "us_per_node": us,
                                    "num_batches": batches})
        print(f"{name:<14} ({n} nodes in the {args.batch_size}-instance {split} graph)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
