"""Where the run-time path's time goes: one fresh mini-batch at a time, phase by phase.

For each workload and mode, on reshuffled 64-instance mini-batches of the training split
(new structures every time, as in ``benchmarks/throughput.py``), built through the public
per-instance API (:mod:`benchmarks.models_api`), it times:

* ``record``: the user's per-instance code calling the API (recursion, loops, op calls);
* ``assemble``: the recording turned into a validated :class:`~edbatch.graph.Graph`;
* ``schedule``: the scheduler (``--policy FILE``: that FSM policy's run-time path;
  ``--fsm``: the ``fsm`` contender's policy of ``benchmarks/throughput.py``, loaded from
  ``--policy-dir`` or trained there first, as that benchmark does; else ``--scheduler``,
  default the compiled ``critical_path``, the FSM's usual fallback), with its cost per
  decision (a batch the policy chose, forced batches not counted): on the fresh graph, and
  once more on the same graph with its analyses (type-wise graph, heights) cached, which
  leaves the decision loop, its frontier bookkeeping and the ``Batch`` objects; for a
  compiled FSM also the decision alone (key, hash, table search, fallback) in a compiled
  loop on the last mini-batch's first frontier;
* ``plan``: ``plan_memory`` (``--strategy``, default ``naive`` as the ``fsm`` contender;
  no memo: the structures are new);
* ``compile``: the executor's per-batch program (kernels, attrs, reads);
* ``execute``: the batched forward; ``backward``: its backward (``--modes train``).

Times are per mini-batch medians of the process's CPU time (``time.process_time``, which a
loaded machine inflates much less than wall time; 1 torch thread) and of wall time, with
the recorder's cost per recorded node. ``--torch-profile`` adds torch.profiler's table of
the execution (forward, and backward in training) by aten op. It asserts nothing.

    python benchmarks/runtime_phases.py --workloads tree_lstm lattice_lstm --minibatches 4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import _args
from benchmarks.models_api import RECORDERS
from benchmarks.peers import sized_workload
from edbatch.api import DynamicBatch
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.tracking import machine_info

PHASES = ("record", "assemble", "schedule", "plan", "compile", "execute", "backward")


class _Laps:
    """CPU and wall seconds since the previous lap, per phase."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self._c, self._w = time.process_time(), time.perf_counter()

    def lap(self, phase: str) -> None:
        c, w = time.process_time(), time.perf_counter()
        self.cpu[phase], self.wall[phase] = c - self._c, w - self._w
        self._c, self._w = c, w


def _scheduler(args: argparse.Namespace, wl: Any) -> Any:
    if args.fsm:
        from benchmarks.throughput import load_or_train_policy

        policy, _ = load_or_train_policy(wl.name, wl, args.policy_dir)
        return policy.runtime_scheduler("fsm")
    if args.policy:
        from policies import FSMPolicy

        path = Path(args.policy.replace("{workload}", wl.name))
        return FSMPolicy.load(path, wl.vocab).runtime_scheduler("fsm")
    return make_scheduler(args.scheduler)


def decision_alone_us(graph: Any, scheduler: Any, reps: int = 100_000) -> float | None:
    """CPU us per FSM decision alone (state key, hash, table search, fallback when missed)
    on ``graph``'s first frontier, in a compiled loop of ``reps`` decisions (its compile
    not timed); ``None`` unless ``scheduler`` is a compiled FSM (``CompiledFsmScheduler``)."""
    from benchmarks.schedule_speed import decision_args, time_decisions
    from edbatch.schedule.compiled import COMPILED_ENCODINGS, COMPILED_RULES, CompiledFsmScheduler

    if not isinstance(scheduler, CompiledFsmScheduler):
        return None
    policy = scheduler.policy
    args = decision_args(graph, COMPILED_RULES[policy.fallback_name][0],
                         COMPILED_ENCODINGS[policy.encoding][0], scheduler.table())
    return time_decisions(args, reps, time.process_time)


