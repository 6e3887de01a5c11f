"""Scheduling-speed benchmark: microseconds per node and per decision, Python vs compiled.

Runs every contender side by side in one process on the same 64-instance mini-batch graphs
(SST Tree-LSTM, Lattice-LSTM and the BiLSTM tagger by default), repeats each measurement and
reports medians. Each scheduler runs on the Python backend (the oracle) and on the compiled
numba core (:mod:`edbatch.schedule.compiled`), on a *fresh* copy of the graph (its analyses,
the type-wise graph and heights, paid inside the time, as on a new mini-batch) and on the
cached graph (the decision loop alone). ``fsm`` is a hints-key FSM whose table was recorded
from the critical-path rule on the *next* mini-batches, with the critical path as fallback.
Compile cost is measured separately, in two subprocesses: one with an empty numba cache
(compilation) and one reading that cache (first use on a machine that has compiled once).
It asserts nothing about wall time; it prints a table and writes JSON.

    python benchmarks/schedule_speed.py [--repeats 7] [--out results/schedule_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import _args
from edbatch.graph import Graph
from edbatch.schedule import (
    COMPILED,
    HEURISTICS,
    Schedule,
    make_scheduler,
    run_policy,
    type_chain_lengths,
    typewise_graph,
)
from edbatch.schedule.heuristics import CriticalPathPolicy
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
    parser.add_argument("--workloads", nargs="+",
                        default=["tree_lstm", "lattice_lstm", "bilstm_tagger"])
    parser.add_argument("--granularity", default="cell", choices=["cell", "primitive"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-compile-probe", action="store_true",
                        help="skip the two subprocesses that time compilation and cache load")
    parser.add_argument("--out", type=_args.out_file, default="results/schedule_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": machine_info(), "rows": []}
    print(f"machine: {results['machine']}")
    if not args.no_compile_probe:
        results["compile"] = _compile_probe()
        print("compiled core, first use: compile {compile_s:.2f} s (empty cache), "
              "cache load {cache_load_s:.2f} s (numba cache present)".format(**results["compile"]))
    header = (f"{'workload':<14} {'contender':<28} {'backend':<9} {'us/node':>9} "
              f"{'us/node*':>9} {'us/dec*':>9} {'batches':>8}")
    print(header + "\n" + "-" * len(header))
    for name in args.workloads:
        _bench_workload(name, args, results)
    print("us/node: fresh graph (analyses included); *: cached graph (decision loop alone)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


_PROBE = """
import time
t0 = time.perf_counter()
from edbatch.schedule.compiled import compiled_schedule
from edbatch.workloads.synthetic import random_dag
import numpy as np
t1 = time.perf_counter()
g = random_dag(np.random.default_rng(0), 30, 3, 1, 0.1, None)
compiled_schedule(g, "critical_path", "probe", encoding="hints")
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _compile_probe() -> dict[str, float]:
    """Seconds of the first compiled schedule in a new process: with an empty numba cache
    (compilation) and then with the cache it left (load). Imports are timed apart."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("compile_s", "cache_load_s"):
            res = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True,
                                 capture_output=True, text=True)
            imports, first = (float(x) for x in res.stdout.split())
            out[label] = first
            out[label.replace("_s", "_import_s")] = imports
    return out


def _fsm_table(wl: Any, split: str, start: int, count: int, batch: int) -> dict:  # type: ignore[type-arg]
    """A hints-key table recorded from the critical-path rule's decisions on other graphs."""
    from envs.encoding import encode_state

    table: dict[tuple[int, ...], int] = {}

    class Recorder(CriticalPathPolicy):
        def choose(self, view):  # type: ignore[no-untyped-def]
            a = super().choose(view)
            table.setdefault(encode_state(view, "hints"), a)
            return a

    insts = wl.load(split)
    for i in range(start, start + count * batch, batch):
        if i < len(insts):
            run_policy(wl.build_graph(insts[i:i + batch]), Recorder())
    return table


