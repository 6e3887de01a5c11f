"""Per-decision cost of the compiled priority policy (issue 31: <= 5 us per decision).

Interleaved on the same graphs, medians over ``--reps`` rounds: the whole compiled schedule
with the priority policy (features + score of every ready type at each decision; for linear
weights without context ones the fused loop, ``_compiled_priority_fused``), the same
schedule through the per-decision pick (``per_call``: ``_schedule``'s lean pick, a numba
call per decision and per batch's release upkeep, the loop before the fused one; linear
weights only), the compiled critical path (one comparison per ready type), and the Python
twin (the oracle)::

    python -m benchmarks.priority_cost --workload module_net --graphs 8 [--policy policy.json]
    python -m benchmarks.priority_cost --workload lattice_lstm --graphs 4 --hidden-units 16
    python -m benchmarks.priority_cost --workload lattice_lstm --graphs 3 --afterstate

``--afterstate`` times the afterstate priority policy (:mod:`policies.afterstate`; ``--policy``
then names its artifact) against the priority policy with the same priority weights (its
afterstate weights 0), critical path and its twin, per decision of each.

Prints microseconds per decision of each and the priority policy's extra cost over
critical path (what the learned scorer adds per decision). Times are the process's CPU time
(``time.process_time``), not wall time: on a loaded machine a preempted round would
otherwise count the other processes' time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks._args import positive
from benchmarks._args import run as run_cli
from edbatch.graph import Graph
from edbatch.schedule import run_policy
from edbatch.schedule._compiled_afterstate import run_afterstate
from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, _schedule, run_priority
from edbatch.schedule.compiled import compiled_arrays
from edbatch.workloads import make_workload
from policies.afterstate import AfterstatePolicy, afterstate_inputs, afterstate_start
from policies.afterstate_train import AfterstateTrainer
from policies.priority import PriorityPolicy, critical_path_weights, graph_inputs
from policies.priority_train import PriorityTrainer


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="module_net")
    ap.add_argument("--split", default="test")
    ap.add_argument("--granularity", default=None, help="e.g. cell (default: the workload's)")
    ap.add_argument("--batch-size", type=positive, default=64)
    ap.add_argument("--graphs", type=positive, default=8)
    ap.add_argument("--reps", type=positive, default=20)
    ap.add_argument("--policy", default=None, help="a priority artifact (default: 3 CEM "
                    "iterations on the first graph, so the weights are not critical path's)")
    ap.add_argument("--afterstate", action="store_true",
                    help="time the afterstate priority policy (--policy: its artifact)")
    ap.add_argument("--hidden-units", type=int, default=0,
                    help="without --policy: an MLP scorer of this many hidden units")
    return ap.parse_args(argv)


def _policy(path: str | None, graphs: list[Graph], hidden: int = 0) -> PriorityPolicy:
    policy = PriorityPolicy.load(path) if path else PriorityTrainer(
        iterations=3, population=8, elite=3, hidden_units=hidden).fit(graphs[:1],
                                                                      graphs[:1]).policy
    return policy if policy.learned else PriorityPolicy(critical_path_weights(hidden) + 0.1,
                                                        hidden=hidden)


def _interleave(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """CPU seconds of each function per round, alternated (round 0 is warm-up); the Python
    twin only in rounds 0, 1, 6, 11, ... (so any ``reps`` >= 1 times it)."""
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(reps + 1):
        for name, fn in fns.items():
            if name == "python_twin" and r and (r - 1) % 5:
                continue
            t0 = time.process_time()
            fn()
            if r:
                runs[name].append(time.process_time() - t0)
    return runs


def _afterstate(args: argparse.Namespace, graphs: list[Graph]) -> dict[str, float]:
    """``--afterstate``: us per decision of the afterstate policy, of the priority policy
    with its priority weights, of critical path and of the afterstate twin, interleaved."""
    policy = AfterstatePolicy.load(args.policy) if args.policy else AfterstateTrainer(
        iterations=3, population=8, elite=3).fit(graphs[:1], graphs[:1]).policy
    if not policy.learned:
        policy = AfterstatePolicy(afterstate_start() + 0.1)
    prio = PriorityPolicy(policy.weights[:NUM_PRIORITY_FEATURES])
    decisions = {}
    for name, p in (("afterstate", policy), ("priority", prio)):
        p.reset_stats()
        p.count_hits(graphs)
        decisions[name] = p.hits + p.misses
    decisions["critical_path"] = decisions["python_twin"] = decisions["afterstate"]
    ai, pi, twin = [afterstate_inputs(g) for g in graphs], [graph_inputs(g) for g in graphs], \
        policy.twin()
    runs = _interleave({
        "afterstate": lambda: [run_afterstate(*x, policy.weights) for x in ai],  # type: ignore[call-arg]
        "priority": lambda: [run_priority(*x, prio.weights, 0)  # type: ignore[call-arg]
                             for x in pi],
        "critical_path": lambda: [compiled_arrays(g, "critical_path") for g in graphs],
        "python_twin": lambda: [run_policy(g, twin) for g in graphs],
    }, args.reps)
    us = {k: 1e6 * statistics.median(v) / decisions[k] for k, v in runs.items()}
    us["afterstate_extra"] = us["afterstate"] - us["critical_path"]
    us["afterstate_over_priority"] = us["afterstate"] - us["priority"]
    print(f"{args.workload} {args.split}: {len(graphs)} graphs, {decisions} decisions, "
          f"{len(runs['afterstate'])} reps (us per decision)")
    for k, v in us.items():
        print(f"  {k:24s} {v:8.3f}")
    return us


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = _args(argv)
    wl = make_workload(args.workload, **({"granularity": args.granularity}
                                         if args.granularity else {}))
    graphs = list(wl.batches(args.split, args.batch_size, limit=args.graphs))
    if args.afterstate:
        return _afterstate(args, graphs)
    policy = _policy(args.policy, graphs, args.hidden_units)
    inputs = [graph_inputs(g) for g in graphs]
    policy.reset_stats()
    for g in graphs:
        policy(g)
    decisions = policy.hits + policy.misses
    twin = policy.twin()
    rows, none = np.empty((0, NUM_PRIORITY_FEATURES), np.float64), np.empty(0, np.int64)
    per_call = {} if policy.hidden else {"per_call": lambda: [
        _schedule(*x, policy.weights, 0, rows, none, none, none, np.bool_(False), True)
        for x in inputs]}
    runs = _interleave({
        "priority": lambda: [run_priority(*x, policy.weights, policy.hidden)  # type: ignore[call-arg]
                             for x in inputs],
        **per_call,
        "critical_path": lambda: [compiled_arrays(g, "critical_path") for g in graphs],
        "python_twin": lambda: [run_policy(g, twin) for g in graphs],
    }, args.reps)
    us = {k: 1e6 * statistics.median(v) / decisions for k, v in runs.items()}
    us["priority_extra"] = us["priority"] - us["critical_path"]
    us["priority_over_cp"] = us["priority"] / us["critical_path"]
    if per_call:
        us["per_call_over_cp"] = us["per_call"] / us["critical_path"]
    print(f"{args.workload} {args.split}: {len(graphs)} graphs, {decisions} decisions, "
          f"{len(runs['priority'])} reps")
    for k, v in us.items():
        print(f"  {k:16s} {v:8.3f} " + ("x critical path" if k.endswith("_over_cp")
                                             else "us per decision"))
    return us


if __name__ == "__main__":
    run_cli(main)
