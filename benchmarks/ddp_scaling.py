"""Data-parallel scaling of ``experiments.train_model``: N ranks x 1 thread vs 1 process x 1 thread.

Both train the same model for the same number of optimizer steps with the same mini-batch
size *per rank* (``--per-rank-batch``), so the N-rank run trains on N times the trees per
step; the throughput (training trees per second of training time, evaluation excluded, as
``train/examples_per_s`` in the run's ``summary.json``) would grow N-fold with perfect
scaling. Each run is a fresh command line (``python -m experiments.train_model`` and
``torchrun --nproc_per_node=N -m experiments.train_model``, gloo, ``OMP_NUM_THREADS=1``).
Throughput is taken after ``--warmup`` steps (first-use costs: kernel and scheduler
compilation, the process group's first collectives), from the run's log rows (one every
``--log-every`` steps, the same in both). The time of a step includes recording, scheduling
and planning its mini-batch (every step trains on a new one), which every rank does for its
own share; ``execute`` numbers (whole run) leave that preparation out.

Two controls, in the same alternation, say what N processes can get from the machine at the
moment (on a shared machine the other jobs take their share of the CPUs):

- ``independent``: N plain one-process trainings at once (no communication; each as the
  one-process run), their throughputs summed: the ceiling for data parallelism here;
- ``matmul``: N independent single-thread matmul loops vs one (``--matmul-seconds`` each).

Each repeat (``--repeats``) runs 1 process then N ranks, 1 process then N independent
trainings, 1 then N matmul loops. The ratios are reported from the best run of each kind
(other jobs only ever slow a run down) and, paired per repeat, as the median of
``(N ranks / 1 process) / (control N / control 1)`` (the "ratio of ratios": 1.0 means the
ranks scale as well as independent processes do at that moment). With ``--concurrent`` the
two runs of each pair run at the same time instead: on a busy machine every process then
gets about the same CPU share, so the ratio says how much of N processes' share the ranks
turn into training (N would be perfect), whatever the other jobs do meanwhile.

    python benchmarks/ddp_scaling.py [--steps 40] [--warmup 5] [--per-rank-batch 32] [--ranks 2]
        [--out benchmarks/reference/ddp_scaling_latest.json]

It asserts nothing; it prints the ratios and writes JSON (with the machine's load average
before and after, which on a shared machine says how far to trust the ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
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


def _command(ranks: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    batch = args.per_rank_batch * ranks
    overrides = [f"workload={args.workload}", f"batch_size={batch}",
                 f"max_steps={args.steps}", "epochs=1", "time_budget_s=null",
                 f"train_limit={batch * args.steps}", "num_threads=1", "eval_limit=8",
                 "eval_every=null", f"log_every={args.log_every}",
                 "batching=critical_path", "strategy=aligned",  # one fixed choice: no auto trials
                 f"run_dir={run_dir}", *args.override]
    launcher = [sys.executable, "-m", "experiments.train_model"] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
         "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
         "-m", "experiments.train_model"]
    return [*launcher, *overrides]


def _env(root: Path = ROOT) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _summary(ranks: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    s = json.loads((run_dir / "summary.json").read_text())
    trees = s["train/examples_per_s"] * s["train/seconds"]
    rows = [h for h in s["history"] if "train/seconds" in h and "train/loss" in h]
    first, last = rows[args.warmup // args.log_every - 1], rows[-1]  # after the warm-up
    steady = (last["train/epoch"] - first["train/epoch"]) * s["train_trees"] / \
        (last["train/seconds"] - first["train/seconds"])
    return {"ranks": ranks, "steps": s["steps"], "trees": round(trees),
            "steady_trees_per_s": steady, "train_seconds": s["train/seconds"],
            "prepare_seconds": s["train/prepare_seconds"],
            "trees_per_s": s["train/examples_per_s"],
            "execute_trees_per_s": trees / max(s["train/seconds"] - s["train/prepare_seconds"],
                                               1e-9)}


def launch(ranks: int, args: argparse.Namespace, workdir: Path, copies: int = 1,
           root: Path = ROOT) -> tuple[int, list[Path], list[subprocess.Popen[str]], float]:
    """Start a training run on ``ranks`` processes (or ``copies`` independent one-process
    runs at once, ``ranks == 1``) of the checkout at ``root``; :func:`collect` ends it."""
    dirs = [workdir / f"r{ranks}_{time.time_ns()}_{c}" for c in range(copies)]
    procs = [subprocess.Popen(_command(ranks, args, d), cwd=root, env=_env(root), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for d in dirs]
    return ranks, dirs, procs, time.perf_counter()


def collect(run: tuple[int, list[Path], list[subprocess.Popen[str]], float],
            args: argparse.Namespace) -> dict[str, Any]:
    """Wait for a :func:`launch`; its summary's throughput numbers (summed over copies)."""
    ranks, dirs, procs, start = run
    for proc in procs:
        out, _ = proc.communicate(timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"{ranks}-rank run failed:\n{out[-4000:]}")
    parts = [_summary(ranks, args, d) for d in dirs]
    if len(dirs) == 1:
        return {**parts[0], "wall_seconds": time.perf_counter() - start}
    summed = ("trees", "steady_trees_per_s", "trees_per_s", "execute_trees_per_s")
    return {"ranks": ranks, "copies": len(dirs),
            **{k: sum(p[k] for p in parts) for k in summed},
            "wall_seconds": time.perf_counter() - start, "each": parts}


