"""What one batch costs in an edbatch training step of the CLEVR module network (1 thread).

    nice -n 5 python benchmarks/module_net_per_batch.py --split test --minibatches 12 \
        --policy runs/module_net/priority/seed0/policy.json

Every scheduler (``--schedulers``, plus ``learned``, ``learned2``, ... from ``--policy``:
each priority, distilled-FSM or FSM artifact's run-time scheduler) runs the same reshuffled
mini-batches of 64 questions, in a rotating order (:func:`_order`), through the step of
``benchmarks/module_net_peers.py``'s edbatch contender (merge the cached per-question
graphs, schedule, plan memory, run forward and backward). Per scheduler: mean batches, the
medians of each phase and what a batch costs beside critical path: the median over
mini-batches of ``(step - critical path's step) / (batches - critical path's batches)``,
also without the scheduling phase (what the batches themselves cost, not the scheduler that
chose them). With each ``learned*``: its items/s over critical path's, the median of the
per-mini-batch ratios (both ran on the same mini-batch, one after the other), and that
median apart on the mini-batches where its program has fewer steps (kernel calls: on
module_net, critical path sometimes splits the attention run in two) and on the others.
``--clock
cpu`` (the default) times this thread's CPU time (``time.thread_time``), which a loaded
machine's other processes do not inflate. ``--at-cp-cost`` adds, per ``learned*``, a row
``<name>@cp`` that replays the policy's decisions (its op types, taken beforehand, untimed,
from its schedule of that mini-batch on a copy of the graph) on the compiled priority loop
with critical path's weights: the same batches, made afresh by critical path's code path
(its choice computed at every decision, no release sums), so the row shows the items/s the
policy's batches would give if choosing them cost what critical path's choice costs (the
bound of a cheaper policy); every row then plans without the plan memo (identical schedules
would otherwise share plans). Numbers only; nothing is checked.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks import _args
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.module_net import ModuleNet

__all__ = ["PHASES", "main", "training_step"]

PHASES = ("merge", "schedule", "plan", "run", "backward", "total")


def _schedulers(args: argparse.Namespace, workload: ModuleNet) -> dict[str, object]:
    out: dict[str, object] = {h: make_scheduler(h) for h in args.schedulers}
    from policies.fsm import FSMPolicy  # benchmarks may import every layer
    from policies.priority import PriorityPolicy, is_priority_file
    from policies.priority_fsm import PriorityFSM, is_priority_fsm_file
    for i, path in enumerate(args.policy):
        name = "learned" if i == 0 else f"learned{i + 1}"
        if is_priority_file(path):
            policy: Any = PriorityPolicy.load(path)
        elif is_priority_fsm_file(path):
            policy = PriorityFSM.load(path)
        else:
            policy = FSMPolicy.load(path, workload.vocab)
        out[name] = policy.runtime_scheduler(name)
    return out


def _at_cp_cost(made: dict[str, Any], name: str) -> Callable[..., Any]:
    """A scheduler that replays ``made[name]`` (the op type of each decision of ``name``'s
    schedule of the same mini-batch) on the compiled priority loop with critical path's
    weights (critical path's choice computed at every decision, as the core does, and
    dropped): ``name``'s batches at critical path's cost."""
    from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, _schedule
    from edbatch.schedule.compiled import core_schedule
    from policies.priority import critical_path_weights, graph_inputs
    w, none = critical_path_weights(), np.empty(0, np.int64)
    rows = np.empty((0, NUM_PRIORITY_FEATURES), np.float64)

    def schedule(graph: Any) -> Any:  # every argument given: numba's dispatch of omitted
        # defaults cost ~0.2 ms a call here (measured)
        bop, bforced, bptr, nodes = _schedule(*graph_inputs(graph), w, 0, rows, none, none,
                                              made[name], np.bool_(False), True)[:4]
        return core_schedule(bop, bforced, bptr, nodes, f"{name}@cp")
    return schedule


def _order(names: Sequence[str], m: int) -> list[str]:
    """Mini-batch ``m``'s order of the schedulers: rotated by ``m``, reversed every other
    round of ``len(names)`` mini-batches, so each scheduler runs in each position equally
    often (with 2: alternating; with 3: all 6 orders in 6 mini-batches; forward/reverse
    alone kept the middle one in the middle)."""
    n = len(names)
    out = [*names[m % n:], *names[:m % n]]
    return out[::-1] if (m // n) % 2 else out


def training_step(wl: ModuleNet, split: str, idx: Sequence[int], scheduler: Callable[..., Any],
                  ex: TorchExecutor, params: dict[str, torch.Tensor],
                  clock: Callable[[], float], plan_cache: bool = True
                  ) -> tuple[tuple[float, ...], Any, Any]:
    """One training step on the mini-batch ``idx`` of ``split``: ``((merge, schedule, plan,
    run, backward) seconds on ``clock``, the schedule, the executor's result)``; the
    gradients are dropped after the backward. ``plan_cache``: use the plan memo."""
    t0 = clock()
    graph = wl.minibatch(split, idx)
    t1 = clock()
    schedule = scheduler(graph)
    t2 = clock()
    plan = plan_memory(graph, schedule, "aligned", cache=plan_cache)
    t3 = clock()
    res = ex.run(graph, schedule, plan, params, grad=True)
    t4 = clock()
    assert res.loss is not None
    res.loss.backward()
    t5 = clock()
    for p in params.values():
        p.grad = None
    return (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), schedule, res


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Print and return each scheduler's ``<name>/batches``, ``<name>/<phase>`` medians
    (ms), ``<name>/per_batch_us`` and ``<name>/per_batch_unscheduled_us`` (beside critical
    path) and, per policy, ``<learned*>_items_ratio`` (critical path's step time over
    its, median)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minibatches", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden-dim", type=int, default=64)
    ap.add_argument("--split", default="train")
    ap.add_argument("--schedulers", nargs="+",
                    default=["depth", "dynet_agenda", "typewise_greedy", "critical_path"])
    ap.add_argument("--policy", nargs="*", default=[],
                    help="priority, distilled-FSM or FSM policy.json files: rows 'learned', "
                         "'learned2', ... (in that order)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--at-cp-cost", action="store_true",
                    help="add '<learned>@cp': the policy's schedules at critical path's cost")
    ap.add_argument("--seed", type=_args.seed, default=0)
    args = ap.parse_args(argv)
    if "critical_path" not in args.schedulers:
        ap.error(f"--schedulers {args.schedulers} must include critical_path (the reference)")
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    wl = ModuleNet(hidden_dim=args.hidden_dim)
    data = wl.load(args.split)
    for i in range(len(data)):  # each question's graph, built once (as the trainer does)
        wl.instance_graph(args.split, i)
    params = init_params(wl, torch.Generator().manual_seed(args.seed))
    for p in params.values():
        p.requires_grad_(True)
    ex, rng = TorchExecutor("cpu"), np.random.default_rng(args.seed)
    scheds = _schedulers(args, wl)
    made: dict[str, Any] = {}  # learned name -> its schedule of the current mini-batch
    if args.at_cp_cost:
        for n in [n for n in scheds if n.startswith("learned")]:
            scheds[f"{n}@cp"] = _at_cp_cost(made, n)
    names = list(scheds)
    times: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in names}
    batches: dict[str, list[int]] = {n: [] for n in names}
    steps: dict[str, list[float]] = {n: [] for n in names}  # program steps (kernel calls)
    for m in range(args.minibatches + 1):  # the first one warms up (numba, allocator)
        idx = rng.permutation(len(data))[:args.batch_size]
        made.clear()
        for n in [n[:-3] for n in names if n.endswith("@cp")]:
            copy = scheds[n](wl.minibatch(args.split, idx))  # untimed, on a copy
            made[n] = np.array([b.op_id for b in copy.batches if not b.forced], np.int64)
        for name in _order(names, m):
            laps, schedule, res = training_step(wl, args.split, idx, scheds[name], ex,
                                                params, clock, not args.at_cp_cost)
            if m:
                batches[name].append(schedule.num_batches)
                steps[name].append(res.stats["exec/num_kernel_calls"])
                for ph, v in zip(PHASES, (*laps, sum(laps)), strict=True):
                    times[name][ph].append(1e3 * v)
    return _report(args, names, times, batches, steps)


def _report(args: argparse.Namespace, names: Sequence[str],
            times: dict[str, dict[str, list[float]]], batches: dict[str, list[int]],
            steps: dict[str, list[float]]) -> dict[str, float]:
    cp_b = np.array(batches["critical_path"], np.float64)
    cp_t = np.array(times["critical_path"]["total"])
    cp_s = np.array(times["critical_path"]["schedule"])
    out: dict[str, float] = {}
    print(f"{args.clock} clock, ms per step (medians over {len(cp_t)} mini-batches of "
          f"{args.batch_size}, hidden {args.hidden_dim}, split {args.split}); per batch: "
          f"median over mini-batches of (step - critical path's) / (batches - its), with and "
          f"without the scheduling phase:")
    for n in names:
        med = {p: float(np.median(v)) for p, v in times[n].items()}
        out[f"{n}/batches"] = float(np.mean(batches[n]))
        out.update({f"{n}/{p}": v for p, v in med.items()})
        line = f"  {n:16s} batches {np.mean(batches[n]):6.1f} " + " ".join(
            f"{p} {v:6.2f}" for p, v in med.items())
        db = np.array(batches[n], np.float64) - cp_b
        if n != "critical_path" and np.all(db != 0):
            t, s = np.array(times[n]["total"]), np.array(times[n]["schedule"])
            out[f"{n}/per_batch_us"] = float(np.median(1e3 * (t - cp_t) / db))
            out[f"{n}/per_batch_unscheduled_us"] = float(
                np.median(1e3 * ((t - s) - (cp_t - cp_s)) / db))
            line += (f" | per batch {out[f'{n}/per_batch_us']:6.1f} us, without scheduling "
                     f"{out[f'{n}/per_batch_unscheduled_us']:6.1f} us")
        print(line)
    for n in names:
        if not n.startswith("learned"):
            continue
        ratio = cp_t / np.array(times[n]["total"])
        out[f"{n}_items_ratio"] = float(np.median(ratio))
        base = n.removesuffix("@cp")
        path = args.policy[0 if base == "learned" else int(base[7:]) - 1]
        print(f"{n} ({path}) vs critical_path items/s: {100 * (np.median(ratio) - 1):+.1f}% "
              f"(median of {len(ratio)} paired mini-batches; range "
              f"{100 * (ratio.min() - 1):+.1f} to {100 * (ratio.max() - 1):+.1f}%)")
        fewer = np.array(steps[n]) < np.array(steps["critical_path"])
        out[f"{n}/steps"] = float(np.mean(steps[n]))
        out[f"{n}/fewer_steps_share"] = float(fewer.mean())
        parts = [f"{100 * (np.median(ratio[sel]) - 1):+.1f}% on the {int(sel.sum())} with "
                 f"{what} program steps" for sel, what in ((fewer, "fewer"), (~fewer, "no fewer"))
                 if sel.any()]
        print(f"  program steps {np.mean(steps[n]):.2f} (critical path "
              f"{np.mean(steps['critical_path']):.2f}); items/s " + ", ".join(parts))
    return out


if __name__ == "__main__":
    _args.run(main, sys.argv[1:])
