"""Data-parallel scaling of ``experiments.train_model``: N ranks x 1 thread vs 1 process x 1 thread.

Both train the same model for the same number of optimizer steps with the same mini-batch
size *per rank* (``--per-rank-batch``), so the N-rank run trains on N times the trees per
step; the throughput (training trees per second of training time, evaluation excluded, as
``train/examples_per_s`` in the run's ``summary.json``) would grow N-fold with perfect
scaling. Each run is a fresh command line (``python -m experiments.train_model`` and
``torchrun --nproc_per_node=N -m experiments.train_model``, gloo, ``OMP_NUM_THREADS=1``),
alternated ``--repeats`` times; the best throughput of each is kept (other processes on a
shared machine only ever slow a run down). Throughput is taken after ``--warmup`` steps
(first-use costs: kernel and scheduler compilation, the process group's first collectives),
from the run's per-step log rows. The time of a step includes recording, scheduling and
planning its mini-batch (every step trains on a new one), which every rank does for its own
share; ``execute`` numbers (whole run) leave that preparation out.

    python benchmarks/ddp_scaling.py [--steps 40] [--warmup 5] [--per-rank-batch 32] [--ranks 2]
        [--out benchmarks/reference/ddp_scaling_latest.json]

It asserts nothing; it prints the ratio and writes JSON (with the machine's load average
before and after, which on a shared machine says how far to trust the ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(ranks: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One training run on ``ranks`` processes; its summary's throughput numbers."""
    run_dir = workdir / f"r{ranks}_{time.time_ns()}"
    batch = args.per_rank_batch * ranks
    overrides = [f"workload={args.workload}", f"batch_size={batch}",
                 f"max_steps={args.steps}", "epochs=1", "time_budget_s=null",
                 f"train_limit={batch * args.steps}", "num_threads=1", "eval_limit=8",
                 "eval_every=null", "log_every=1",
                 f"run_dir={run_dir}", *args.override]
    launcher = [sys.executable, "-m", "experiments.train_model"] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
         "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
         "-m", "experiments.train_model"]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    done = subprocess.run([*launcher, *overrides], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{ranks}-rank run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    trees = s["train/examples_per_s"] * s["train/seconds"]
    rows = [h for h in s["history"] if "train/seconds" in h and "train/loss" in h]
    first, last = rows[args.warmup - 1], rows[-1]  # one row per step
    steady = (last["train/epoch"] - first["train/epoch"]) * s["train_trees"] / \
        (last["train/seconds"] - first["train/seconds"])
    return {"ranks": ranks, "steps": s["steps"], "trees": round(trees),
            "steady_trees_per_s": steady, "train_seconds": s["train/seconds"],
            "prepare_seconds": s["train/prepare_seconds"],
            "trees_per_s": s["train/examples_per_s"],
            "execute_trees_per_s": trees / max(s["train/seconds"] - s["train/prepare_seconds"],
                                               1e-9),
            "wall_seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--per-rank-batch", type=int, default=32, help="trees per rank per step")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=2, help="alternated runs of each")
    p.add_argument("--workload", default="tree_lstm")
    p.add_argument("--override", nargs="*", default=[], help="more train_model overrides")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = p.parse_args(argv)
    if args.ranks < 2 or min(args.per_rank_batch, args.repeats, args.warmup) < 1 or \
            args.steps <= args.warmup:
        p.error("--ranks must be >= 2, --per-rank-batch, --repeats, --warmup >= 1 and "
                "--steps > --warmup")
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for ranks in (1, args.ranks):
                runs.append(run_once(ranks, args, Path(tmp)))
                print(f"repeat {r}: {ranks} rank(s): {runs[-1]['steady_trees_per_s']:.1f} "
                      f"trees/s after warm-up ({runs[-1]['trees_per_s']:.1f} whole run, "
                      f"{runs[-1]['execute_trees_per_s']:.1f} executing)", flush=True)
    best = {n: max((x for x in runs if x["ranks"] == n), key=lambda x: x["steady_trees_per_s"])
            for n in (1, args.ranks)}
    one, many = best[1], best[args.ranks]
    result = {
        "benchmark": "ddp_scaling", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "workload": args.workload, "ranks": args.ranks, "per_rank_batch": args.per_rank_batch,
        "steps": args.steps, "warmup": args.warmup, "threads_per_rank": 1, "backend": "gloo",
        "overrides": args.override, "cpu_count": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "throughput_ratio": many["steady_trees_per_s"] / one["steady_trees_per_s"],
        "whole_run_throughput_ratio": many["trees_per_s"] / one["trees_per_s"],
        "execute_throughput_ratio": many["execute_trees_per_s"] / one["execute_trees_per_s"],
        "best": {"1": one, str(args.ranks): many}, "runs": runs}
    print(f"{args.ranks} ranks x 1 thread vs 1 process x 1 thread, {args.per_rank_batch} trees "
          f"per rank per step: throughput x{result['throughput_ratio']:.2f} after warm-up "
          f"(whole run x{result['whole_run_throughput_ratio']:.2f}, executing only "
          f"x{result['execute_throughput_ratio']:.2f}); load average "
          f"{load_before[0]:.2f} before, {result['loadavg_after'][0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