def pair(a: tuple[int, int], args: argparse.Namespace, workdir: Path, root: Path = ROOT
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs ``a = (ranks, copies)`` of one process and of the other kind: one after the
    other, or at the same time with ``--concurrent``."""
    first = (1, args, workdir, 1, root)
    second = (a[0], args, workdir, a[1], root)
    if args.concurrent:
        one, other = launch(*first), launch(*second)
        return collect(one, args), collect(other, args)
    one_done = collect(launch(*first), args)
    return one_done, collect(launch(*second), args)


_MATMUL = """
import sys, time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256); b = torch.randn(256, 256)
end, n = time.perf_counter() + float(sys.argv[1]), 0
while time.perf_counter() < end:
    a @ b
    n += 1
print(n / float(sys.argv[1]))
"""


def wait_for_load(limit: float | None, patience: float) -> float:
    """Wait (at most ``patience`` seconds) until the 1-minute load average is below
    ``limit``; the load average then."""
    end = time.monotonic() + patience
    while limit is not None and os.getloadavg()[0] >= limit and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def matmul(procs: int, seconds: float, concurrent: bool = False) -> tuple[float, float]:
    """Matmuls per second of one single-thread loop and of ``procs`` independent ones at
    once (summed): one after the other, or all at the same time with ``concurrent``."""
    def start(k: int) -> list[subprocess.Popen[str]]:
        return [subprocess.Popen([sys.executable, "-c", _MATMUL, str(seconds)], env=_env(),
                                 text=True, stdout=subprocess.PIPE) for _ in range(k)]

    def done(run: list[subprocess.Popen[str]]) -> float:
        return sum(float(p.communicate(timeout=seconds + 120)[0]) for p in run)

    if concurrent:
        one, many = start(1), start(procs)
        return done(one), done(many)
    first = done(start(1))
    return first, done(start(procs))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--per-rank-batch", type=int, default=32, help="trees per rank per step")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=2, help="alternated runs of each")
    p.add_argument("--log-every", type=int, default=None,
                   help="steps per log row (default 5, or 1 if --warmup is no multiple of 5)")
    p.add_argument("--matmul-seconds", type=float, default=4.0)
    p.add_argument("--workload", default="tree_lstm")
    p.add_argument("--override", nargs="*", default=[], help="more train_model overrides")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    p.add_argument("--max-load", type=float, default=None,
                   help="before each repeat, wait until the 1-minute load average is below this")
    p.add_argument("--patience", type=float, default=300.0, help="seconds to wait for it")
    p.add_argument("--concurrent", action="store_true",
                   help="run the one-process run and the N-process run of each pair at the "
                        "same time (every process then gets the same CPU share of a busy "
                        "machine: the ratio measures the implementation, not the machine)")
    p.add_argument("--baseline-root", type=Path, default=None,
                   help="another checkout whose N-rank run joins each repeat (before/after)")
    args = p.parse_args(argv)
    if args.log_every is None:
        args.log_every = 5 if args.warmup % 5 == 0 else 1
    if args.ranks < 2 or min(args.per_rank_batch, args.repeats, args.warmup,
                             args.log_every) < 1 or args.steps <= args.warmup or \
            args.warmup % args.log_every:
        p.error("--ranks must be >= 2, --per-rank-batch, --repeats, --warmup, --log-every "
                ">= 1, --steps > --warmup, and --warmup a multiple of --log-every")
    n = args.ranks
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    paired: list[dict[str, float]] = []
    baselines: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            start_load = wait_for_load(args.max_load, args.patience)
            one, many = pair((n, 1), args, Path(tmp))
            if args.baseline_root is not None:
                base_one, base = pair((n, 1), args, Path(tmp), args.baseline_root.resolve())
                baselines.append({"repeat": r, "1": base_one, str(n): base})
            one_c, indep = pair((1, n), args, Path(tmp))
            mm1, mmn = matmul(n, args.matmul_seconds, args.concurrent)
            load = os.getloadavg()[0]
            runs += [one, many, one_c]
            controls.append({"repeat": r, "independent": indep, "one": one_c, "matmul_1": mm1,
                             f"matmul_{n}": mmn, "loadavg_1min_start": start_load,
                             "loadavg_1min": load})
            ratio = many["steady_trees_per_s"] / one["steady_trees_per_s"]
            ind = indep["steady_trees_per_s"] / one_c["steady_trees_per_s"]
            paired.append({"ratio": ratio, "independent_ratio": ind, "matmul_ratio": mmn / mm1,
                           "vs_independent": ratio / ind, "vs_matmul": ratio / (mmn / mm1),
                           "loadavg_1min": load})
            if baselines:
                b = baselines[-1]
                paired[-1]["baseline_ratio"] = b[str(n)]["steady_trees_per_s"] / \
                    b["1"]["steady_trees_per_s"]
                print(f"repeat {r}: baseline checkout x{paired[-1]['baseline_ratio']:.2f} "
                      f"({b['1']['steady_trees_per_s']:.1f} -> "
                      f"{b[str(n)]['steady_trees_per_s']:.1f} trees/s)", flush=True)
            print(f"repeat {r} (load {start_load:.2f} -> {load:.2f}): 1 process "
                  f"{one['steady_trees_per_s']:.1f} trees/s, {n} ranks "
                  f"{many['steady_trees_per_s']:.1f} (x{ratio:.2f}), "
                  f"{n} independent {indep['steady_trees_per_s']:.1f} (x{ind:.2f}), matmul "
                  f"x{mmn / mm1:.2f}", flush=True)
    best = {k: max((x for x in runs if x["ranks"] == k), key=lambda x: x["steady_trees_per_s"])
            for k in (1, n)}
    one, many = best[1], best[n]
    best_indep = max((c["independent"] for c in controls),
                     key=lambda x: x["steady_trees_per_s"])
    best_mm = {k: max(c[f"matmul_{k}"] for c in controls) for k in (1, n)}
    ratio = many["steady_trees_per_s"] / one["steady_trees_per_s"]
    ind = best_indep["steady_trees_per_s"] / one["steady_trees_per_s"]
    mm = best_mm[n] / best_mm[1]
    result = {
        "benchmark": "ddp_scaling", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "workload": args.workload, "ranks": n, "per_rank_batch": args.per_rank_batch,
        "steps": args.steps, "warmup": args.warmup, "log_every": args.log_every,
        "threads_per_rank": 1, "backend": "gloo", "overrides": args.override,
        "cpu_count": os.cpu_count(), "repeats": args.repeats,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "throughput_ratio": ratio,
        "whole_run_throughput_ratio": many["trees_per_s"] / one["trees_per_s"],
        "execute_throughput_ratio": many["execute_trees_per_s"] / one["execute_trees_per_s"],
        "independent_ratio": ind, "matmul_ratio": mm,
        "ratio_of_ratios_vs_independent": ratio / ind, "ratio_of_ratios_vs_matmul": ratio / mm,
        "paired_median": {k: statistics.median(p[k] for p in paired) for k in paired[0]},
        "best": {"1": one, str(n): many, f"{n}_independent": best_indep},
        "paired": paired, "runs": runs, "controls": controls,
        **({"baseline_root": str(args.baseline_root), "baselines": baselines}
           if baselines else {})}
    med = result["paired_median"]
    print(f"{n} ranks x 1 thread vs 1 process x 1 thread, {args.per_rank_batch} trees per rank "
          f"per step: throughput x{ratio:.2f} after warm-up (whole run "
          f"x{result['whole_run_throughput_ratio']:.2f}, executing only "
          f"x{result['execute_throughput_ratio']:.2f}); controls: {n} independent trainings "
          f"x{ind:.2f}, matmul x{mm:.2f}; ratio of ratios {ratio / ind:.2f} (independent), "
          f"{ratio / mm:.2f} (matmul); paired per repeat (median): x{med['ratio']:.2f}, "
          f"{med['vs_independent']:.2f}, {med['vs_matmul']:.2f}; load average "
          f"{load_before[0]:.2f} before, {result['loadavg_after'][0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
