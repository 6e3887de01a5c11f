"""Per-decision cost of the frontier network (policies/frontier_deploy.py).

Records the feature rows of every decision of critical path's schedule of lattice
mini-batches, then times, per decision (median of ``--repeats`` passes over all recorded
decisions): the compiled scorer alone (numba), the numpy scorer, the feature rows (Python),
and a whole decision of :class:`FrontierNetPolicy` (features + scorer) against the
critical-path rule's decision, both inside :func:`edbatch.schedule.run_policy`. Weights are
read from ``--weights`` (a file written by ``experiments.frontier_net``) or drawn at random
(the cost does not depend on their values). It asserts nothing about wall time.

    python benchmarks/frontier_net_decision.py [--weights runs/frontier_net/seed0/frontier_net.npz]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _args
from edbatch.schedule import CriticalPathPolicy, Frontier, run_policy
from edbatch.schedule.policy import drive
from edbatch.workloads import make_workload
from policies._frontier_features import FeatureTracker
from policies.frontier_deploy import FrontierNetPolicy, _best_row, numpy_scores
from policies.frontier_net import FrontierNet


def _rows(graphs: list) -> list[np.ndarray]:  # type: ignore[type-arg]
    out: list[np.ndarray] = []  # type: ignore[type-arg]
    for g in graphs:
        tracker, cp = FeatureTracker(), CriticalPathPolicy()

        def choose(f: Frontier, tracker: FeatureTracker = tracker,
                   cp: CriticalPathPolicy = cp) -> int:
            view = f.view()
            ready, x = tracker.features(view)
            if len(ready) > 1:
                out.append(x.astype(np.float64))
            a = cp.choose(view)
            tracker.record(a)
            return a

        drive(Frontier(g, typewise=True), choose)
    return out


def _per_decision(fn, n: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default=None)
    ap.add_argument("--graphs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    policy = (FrontierNetPolicy.load(args.weights) if args.weights
              else FrontierNetPolicy(FrontierNet(32).export()))
    graphs = list(make_workload("lattice_lstm").batches("test", args.batch_size,
                                                        limit=args.graphs))
    rows = _rows(graphs)
    w = policy.weights
    wargs = tuple(policy._args)
    _best_row(rows[0], *wargs)  # compile outside the timing

    def numba_all() -> None:
        for x in rows:
            _best_row(x, *wargs)

    def numpy_all() -> None:
        for x in rows:
            numpy_scores(x, w)

    n = len(rows)
    mean_types = sum(len(x) for x in rows) / n
    print(f"{n} decisions with >= 2 ready types on {len(graphs)} lattice mini-batches "
          f"(mean {mean_types:.1f} ready types); hidden {w['W1'].shape[1]}")
    print(f"network, numba scorer:   {_per_decision(numba_all, n, args.repeats):8.2f} us "
          "per decision")
    print(f"network, numpy scorer:   {_per_decision(numpy_all, n, args.repeats):8.2f} us "
          "per decision")
    for name, pol in (("critical path rule", CriticalPathPolicy()),
                      ("frontier net (numba)", policy.fork()),
                      ("frontier net (numpy)", FrontierNetPolicy(w, "numpy"))):
        run_policy(graphs[0], pol)  # warm the per-graph analyses

        def whole(pol=pol) -> None:  # type: ignore[no-untyped-def]
            for g in graphs:
                run_policy(g, pol)

        decisions = sum(sum(not b.forced for b in run_policy(g, pol).batches) for g in graphs)
        print(f"{name + ', whole schedule:':<40}"
              f"{_per_decision(whole, decisions, args.repeats):8.2f} us per decision "
              "(frontier bookkeeping + features + choice)")


if __name__ == "__main__":
    _args.run(main)
