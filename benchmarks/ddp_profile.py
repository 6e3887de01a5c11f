"""Where a data-parallel ``experiments.train_model`` step spends its time, per rank.

Runs the same training as ``benchmarks/ddp_scaling.py`` (N ranks with ``--per-rank-batch``
trees each, and one process with as many) in forked processes, with timers wrapped around the
step's parts: ``record`` (merging the trees' graphs), ``schedule``, ``plan`` (memory),
``prepare`` (building the mini-batch graph, scheduling and planning it), ``forward`` (the
executor's training run, its program compilation included), ``backward``, ``optimizer`` (Adam),
and every collective, split into ``wait`` (a barrier just before it: the time this rank waits
for the slowest) and the collective itself. The barrier changes the timing a little; it is for
the breakdown only (the scaling benchmark has none).

    python benchmarks/ddp_profile.py [--steps 30] [--warmup 5] [--per-rank-batch 32]

Prints mean milliseconds per step after ``--warmup`` steps, per rank; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wrap(owner: Any, attr: str, key: str, times: dict[str, list[float]],
          before: Any = None, when: Any = None) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if when is not None and not when(*args, **kwargs):
            return fn(*args, **kwargs)
        if before is not None:
            t0 = time.perf_counter()
            before()
            times[f"wait:{key}"].append(time.perf_counter() - t0)
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args, **kwargs)
        times[key].append(time.perf_counter() - t0)
        times[f"cpu:{key}"].append(time.process_time() - c0)
        return out

    setattr(owner, attr, timed)


def _rank(rank: int, world: int, port: int, overrides: list[str], out: Path) -> None:
    os.environ.pop("WORLD_SIZE", None)
    if world > 1:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from hydra import compose, initialize_config_dir

    import experiments._train_model_data as data
    import experiments._train_model_loop as loop
    import experiments.train_model as tm
    from edbatch.executor.distributed import DataParallel, PendingGrads, PendingSum
    from edbatch.executor.torch_executor import TorchExecutor
    from edbatch.workloads.base import Workload

    times: dict[str, list[float]] = defaultdict(list)
    barrier = (lambda: dist.barrier()) if world > 1 else None
    _wrap(Workload, "minibatch", "record", times)
    _wrap(data, "plan_memory", "plan", times)
    _wrap(data, "build_minibatch", "build", times)
    _wrap(data, "finish_minibatch", "finish", times)
    _wrap(TorchExecutor, "run", "forward", times, when=lambda *a, **k: k.get("grad"))
    _wrap(torch.Tensor, "backward", "backward", times)
    _wrap(torch.optim.Adam, "step", "optimizer", times)
    _wrap(DataParallel, "sum", "sum", times, before=barrier)
    _wrap(DataParallel, "sum_grads_async", "start_grads", times)
    _wrap(PendingGrads, "finish", "sum_grads", times, before=barrier,
          when=lambda self: not self.done)
    in_step = [False]
    # blocked on the step's count sum after the forward (not the log rows' sums)
    _wrap(PendingSum, "result", "counts", times, when=lambda *a, **k: in_step[0])
    _wrap(loop.Trainer, "train_step", "train_step", times)
    step = loop.Trainer.train_step

    def flagged(*args: Any, **kwargs: Any) -> Any:
        in_step[0] = True
        try:
            return step(*args, **kwargs)
        finally:
            in_step[0] = False

    loop.Trainer.train_step = flagged
    _wrap(data.MinibatchCache, "get", "get", times)
    make = data.make_model_scheduler

    def make_timed(*args: Any) -> Any:
        sched = make(*args)

        def call(graph: Any) -> Any:
            t0 = time.perf_counter()
            s = sched(graph)
            times["schedule"].append(time.perf_counter() - t0)
            return s
        return call

    data.make_model_scheduler = make_timed
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train_model", overrides)
    summary = tm.train_model(cfg)
    (out / f"rank{rank}.json").write_text(json.dumps({"times": times, "summary": {
        k: v for k, v in summary.items() if k != "history"}}))


def profile(world: int, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Per-rank mean milliseconds per step of each part, after the warm-up."""
    import torch.multiprocessing as mp

    batch = args.per_rank_batch * world
    out = tmp / f"w{world}"
    out.mkdir()
    overrides = [f"workload={args.workload}", f"batch_size={batch}", f"max_steps={args.steps}",
                 "epochs=1", "time_budget_s=null", f"train_limit={batch * args.steps}",
                 "num_threads=1", "eval_limit=8", "eval_every=null", "log_every=5",
                 "batching=critical_path", "strategy=aligned",  # one fixed choice, no trials
                 f"run_dir={out}/run", *args.override]
    mp.start_processes(_rank, args=(world, _free_port(), overrides, out), nprocs=world,
                       start_method="fork")
    rows = []
    for r in range(world):
        data = json.loads((out / f"rank{r}.json").read_text())
        times = data["times"]
        # steps after warm-up; the sum() collectives run once per step plus a few for logs
        steps = len(times["train_step"]) - args.warmup
        row: dict[str, Any] = {"rank": r, "world": world, "steps": steps}
        for key, vals in sorted(times.items()):
            # sum(): once per log row (every 5 steps) and evaluation: all of them; the
            # others: once per step, the last ``steps`` calls
            skip = 0 if key.endswith("sum") else len(vals) - steps
            row[key] = 1e3 * sum(vals[max(skip, 0):]) / steps
        for prefix in ("", "cpu:"):
            row[f"{prefix}step"] = row.pop(f"{prefix}train_step") + row.pop(f"{prefix}get")
            row[f"{prefix}prepare"] = (row.pop(f"{prefix}build", 0.0)
                                       + row.pop(f"{prefix}finish", 0.0))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--per-rank-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--workload", default="tree_lstm")
    p.add_argument("--override", nargs="*", default=[], help="more train_model overrides")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["WANDB_MODE"] = "disabled"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        rows = profile(1, args, Path(tmp)) + profile(args.ranks, args, Path(tmp))
    keys = ["step", "prepare", "record", "schedule", "plan", "forward", "counts", "backward",
            "start_grads", "wait:sum_grads", "sum_grads", "optimizer", "wait:sum", "sum"]
    print(f"ms per step after {args.warmup} warm-up steps (load {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    print(f"{'':18}" + "".join(f"{k.replace('wait:', 'w:'):>10}" for k in keys))
    for prefix in ("", "cpu:"):
        for row in rows:
            print(f"{prefix or 'wall'} world {row['world']} r{row['rank']}  ".rjust(18) +
                  "".join(f"{row.get(prefix + k, 0.0):10.2f}" for k in keys))
    result = {"load_before": load, "load_after": os.getloadavg(), "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
