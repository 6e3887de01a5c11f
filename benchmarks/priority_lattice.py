"""The priority policy on the main job's lattice graphs, seed by seed (issue 31's table).

The graphs of ``python -m experiments.compare`` for ``lattice_lstm`` (batch 64): per seed 16
``train`` mini-batches shuffled by the seed, the 2 unshuffled validation mini-batches and the
5 ``test`` mini-batches; trains :class:`policies.priority_train.PriorityTrainer` (the
guarded CEM) and prints test batches / LB per seed, the mean, and critical path's ratio::

    python -m benchmarks.priority_lattice --seeds 0 1 2 3 4   # 60 x 49 candidates, elite 8
    python -m benchmarks.priority_lattice --seeds 0 1 2 3 4 --iterations 70 --population 56 \
        --num-train-graphs 24   # 2026-11-26: mean 1.190 x LB, about 3 min CPU per seed
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from edbatch.schedule import lower_bound, make_scheduler
from edbatch.workloads import make_workload
from experiments._common import graph_set
from policies.priority_train import PriorityTrainer


def main(argv: Sequence[str] | None = None) -> dict[int, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="lattice_lstm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--num-train-graphs", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--population", type=int, default=48)
    ap.add_argument("--elite", type=int, default=8)
    ap.add_argument("--hidden-units", type=int, default=0)
    args = ap.parse_args(argv)
    wl = make_workload(args.workload)
    test = graph_set(wl, "test", 64, 8)
    val = graph_set(wl, "train", 64, 2)
    lb = sum(lower_bound(g) for g in test)
    cp = make_scheduler("critical_path")
    print(f"{len(test)} test graphs, LB {lb}, critical path "
          f"{sum(cp(g).num_batches for g in test) / lb:.4f} x LB")
    out = {}
    for seed in args.seeds:
        train = graph_set(wl, "train", 64, args.num_train_graphs, shuffle_seed=seed)
        t0, c0 = time.perf_counter(), time.process_time()
        p = PriorityTrainer(args.iterations, args.population, args.elite, seed=seed,
                            hidden_units=args.hidden_units).fit(train, val).policy
        out[seed] = sum(p(g).num_batches for g in test) / lb
        m = p.metadata
        print(f"seed {seed}: {out[seed]:.4f} x LB (learned {p.learned}; train "
              f"{m['train_batches']} vs {m['train_fallback_batches']}, validation "
              f"{m['val_batches']} vs {m['val_fallback_batches']}; "
              f"{time.process_time() - c0:.0f} s CPU, {time.perf_counter() - t0:.0f} s wall)",
              flush=True)
    print(f"mean {statistics.fmean(out.values()):.4f} x LB over seeds {args.seeds}")
    return out


if __name__ == "__main__":
    main()