def _bench_workload(name: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Measure every contender on one workload's first mini-batch graph."""
    from policies.fsm import FSMPolicy

    wl = make_workload(name, granularity=args.granularity)
    split = wl.default_eval_split
    insts = wl.load(split)[: args.batch_size]
    idx = list(range(len(insts)))
    graph = wl.build_graph(insts)
    wl.minibatch(split, idx)  # fill the per-instance cache
    n = graph.num_nodes
    for label, fn in [
        ("build_graph", lambda: wl.build_graph(insts)),
        ("merge cached instances", lambda: wl.minibatch(split, idx)),
        ("analysis: chain lengths (LB)", lambda: type_chain_lengths(_fresh(graph))),
        ("analysis: type-wise graph", lambda: typewise_graph(_fresh(graph))),
    ]:
        us = 1e6 * _median_seconds(fn, args.repeats) / n
        print(f"{name:<14} {label:<28} {'':<9} {us:9.3f}")
        results["rows"].append({"workload": name, "granularity": args.granularity,
                                "num_nodes": n, "contender": label, "us_per_node": us})
    table = _fsm_table(wl, split, args.batch_size, 4, args.batch_size)
    for sched_name in [*HEURISTICS, "fsm"]:
        for backend in ("python", "compiled"):
            if sched_name != "fsm" and backend == "compiled" and sched_name not in COMPILED:
                continue
            if sched_name == "fsm":
                policy = FSMPolicy(table, "hints", graph.vocab.names, "critical_path")
                sched = policy.scheduler("fsm", backend=backend)
            else:
                sched = make_scheduler(sched_name, backend=backend)
            _row(name, sched_name, backend, sched, graph, args, results)
            if sched_name == "fsm":
                results["rows"][-1]["hit_rate"] = policy.hit_rate
                results["rows"][-1]["table_states"] = len(table)
        if sched_name in ("critical_path", "fsm"):
            _core_row(name, sched_name, table, graph, args, results)
    dec = _decision_us(graph, table)
    results["decision_us"] = {**results.get("decision_us", {}), name: dec}
    print(f"{name:<14} one decision alone (compiled): FSM hints key + table "
          f"{dec['fsm_hints_table']:.3f} us, critical-path rule {dec['critical_path_rule']:.3f} us")
    print(f"{name:<14} ({n} nodes in the {len(insts)}-instance {split} graph; fsm table: "
          f"{len(table)} states, hit rate {policy.hit_rate:.2f})")


def _core_row(name: str, label: str, table: dict, graph: Graph,  # type: ignore[type-arg]
              args: argparse.Namespace, results: dict[str, Any]) -> None:
    """The compiled core alone on the cached graph: no Batch objects built."""
    from edbatch.schedule.compiled import FsmTable, compiled_arrays

    fsm = {"encoding": "hints", "table": FsmTable(table)} if label == "fsm" else {}
    warm = _median_seconds(lambda: compiled_arrays(graph, "critical_path", **fsm), args.repeats)
    s = make_scheduler("critical_path")(graph)
    n, dec = graph.num_nodes, max(s.num_decisions, 1)
    print(f"{name:<14} {label + ' (core, no Batch objects)':<28} {'compiled':<9} {'':>9} "
          f"{1e6 * warm / n:9.3f} {1e6 * warm / dec:9.3f}")
    results["rows"].append({
        "workload": name, "granularity": args.granularity, "num_nodes": n,
        "contender": f"{label} core", "backend": "compiled", "us_per_node_cached": 1e6 * warm / n,
        "us_per_decision_cached": 1e6 * warm / dec, "num_decisions": s.num_decisions})


_DECIDE_LOOP: Any = None


def decide_loop() -> Any:
    """A compiled loop of ``reps`` FSM decisions (``_compiled._decide``), built once."""
    global _DECIDE_LOOP
    if _DECIDE_LOOP is None:
        from numba import njit

        from edbatch.schedule import _compiled as core

        @njit
        def loop(reps, rule, enc, th, ta, key, k, rlen, tw, maxh, rem, remd, b, mean, cplx):  # type: ignore[no-untyped-def]
            acc = 0
            for _ in range(reps):
                a, hit = core._decide(rule, enc, th, ta, key, k, rlen, tw, maxh, rem, remd, b,
                                      mean, cplx)
                acc += a + hit
            return acc
        _DECIDE_LOOP = loop
    return _DECIDE_LOOP


def decision_args(graph: Graph, rule: int, enc: int, table: Any) -> tuple[Any, ...]:
    """``_compiled._decide``'s arguments on ``graph``'s first frontier (every source ready)
    for fallback ``rule``, key encoding ``enc`` and a compiled ``FsmTable``."""
    import numpy as np

    from edbatch.schedule.compiled import _arrays, heights, typewise

    arr = _arrays(graph)
    k = len(arr.batchable)
    src = np.flatnonzero(graph.arity == 0)
    rlen = np.bincount(arr.op[src], minlength=k) * arr.batchable
    h = heights(graph)
    maxh = np.full(k, -1, np.int64)
    np.maximum.at(maxh, arr.op[src], h[src])
    tw = np.bincount(arr.op[typewise(graph)[0] == 0], minlength=k) * arr.batchable
    return (rule, enc, table.hashes, table.actions, np.empty(16 * k + 16, np.int64), k,
            rlen.astype(np.int64), tw.astype(np.int64), maxh,
            np.bincount(arr.op, minlength=k).astype(np.int64),
            np.bincount(arr.op, weights=arr.depth, minlength=k).astype(np.float64),
            arr.batchable, arr.mean, arr.cplx)


def time_decisions(args: tuple[Any, ...], reps: int,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Microseconds per decision of :func:`decide_loop` over ``args`` (its compile and a
    10-decision warm-up not timed)."""
    loop = decide_loop()
    loop(10, *args)
    t0 = clock()
    loop(reps, *args)
    return 1e6 * (clock() - t0) / reps


def _decision_us(graph: Graph, table: dict, reps: int = 200_000) -> dict[str, float]:  # type: ignore[type-arg]
    """Microseconds per FSM decision alone (state key, hash, table search, fallback when
    missed), on the graph's first frontier, in a compiled loop of ``reps`` decisions."""
    from edbatch.schedule import _compiled as core
    from edbatch.schedule.compiled import FsmTable

    return {label: time_decisions(decision_args(graph, core.RULE_CRITICAL_PATH, enc, tab), reps)
            for label, enc, tab in (("fsm_hints_table", core.ENC_HINTS, FsmTable(table)),
                                    ("critical_path_rule", core.ENC_NONE, FsmTable({})))}


def _row(name: str, label: str, backend: str, sched: Callable[[Graph], Schedule],
         graph: Graph, args: argparse.Namespace, results: dict[str, Any]) -> None:
    # A fresh copy of the graph per call: cached analyses (the type-wise graph, heights)
    # are paid inside the measured time, as on a new mini-batch.
    n = graph.num_nodes
    fresh = _median_seconds(lambda: sched(_fresh(graph)), args.repeats)
    warm = _median_seconds(lambda: sched(graph), args.repeats)
    s = sched(graph)
    dec = max(s.num_decisions, 1)
    print(f"{name:<14} {label:<28} {backend:<9} {1e6 * fresh / n:9.3f} {1e6 * warm / n:9.3f} "
          f"{1e6 * warm / dec:9.3f} {s.num_batches:>8}")
    results["rows"].append({
        "workload": name, "granularity": args.granularity, "num_nodes": n, "contender": label,
        "backend": backend, "us_per_node": 1e6 * fresh / n, "us_per_node_cached": 1e6 * warm / n,
        "us_per_decision_cached": 1e6 * warm / dec, "us_per_decision": 1e6 * fresh / dec,
        "num_batches": s.num_batches, "num_decisions": s.num_decisions})


if __name__ == "__main__":
    _args.run(main)