def run_workload(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per mode: median ms per phase (CPU and wall) and the per-node record cost."""
    embed, hidden = (int(x) for x in args.size.split("x"))
    wl = sized_workload(name, embed, hidden)  # (a GGNN has no embed_dim)
    data = wl.load("train")
    scheduler = _scheduler(args, wl)
    rows = []
    for mode in args.modes:
        train = mode == "train"
        params = {k: p.detach().clone().requires_grad_(train)
                  for k, p in init_params(wl, torch.Generator().manual_seed(0)).items()}
        batch = DynamicBatch.from_workload(wl, params)
        order = list(range(len(data)))
        random.Random(args.seed).shuffle(order)
        laps: list[_Laps] = []
        cached: list[float] = []
        nodes = batches = decisions = 0
        for k in range(args.warmup + args.minibatches):
            picked = [data[i] for i in order[k * 64:(k + 1) * 64]]
            with torch.set_grad_enabled(train):
                t = _Laps()
                RECORDERS[name](batch, wl, picked)
                t.lap("record")
                graph = batch.graph()[0]
                batch.discard()
                t.lap("assemble")
                schedule = scheduler(graph)
                t.lap("schedule")
                plan = plan_memory(graph, schedule, args.strategy, cache=False)
                t.lap("plan")
                ex = TorchExecutor("cpu", sparse_grads=train)
                ex._program(graph, schedule, plan)  # compiled and cached for the run
                t.lap("compile")
                res = ex.run(graph, schedule, plan, params, grad=train)
                t.lap("execute")
                if train:
                    assert res.loss is not None
                    res.loss.backward()
                    for p in params.values():
                        p.grad = None
                    t.lap("backward")
            c0 = time.process_time()
            scheduler(graph)  # again: the graph's analyses are cached, the decision loop is not
            rerun = time.process_time() - c0
            if k >= args.warmup:
                laps.append(t)
                cached.append(rerun)
                nodes, batches = nodes + graph.num_nodes, batches + schedule.num_batches
                decisions += schedule.num_decisions
        row: dict[str, Any] = {"workload": name, "mode": mode, "size": args.size,
                               "nodes": nodes / len(laps), "batches": batches / len(laps),
                               "decisions": decisions / len(laps)}
        for kind in ("cpu", "wall"):
            for p in PHASES:
                vals = [getattr(t, kind).get(p, 0.0) for t in laps]
                row[f"{kind}_{p}_ms"] = 1e3 * statistics.median(vals)
            total = sum(row[f"{kind}_{p}_ms"] for p in PHASES)
            row[f"{kind}_total_ms"] = total
            row[f"{kind}_overhead_share"] = sum(
                row[f"{kind}_{p}_ms"] for p in PHASES[:5]) / total
        row["cpu_us_per_node_record"] = 1e3 * row["cpu_record_ms"] / row["nodes"]
        row["cpu_us_per_node_assemble"] = 1e3 * row["cpu_assemble_ms"] / row["nodes"]
        row["cpu_us_per_decision"] = 1e3 * row["cpu_schedule_ms"] / max(row["decisions"], 1)
        row["cpu_us_per_decision_cached"] = (1e6 * statistics.median(cached)
                                             / max(row["decisions"], 1))
        row["cpu_us_per_decision_alone"] = decision_alone_us(graph, scheduler)
        rows.append(row)
        print(f"{name:<14} {mode:<5} {row['nodes']:>7.0f} {row['batches']:>6.1f} " + " ".join(
            f"{row[f'cpu_{p}_ms']:>8.2f}" for p in PHASES)
            + f" {row['cpu_total_ms']:>8.1f} {100 * row['cpu_overhead_share']:>5.1f}% "
              f"{row['cpu_us_per_node_record']:>6.2f} {row['cpu_us_per_node_assemble']:>6.2f} "
              f"{row['cpu_us_per_decision']:>6.2f} {row['cpu_us_per_decision_cached']:>6.2f} "
              + ("" if row["cpu_us_per_decision_alone"] is None
                 else f"{row['cpu_us_per_decision_alone']:>6.2f}"),
            flush=True)
        if args.torch_profile:
            _torch_profile(name, wl, batch, scheduler, params, train, data, order, args)
    return rows


def _torch_profile(name: str, wl: Any, batch: DynamicBatch, scheduler: Any,
                   params: dict[str, Any], train: bool, data: Any, order: list[int],
                   args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile

    runs = []
    for k in range(args.minibatches):
        RECORDERS[name](batch, wl, [data[i] for i in order[k * 64:(k + 1) * 64]])
        graph = batch.graph()[0]
        batch.discard()
        schedule = scheduler(graph)
        runs.append((graph, schedule, plan_memory(graph, schedule, args.strategy,
                                                  cache=False)))
    with torch.set_grad_enabled(train), profile(activities=[ProfilerActivity.CPU]) as prof:
        for graph, schedule, plan in runs:
            res = TorchExecutor("cpu", sparse_grads=train).run(graph, schedule, plan, params,
                                                              grad=train)
            if train:
                assert res.loss is not None
                res.loss.backward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    """Parse arguments, time the phases, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(RECORDERS),
                        choices=list(RECORDERS))
    parser.add_argument("--modes", nargs="+", default=["infer", "train"],
                        choices=["infer", "train"])
    parser.add_argument("--size", default="300x150", help="EMBEDxHIDDEN")
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--scheduler", default="critical_path")
    parser.add_argument("--policy", default=None,
                        help="an FSM policy file ({workload} is replaced by the name)")
    parser.add_argument("--fsm", action="store_true",
                        help="schedule with throughput.py's fsm policy (trained if absent)")
    parser.add_argument("--policy-dir", default="results/throughput_policies",
                        help="where --fsm finds (or saves) <workload>_expert.json")
    parser.add_argument("--strategy", default="naive",
                        choices=["naive", "aligned", "planned"])
    parser.add_argument("--torch-profile", action="store_true")
    parser.add_argument("--out", type=_args.out_file, default=Path("results/runtime_phases.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine_info()
    print(f"machine: {info}; CPU ms per mini-batch (median), us per node for record/assemble,"
          f" us per scheduling decision (fresh graph, again with its analyses cached, and a"
          f" compiled FSM's decision alone)")
    header = (f"{'workload':<14} {'mode':<5} {'nodes':>7} {'b/mb':>6} "
              + " ".join(f"{p:>8}" for p in PHASES)
              + f" {'total':>8} {'ovh%':>6} {'rec/n':>6} {'asm/n':>6} {'us/dec':>6}"
              + f" {'cached':>6} {'alone':>6}")
    print(header + "\n" + "-" * len(header))
    rows = [r for name in args.workloads for r in run_workload(name, args)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "args": {
        k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.run(main)
