"""Does replaying a heuristic (the ``replay:<heuristic>`` FSM fallback) ever need more
batches than the heuristic's own schedule? Counts both on many mini-batches.

    python -m benchmarks.replay_fidelity --workloads bilstm_char_tagger ggnn_molecules \
        --graphs 20 --batch-size 64

Prints per (workload, granularity, heuristic): graphs, sum of the heuristic's batches, sum of
its replay's, and on how many graphs the replay needs more / fewer batches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import _args
from edbatch.schedule import lower_bound, make_scheduler
from edbatch.schedule.compiled import compiled_schedule
from edbatch.workloads import REGISTRY, GraphSampler, make_workload

HEURISTICS = ("typewise_greedy_backward", "dynet_level_agenda", "critical_path",
              "typewise_greedy", "depth")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["bilstm_char_tagger", "ggnn_molecules",
                                                       "lattice_lstm", "tree_lstm_sick",
                                                       "transition_parser"])
    ap.add_argument("--granularities", nargs="+", default=["cell", "primitive"])
    ap.add_argument("--heuristics", nargs="+", default=list(HEURISTICS))
    ap.add_argument("--graphs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--split", default="train")
    ap.add_argument("--seed", type=_args.seed, default=0)
    args = ap.parse_args()
    print("workload granularity heuristic graphs LB heuristic replay worse better seconds")
    for name in args.workloads:
        for gran in args.granularities:
            if gran not in REGISTRY[name].granularities:
                continue
            wl = make_workload(name, granularity=gran)
            sampler = GraphSampler(wl, args.split, args.batch_size)
            rng = np.random.default_rng(args.seed)
            graphs = [sampler(rng) for _ in range(args.graphs)]
            lb = sum(lower_bound(g) for g in graphs)
            for h in args.heuristics:
                t0 = time.perf_counter()
                sched = make_scheduler(h)
                own = [sched(g).num_batches for g in graphs]
                rep = [compiled_schedule(g, "replay:" + h, "replay")[0].num_batches
                       for g in graphs]
                worse = sum(r > o for r, o in zip(rep, own))
                better = sum(r < o for r, o in zip(rep, own))
                print(f"{name} {gran} {h} {len(graphs)} {lb} {sum(own)} {sum(rep)} {worse} "
                      f"{better} {time.perf_counter() - t0:.1f}", flush=True)


if __name__ == "__main__":
    _args.run(main)
