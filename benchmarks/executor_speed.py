"""Executor-speed benchmark: node-by-node reference vs batched naive vs batched planned.

For each workload (cell level) and model size, on the first ``--minibatches`` dev mini-batches
of ``--batch-size`` instances, with one CPU thread, it reports the median inference time
(forward, no autograd) and training time (forward with autograd + backward) per mini-batch:

* ``reference``: :func:`~edbatch.executor.run_reference`, every node alone;
* ``naive`` / ``planned``: :class:`~edbatch.executor.torch_executor.TorchExecutor` with the
  schedule of each ``--schedulers`` entry and that memory strategy,

together with the kernel calls, the plan's zero-copy fraction and gathers, and the planning
time. With ``--device cuda`` everything runs on the GPU (each timed call ends with a device
synchronisation, so times are wall times of the host dispatch and the GPU work together) and
a ``planned+graph`` row replays a CUDA graph captured for each mini-batch's shape
(``TorchExecutor(cuda_graphs=True)``; inference as one graph, training as a forward and a
backward graph). It asserts nothing; it prints a table and writes JSON.

    python benchmarks/executor_speed.py [--repeats 5] [--out results/executor_speed.json]
    python benchmarks/executor_speed.py --device cuda --out results/executor_speed_cuda.json
    python benchmarks/executor_speed.py --zero-copy-table [--out results/zero_copy.json]
    python benchmarks/executor_speed.py --op-counts [--out results/op_counts.json]

``--zero-copy-table`` instead prints the plan statistics for every real workload x
granularity x scheduler x strategy (and the per-read upper bound), without running kernels.
``--op-counts`` instead counts the aten ops one batched run issues per mini-batch (first
``--schedulers`` entry, naive plan; inference, and training with its backward), split into
compute ops and view ops (``slice``, ``select``, ``narrow``, ``as_strided``, ...), with the
copies (``cat``, ``copy_``) and scatters apart: unlike times, these counts do not move with
the machine's load, so they show what a change to the per-batch code removed.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks import _args
from edbatch.executor import init_params, reference_loss, run_reference
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import STRATEGIES, MemoryPlan, plan_memory, zero_copy_upper_bound
from edbatch.schedule import Schedule, make_scheduler
from edbatch.tracking import machine_info
from edbatch.workloads import REAL_WORKLOADS, make_workload

SIZES = {"300x150": (300, 150), "128x128": (128, 128)}


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median_ms(fns: list[Callable[[], Any]], repeats: int) -> float:
    """Median wall time (ms) of ``repeats`` calls of each function, after one warm-up each
    (each call ends with a CUDA synchronisation when CUDA is in use)."""
    times = []
    for fn in fns:
        fn()
        for _ in range(repeats):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _train_reference(graph: Graph, params: Mapping[str, Tensor]) -> None:
    torch.autograd.grad(reference_loss(graph, params), list(params.values()),
                        allow_unused=True)


def _bench_size(name: str, size: str, args: argparse.Namespace, rows: list[dict[str, Any]]
                ) -> None:
    embed, hidden = SIZES[size]
    wl = make_workload(name, granularity="cell", embed_dim=embed, hidden_dim=hidden)
    graphs = list(wl.batches(wl.default_eval_split, args.batch_size, limit=args.minibatches))
    params = dict(init_params(wl, torch.Generator().manual_seed(0), device=args.device))
    base = {"workload": name, "size": size, "num_nodes": graphs[0].num_nodes,
            "device": args.device}

    def add(row: dict[str, Any]) -> None:
        rows.append({**base, **row})
        ref = next(r for r in rows if r["method"] == "reference" and r["workload"] == name
                   and r["size"] == size)
        print(f"{name:<14} {size:<8} {row['scheduler']:<16} {row['method']:<10} "
              f"{row['kernel_calls']:>7} {row.get('zero_copy', float('nan')):>6.3f} "
              f"{row.get('gathers', 0):>7} {row['infer_ms']:>9.2f} {row['train_ms']:>9.2f} "
              f"{ref['infer_ms'] / row['infer_ms']:>7.2f}x "
              f"{ref['train_ms'] / row['train_ms']:>6.2f}x", flush=True)

    with torch.no_grad():
        infer = _median_ms([functools.partial(run_reference, g, params) for g in graphs],
                           args.ref_repeats)
    train = _median_ms([functools.partial(_train_reference, g, params) for g in graphs],
                       args.ref_repeats)
    add({"scheduler": "-", "method": "reference", "kernel_calls": graphs[0].num_nodes,
         "infer_ms": infer, "train_ms": train})
    for scheduler in args.schedulers:
        schedules = [make_scheduler(scheduler)(g) for g in graphs]
        plans: dict[str, list[MemoryPlan]] = {}
        plan_ms: dict[str, float] = {}
        infer_fns: dict[str, list[Callable[[], Any]]] = {}
        train_fns: dict[str, list[Callable[[], Any]]] = {}
        ex = TorchExecutor(args.device)
        graphed = TorchExecutor(args.device, cuda_graphs=True)
        for strategy in STRATEGIES:
            t0 = time.perf_counter()
            plans[strategy] = [plan_memory(g, s, strategy)
                               for g, s in zip(graphs, schedules, strict=True)]
            plan_ms[strategy] = 1e3 * (time.perf_counter() - t0) / len(graphs)
            runs = list(zip(graphs, schedules, plans[strategy], strict=True))
            infer_fns[strategy] = [functools.partial(ex.run, g, s, p, params)
                                   for g, s, p in runs]
            train_fns[strategy] = [functools.partial(_train_step, ex, g, s, p, params)
                                   for g, s, p in runs]
        methods = list(STRATEGIES)
        if graphed.graphs is not None:
            methods.append("planned+graph")
            infer_fns["planned+graph"] = [functools.partial(graphed.run, g, s, p, params)
                                          for g, s, p in runs]  # the planned runs
            train_fns["planned+graph"] = [
                functools.partial(_train_step, graphed, g, s, p, params) for g, s, p in runs]
            for fn in infer_fns["planned+graph"] + train_fns["planned+graph"]:
                fn()  # seen once before the warm-up: captured there, never while timed
        infer_ms = _interleaved_median_ms(infer_fns, args.repeats)
        train_ms = _interleaved_median_ms(train_fns, args.repeats)
        for method in methods:
            strategy = "planned" if method == "planned+graph" else method
            stats = plans[strategy][0].stats()
            res = ex.run(graphs[0], schedules[0], plans[strategy][0], params, grad=True).stats
            add({"scheduler": scheduler, "method": method,
                 "kernel_calls": schedules[0].num_batches, "infer_ms": infer_ms[method],
                 "train_ms": train_ms[method], "plan_ms": plan_ms[strategy],
                 "zero_copy": stats["memory/zero_copy_fraction"],
                 "zero_copy_rows": stats["memory/zero_copy_row_fraction"],
                 "gathers": int(stats["memory/gather_kernels"]),
                 "gathered_mb": stats["memory/gathered_bytes"] / 2**20,
                 "train_views": int(res["exec/num_views"]),
                 "train_gathers": int(res["exec/num_gathers"])})


def _interleaved_median_ms(fns: Mapping[str, list[Callable[[], Any]]], repeats: int
                           ) -> dict[str, float]:
    """Median ms per call of each contender, calls interleaved so load drifts hit all alike."""
    for group in fns.values():
        for fn in group:
            fn()  # warm-up (compilation, allocator)
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(repeats):
        for i in range(max(len(group) for group in fns.values())):
            for label, group in fns.items():
                _sync()
                t0 = time.perf_counter()
                group[i % len(group)]()
                _sync()
                times[label].append(time.perf_counter() - t0)
    return {label: 1e3 * statistics.median(t) for label, t in times.items()}


def _train_step(ex: TorchExecutor, graph: Graph, schedule: Schedule, plan: MemoryPlan,
                params: Mapping[str, Tensor]) -> None:
    loss = ex.run(graph, schedule, plan, params, grad=True).loss
    assert loss is not None
    torch.autograd.grad(loss, list(params.values()), allow_unused=True)


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """The speed table."""
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "rows": []}
    print(f"machine: {results['machine']}")
    header = (f"{'workload':<14} {'size':<8} {'scheduler':<16} {'method':<10} {'kernels':>7} "
              f"{'0copy':>6} {'gathers':>7} {'infer ms':>9} {'train ms':>9} "
              f"{'inf x':>8} {'trn x':>7}")
    print(header + "\n" + "-" * len(header))
    for name in args.workloads:
        for size in args.sizes:
            _bench_size(name, size, args, results["rows"])
    return results


def zero_copy_table(args: argparse.Namespace) -> dict[str, Any]:
    """Plan statistics for every real workload x granularity x scheduler x strategy."""
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "rows": []}
    header = (f"{'workload':<14} {'gran':<9} {'scheduler':<24} {'reads':>6} {'bound':>6} "
              f"{'naive':>6} {'aligned':>7} {'planned':>7} {'naive/row':>9} {'plan/row':>8} "
              f"{'gathers':>13} {'align s':>7} {'plan s':>7}")
    print(header + "\n" + "-" * len(header))
    for name in REAL_WORKLOADS:
        for granularity in ("cell", "primitive"):
            wl = make_workload(name, granularity=granularity)
            split = wl.default_eval_split
            n = min(args.batch_size, len(wl.load(split)))
            graph = wl.minibatch(split, range(n))
            for scheduler in args.schedulers:
                schedule = make_scheduler(scheduler)(graph)
                plans = {s: plan_memory(graph, schedule, s) for s in STRATEGIES}
                st = {s: p.stats() for s, p in plans.items()}
                bound = zero_copy_upper_bound(graph, schedule)
                row = {"workload": name, "granularity": granularity, "scheduler": scheduler,
                       "num_batches": schedule.num_batches, "bound": bound,
                       **{f"{s}/{k.split('/')[1]}": v for s in STRATEGIES
                          for k, v in st[s].items()}}
                results["rows"].append(row)
                gathers = "/".join(str(int(st[s]["memory/gather_kernels"])) for s in STRATEGIES)
                print(f"{name:<14} {granularity:<9} {scheduler:<24} "
                      f"{int(st['planned']['memory/operand_reads']):>6} {bound:>6.3f} "
                      f"{st['naive']['memory/zero_copy_fraction']:>6.3f} "
                      f"{st['aligned']['memory/zero_copy_fraction']:>7.3f} "
                      f"{st['planned']['memory/zero_copy_fraction']:>7.3f} "
                      f"{st['naive']['memory/zero_copy_row_fraction']:>9.3f} "
                      f"{st['planned']['memory/zero_copy_row_fraction']:>8.3f} {gathers:>13} "
                      f"{st['aligned']['memory/plan_seconds']:>7.3f} "
                      f"{st['planned']['memory/plan_seconds']:>7.2f}", flush=True)
    return results


#: Ops that make views or empty tensors (no arithmetic, no copy); the rest count as compute.
VIEW_OPS = frozenset({"slice", "select", "narrow", "as_strided", "t", "transpose", "expand",
                      "view", "reshape", "unsqueeze", "squeeze", "split", "split_with_sizes",
                      "alias", "detach", "empty", "empty_strided", "resolve_conj",
                      "resolve_neg", "lift_fresh"})
COPY_OPS = ("cat", "copy_", "index_select", "index_add_", "scatter_add_", "zeros", "fill_")


def _run_all(ex: TorchExecutor, runs: list[tuple[Graph, Schedule, MemoryPlan]],
             params: Mapping[str, Tensor], train: bool) -> None:
    for graph, schedule, plan in runs:
        if train:
            _train_step(ex, graph, schedule, plan, params)
        else:
            with torch.no_grad():
                ex.run(graph, schedule, plan, params)


def op_count_table(args: argparse.Namespace) -> dict[str, Any]:
    """Aten ops per mini-batch of one batched run, inference and training."""
    from torch.profiler import ProfilerActivity, profile

    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "rows": []}
    print(f"{'workload':<14} {'mode':<6} {'batches':>7} {'compute':>8} {'views':>7} "
          + " ".join(f"{k:>12}" for k in COPY_OPS))
    for name in args.workloads:
        embed, hidden = SIZES[args.sizes[0]]
        wl = make_workload(name, granularity="cell", embed_dim=embed, hidden_dim=hidden)
        graphs = list(wl.batches(wl.default_eval_split, args.batch_size,
                                 limit=args.minibatches))
        params = dict(init_params(wl, torch.Generator().manual_seed(0), device=args.device))
        runs = [(g, s, plan_memory(g, s, "naive")) for g in graphs
                for s in [make_scheduler(args.schedulers[0])(g)]]
        for mode in ("infer", "train"):
            ex = TorchExecutor(args.device)

            once = functools.partial(_run_all, ex, runs, params, mode == "train")
            once()  # compiled programs, first-run paths
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                once()
            counts: dict[str, float] = {}
            for event in prof.key_averages():
                if event.key.startswith("aten::"):
                    counts[event.key[6:]] = counts.get(event.key[6:], 0) + event.count
            per = {k: v / len(runs) for k, v in counts.items()}
            row = {"workload": name, "mode": mode, "scheduler": args.schedulers[0],
                   "batches": sum(s.num_batches for _, s, _ in runs) / len(runs),
                   "compute_ops": sum(v for k, v in per.items() if k not in VIEW_OPS),
                   "view_ops": sum(v for k, v in per.items() if k in VIEW_OPS),
                   **{k: per.get(k, 0.0) for k in COPY_OPS}}
            results["rows"].append(row)
            print(f"{name:<14} {mode:<6} {row['batches']:>7.1f} {row['compute_ops']:>8.1f} "
                  f"{row['view_ops']:>7.1f} "
                  + " ".join(f"{row[k]:>12.1f}" for k in COPY_OPS), flush=True)
    return results


def main() -> None:
    """Parse arguments, run the benchmark, print and save the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+",
                        default=["tree_lstm", "lattice_lstm", "bilstm_tagger"])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--schedulers", nargs="+",
                        default=["depth", "ed_batch_agenda", "typewise_greedy"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ref-repeats", type=int, default=2)
    parser.add_argument("--zero-copy-table", action="store_true",
                        help="print plan statistics for every workload instead of timings")
    parser.add_argument("--op-counts", action="store_true",
                        help="count the aten ops per mini-batch instead of timing")
    parser.add_argument("--device", type=_args.device, default="cpu",
                        help="cpu or cuda[:N] (cuda adds the CUDA-graph replay row)")
    parser.add_argument("--out", type=_args.out_file, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.zero_copy_table:
        if args.schedulers == parser.get_default("schedulers"):
            args.schedulers = ["depth", "dynet_agenda", "ed_batch_agenda", "typewise_greedy",
                               "critical_path"]
        results = zero_copy_table(args)
    elif args.op_counts:
        results = op_count_table(args)
    else:
        results = speed(args)
    out = Path(args.out or ("results/zero_copy.json" if args.zero_copy_table
                            else "results/op_counts.json" if args.op_counts
                            else "results/executor_speed.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    _args.run(main)
