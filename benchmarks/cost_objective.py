"""Where the batch-optimal schedule is not the time-optimal one: batches, modelled and
measured milliseconds per scheduler at primitive granularity.

For each workload: calibrate a cost model (:mod:`edbatch.executor.cost_model`, ``min`` of
the repetitions, robust on a loaded machine), then schedule the first ``--graphs`` mini-batch
graphs of the evaluation split with every heuristic, the batch-count rollout (fewest
batches), the modelled-cost greedy and the modelled-cost rollout
(:mod:`edbatch.executor.cost_schedule`), and any trained FSM given with ``--fsm``. Each
schedule is executed by the batched executor (inference, planned memory); the schedules of a
graph are timed in interleaved rounds and the minimum is kept. It asserts nothing about
time; it prints one table per workload and writes JSON.

    python benchmarks/cost_objective.py [--workloads tree_lstm lattice_lstm] [--batch-size 8]
        [--graphs 3] [--fsm tree_lstm=runs/.../policy.json] [--out results/cost_objective.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import _args
from edbatch.executor import TorchExecutor, init_params
from edbatch.executor.cost_model import calibrate, load_cost_model, measure_schedule_ms
from edbatch.executor.cost_schedule import CostGreedyPolicy, CostRolloutScheduler
from edbatch.memory.planner import plan_memory
from edbatch.schedule import (
    HEURISTICS,
    CriticalPathPolicy,
    RolloutScheduler,
    Schedule,
    TypewiseGreedyPolicy,
    lower_bound,
    make_scheduler,
    run_policy,
)
from edbatch.workloads import make_workload


def _schedulers(model: Any, vocab: Any, fsms: dict[str, str], budget: int) -> dict[str, Any]:
    out: dict[str, Any] = {h: make_scheduler(h) for h in HEURISTICS}
    out["rollout (batches)"] = RolloutScheduler([CriticalPathPolicy, TypewiseGreedyPolicy],
                                                budget=budget)
    out["cost_greedy"] = lambda g: run_policy(g, CostGreedyPolicy(model, vocab))
    out["cost_rollout (modelled ms)"] = CostRolloutScheduler(
        model, [CriticalPathPolicy, TypewiseGreedyPolicy], budget=budget)
    for label, path in fsms.items():
        from policies import FSMScheduler

        out[label] = FSMScheduler(path, label)
    return out


def _gathered_rows(graph: Any, schedule: Schedule, params: Any) -> float:
    """Rows the planned run copies with gathers (views cost nothing): what the per-(op, n)
    model cannot see, as it depends on the order of the whole schedule."""
    plan = plan_memory(graph, schedule)
    return float(TorchExecutor().run(graph, schedule, plan, params).stats.get(
        "exec/gathered_rows", float("nan")))


def run_workload(name: str, args: argparse.Namespace) -> dict[str, Any]:
    wl = make_workload(name, granularity="primitive")
    sample = list(wl.batches("train", args.batch_size, limit=1))
    if args.cost_model and name in args.cost_model:
        model = load_cost_model(args.cost_model[name], wl.vocab)
    else:
        model = calibrate(wl, graphs=sample, reps=args.reps, stat="min")
    params = init_params(wl, torch.Generator().manual_seed(0))
    fsms = {f"fsm:{Path(p).parent.name}": p for w, p in args.fsm if w == name}
    scheds = _schedulers(model, wl.vocab, fsms, args.budget)
    graphs = list(wl.batches(wl.default_eval_split, args.batch_size, limit=args.graphs))
    rows: dict[str, dict[str, list[float]]] = {k: {"batches": [], "modelled_ms": [],
                                                   "measured_ms": [], "gathered_rows": [],
                                                   "sched_s": []}
                                               for k in scheds}
    lbs = []
    for g in graphs:
        lbs.append(lower_bound(g))
        done = {}
        for label, sched in scheds.items():
            t0 = time.perf_counter()
            s = sched(g)
            rows[label]["sched_s"].append(time.perf_counter() - t0)
            s.validate(g)
            done[label] = s
        times: dict[str, list[float]] = {k: [] for k in done}
        for _ in range(args.rounds):  # interleaved: load drifts hit every scheduler alike
            for label, s in done.items():
                times[label].append(measure_schedule_ms(g, s, params, reps=args.reps,
                                                        stat="min"))
        for label, s in done.items():
            rows[label]["batches"].append(s.num_batches)
            rows[label]["modelled_ms"].append(model.schedule_ms(s, wl.vocab))
            rows[label]["measured_ms"].append(min(times[label]))
            rows[label]["gathered_rows"].append(_gathered_rows(g, s, params))
    summary = {label: {k: statistics.fmean(v) for k, v in cols.items()}
               for label, cols in rows.items()}
    return {"workload": name, "granularity": "primitive", "batch_size": args.batch_size,
            "graphs": len(graphs), "mean_lb": statistics.fmean(lbs),
            "nodes": statistics.fmean(g.num_nodes for g in graphs),
            "cost_model": model.to_dict(), "summary": summary, "per_graph": rows}


def _print(result: dict[str, Any]) -> None:
    s = result["summary"]
    fewest = min(s, key=lambda k: s[k]["batches"])
    best_mod = min(s, key=lambda k: s[k]["modelled_ms"])
    best_meas = min(s, key=lambda k: s[k]["measured_ms"])
    print(f"\n{result['workload']} primitive, batch {result['batch_size']}, "
          f"{result['graphs']} graphs, {result['nodes']:.0f} nodes, LB {result['mean_lb']:.1f}")
    print(f"{'scheduler':28s} {'batches':>8s} {'modelled ms':>12s} {'measured ms':>12s} "
          f"{'gathered rows':>14s}")
    for label, v in s.items():
        marks = "".join(m for m, k in (("B", fewest), ("M", best_mod), ("T", best_meas))
                        if k == label)
        print(f"{label:28s} {v['batches']:8.1f} {v['modelled_ms']:12.2f} "
              f"{v['measured_ms']:12.2f} {v['gathered_rows']:14.0f}  {marks}")
    print("B: fewest batches, M: least modelled time, T: least measured time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tree_lstm", "lattice_lstm"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--graphs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5, help="runs per timing (min kept)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--budget", type=int, default=200_000,
                        help="batches popped inside each rollout")
    parser.add_argument("--fsm", nargs="*", default=[], metavar="WORKLOAD=PATH",
                        help="trained FSM artifacts to add, e.g. tree_lstm=runs/x/policy.json")
    parser.add_argument("--cost-model", nargs="*", default=[], metavar="WORKLOAD=PATH",
                        help="use these cost-model files instead of calibrating")
    parser.add_argument("--out", type=_args.out_file, default="results/cost_objective.json")
    args = parser.parse_args()
    args.fsm = [tuple(x.split("=", 1)) for x in args.fsm]
    args.cost_model = dict(x.split("=", 1) for x in args.cost_model)
    torch.set_num_threads(1)
    results = []
    for name in args.workloads:
        result = run_workload(name, args)
        _print(result)
        results.append(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load": load, "results": results}, indent=1))
    print(f"\nload {load:.1f}; wrote {out}")


if __name__ == "__main__":
    _args.run(main)
