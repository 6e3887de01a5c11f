"""In-process A/B of the GGNN message forms: the fsm training pass of the throughput
benchmark on the same reshuffled mini-batches, arms alternated, CPU time (one thread).

    nice -n 5 python -m benchmarks.ggnn_ab --minibatches 6 --repeats 8

Arms: ``compact+merged`` (the default: compact messages, repeated slots read as one
operand, weight gradients added in place, buckets once per run), ``per-batch`` (the same
with per-batch weight gradients and buckets: ``cells_ggnn.REUSE = False``, the form before
2026-11-28), ``compact`` (per-slot reads), ``dense`` (the dense ``[S_1 .. S_4]`` GEMM and
per-slot reads: the form before 2026-11-26). Prints each arm's median CPU ms per mini-batch
of 64 molecules (whole pass, and forward plus backward); the first repeat warms up.
Scheduling is ``depth`` (every heuristic is at the lower bound on these graphs). Numbers
only; nothing is checked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import benchmarks._throughput_passes as passes
from benchmarks import _args
from benchmarks._throughput_data import minibatch_plan
from benchmarks.peers import sized_workload
from benchmarks.throughput import _schedulers
from edbatch.api import DynamicBatch
from edbatch.executor import cells_ggnn, init_params

__all__ = ["main"]


def _arm(compact: bool, merge: bool, reuse: bool = True) -> Callable[[], None]:
    def use() -> None:
        cells_ggnn.COMPACT = compact
        cells_ggnn.REUSE = reuse
        cells_ggnn.GGNNUpdate.merge_repeated = 1 if merge else None  # type: ignore[attr-defined]
        cells_ggnn.GGNNReadout.merge_repeated = 0 if merge else None  # type: ignore[attr-defined]
    return use


ARMS = {"compact+merged": _arm(True, True), "per-batch": _arm(True, True, False),
        "compact": _arm(True, False), "dense": _arm(False, False)}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Print and return each arm's median CPU ms per mini-batch (whole pass)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minibatches", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    passes.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore[assignment]
    wl = sized_workload("ggnn_molecules", args.hidden, args.hidden)
    n = len(wl.load("train"))
    plan = minibatch_plan("reshuffled", n, n, 64, args.minibatches, 1, args.seed)
    schedulers = _schedulers(None, ["depth"])
    schedulers["fsm"] = schedulers["depth"]
    params = {k: p.detach().clone().requires_grad_(True)
              for k, p in init_params(wl, torch.Generator().manual_seed(args.seed)).items()}
    job = passes.Job(wl, "train", plan, params, True, schedulers, {"workload": wl.name},
                     "api", api=DynamicBatch.from_workload(wl, params))
    names = list(args.arms)
    samples: dict[str, list[dict[str, float]]] = {a: [] for a in names}
    try:
        for rep in range(args.repeats):
            for k in range(len(plan[0])):
                for a in (names if (rep + k) % 2 else names[::-1]):
                    ARMS[a]()
                    times, _ = passes._pass(job, "fsm", 0, k)
                    if rep:
                        samples[a].append(times)
    finally:
        ARMS["compact+merged"]()
    out = {}
    for a in names:
        total = statistics.median(1e3 * sum(t.values()) for t in samples[a])
        run = statistics.median(1e3 * (t["execution"] + t["backward"]) for t in samples[a])
        out[a] = total
        print(f"{a:15s} CPU ms per mini-batch: pass {total:6.2f}, forward+backward {run:6.2f}")
    return out


if __name__ == "__main__":
    _args.run(main, sys.argv[1:])
