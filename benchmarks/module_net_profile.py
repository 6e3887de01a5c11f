"""Where one edbatch training step of the CLEVR module network goes (1 thread).

    nice -n 5 python benchmarks/module_net_profile.py --minibatches 12

Per reshuffled training mini-batch of 64 questions (the edbatch contender of
``benchmarks/module_net_peers.py``): wall-clock medians of the phases (merging the cached
per-question graphs, scheduling, memory planning, compiling the program, the forward run,
the hand-written backward), then, under ``cProfile`` on ``--profiled`` further steps, each
part's share of the executor's run (cell forwards, operand reads, cell backwards, gradient
routes, batched parameter gradients, program compilation) and the module kinds that cost
most (calls per step, share; the attention segments of
:mod:`edbatch.executor.cells_module_net_segment` as ``Segment``). ``--clock cpu`` times the
phases in this thread's CPU time (``time.thread_time``: what a loaded machine's other
processes do not inflate; compilation is then the executor's wall-clock figure, and the
forward what remains). Numbers only; nothing is checked.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks import _args
from benchmarks.module_net_per_batch import training_step
from edbatch.executor import cells_module_net_segment, init_params
from edbatch.executor.cell_kind import CELL_KINDS
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.module_net import ModuleNet

__all__ = ["main"]

SEGMENT_FILE = cells_module_net_segment.__file__
PHASES = ("merge", "schedule", "plan", "compile", "forward", "backward", "total")
#: Part of the run -> (file suffix, function name) whose cumulative time it is.
PARTS = {"compile_program": ("_program.py", "compile_program"),
         "cell forwards": ("cell_kind.py", "__call__"),
         "operand reads": ("_reads.py", "__call__"),
         "cell backwards": ("cell_kind.py", "_backward"),
         "gradient routes": ("_reads.py", "route"),
         "parameter gradients": ("param_grads.py", "result")}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Print and return the phase medians (ms) and the profiled shares (%)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minibatches", type=int, default=12)
    ap.add_argument("--profiled", type=int, default=4, help="steps run under cProfile")
    ap.add_argument("--scheduler", default="critical_path")
    ap.add_argument("--hidden-dim", type=int, default=64)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    wl = ModuleNet(hidden_dim=args.hidden_dim)
    train, sched = wl.load("train"), make_scheduler(args.scheduler)
    for i in range(len(train)):
        wl.instance_graph("train", i)
    params = init_params(wl, torch.Generator().manual_seed(0))
    for p in params.values():
        p.requires_grad_(True)
    ex, rng = TorchExecutor("cpu"), np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    for k in range(args.minibatches + 1):  # the first one warms up
        (merge, sch, plan, run, bwd), schedule, res = training_step(
            wl, "train", rng.permutation(len(train))[:64], sched, ex, params, clock)
        c = res.stats["exec/compile_seconds"]
        if k:
            for name, v in zip(PHASES, (merge, sch, plan, c, run - c, bwd,
                                        merge + sch + plan + run + bwd), strict=True):
                times[name].append(1e3 * v)
    out = {k: float(np.median(v)) for k, v in times.items()}
    print(f"ms per step ({args.clock} clock, medians):", {k: round(v, 1) for k, v in out.items()},
          f"batches {schedule.num_batches}, gathers {res.stats['exec/num_gathers']:.0f}, "
          f"views {res.stats['exec/num_views']:.0f}")
    out.update(_profile(wl, sched, ex, params, rng, len(train), args.profiled))
    return out


def _profile(wl: ModuleNet, sched: Callable, ex: TorchExecutor, params: dict,
             rng: np.random.Generator, size: int, steps: int) -> dict[str, float]:
    jobs = []
    for _ in range(steps):
        graph = wl.minibatch("train", rng.permutation(size)[:64])
        schedule = sched(graph)
        jobs.append((graph, schedule, plan_memory(graph, schedule, "aligned")))
    prof = cProfile.Profile()
    prof.enable()
    for graph, schedule, plan in jobs:
        res = ex.run(graph, schedule, plan, params, grad=True)
        assert res.loss is not None
        res.loss.backward()
        for p in params.values():
            p.grad = None
    prof.disable()
    stats = pstats.Stats(prof)
    rows = stats.stats  # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    shares = {name: 100 * sum(v[3] for f, v in rows.items()
                              if f[0].endswith(suffix) and f[2] == fn) / total
              for name, (suffix, fn) in PARTS.items()}
    print("shares of the profiled run (%):", {k: round(v) for k, v in shares.items()})
    names = {(m.__code__.co_filename, m.__code__.co_firstlineno): f"{cls.__name__}.{m.__name__}"
             for kind, cls in CELL_KINDS.items() if kind.startswith("module_net.")
             for m in (cls.forward, getattr(cls, "backward", None)) if m is not None}
    segment = {"__call__": "Segment.forward", "route": "Segment.backward"}
    kinds = {names.get((f[0], f[1]), segment.get(f[2], f"{f[0]}:{f[1]}")):
             (v[0] // steps, 100 * v[3] / total) for f, v in rows.items()
             if "cells_module_net" in f[0] and (f[2] in ("forward", "backward") or (
                 f[0] == SEGMENT_FILE and f[2] in segment))}
    top = sorted(kinds.items(), key=lambda kv: -kv[1][1])[:6]
    print("costliest module kinds (calls per step, % of the run):",
          "; ".join(f"{k}: {c}, {s:.0f}%" for k, (c, s) in top))
    return shares


if __name__ == "__main__":
    _args.run(main, sys.argv[1:])
