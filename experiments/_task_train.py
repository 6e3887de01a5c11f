"""Pieces shared by the per-workload training entry points (``experiments.train_sick``,
``train_ggnn``, ``train_parser``, ``train_tagger``, ``train_module_net``, ``train_moe``):
the trailing command-line options, their bound checks, one optimizer step, the parameter
snapshot of the best epoch, and the JSON summary printed and written with ``--out``."""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.cli import out_file, run
from edbatch.errors import UnknownNameError
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import Scheduler, make_scheduler
from edbatch.workloads import Workload
from experiments._schema import is_seed

__all__ = ["adam", "add_run_args", "add_tail_args", "best_epoch", "check_at_least", "check_common",
           "check_min", "chunks", "epoch_steps", "finish", "graph_step", "log_main", "run_main",
           "snapshot", "step", "write_json"]


def add_tail_args(p: argparse.ArgumentParser, out: str, train_help: str, unit: str,
                  strategies: Sequence[str] | None = None) -> None:
    """``--scheduler``, ``--strategy`` (one of ``strategies`` when given), ``--train-limit``
    (help ``train_help``), ``--eval-limit`` (first N dev and test ``unit``), ``--threads``,
    ``--seed`` and ``--out`` (default ``out``) of the long-form CLIs."""
    p.add_argument("--scheduler", default="dynet_agenda")
    p.add_argument("--strategy", default="aligned", choices=strategies)
    p.add_argument("--train-limit", type=int, default=None, help=train_help)
    p.add_argument("--eval-limit", type=int, default=None,
                   help=f"first N dev and test {unit} only (smoke runs)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=out)


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """``--seed``, ``--threads`` and ``--out`` (a path, no default) of the short CLIs."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write the summary JSON here")


def run_main(ap: argparse.ArgumentParser, argv: Sequence[str] | None, names: Sequence[str],
             train: Callable[[argparse.Namespace], dict[str, Any]]) -> dict[str, Any]:
    """Entry point of the short CLIs: add the run options, parse, check ``names`` >= 1, set
    the torch threads, train, print the summary and write it to ``--out``."""
    add_run_args(ap)
    args = ap.parse_args(argv)
    check_min(ap, args, names)
    check_common(ap, args)
    torch.set_num_threads(args.threads)
    summary = run(train, args)
    finish(summary, args.out)
    return summary


def adam(workload: Workload, seed: int, lr: float
         ) -> tuple[dict[str, Tensor], torch.optim.Optimizer]:
    """The parameters of ``workload`` drawn from ``seed`` and an Adam optimizer over them."""
    params = init_params(workload, torch.Generator().manual_seed(seed))
    return params, torch.optim.Adam(params.values(), lr=lr)


def check_at_least(p: argparse.ArgumentParser, args: argparse.Namespace,
                   names: Iterable[str], bounds: Mapping[str, int] | None = None) -> None:
    """Exit with a usage error naming the first option of ``names`` set below its bound
    (1 unless ``bounds`` says otherwise); ``None`` values are not checked."""
    for name in names:
        value, bound = getattr(args, name), (bounds or {}).get(name, 1)
        if value is not None and value < bound:
            p.error(f"--{name.replace('_', '-')} must be >= {bound}, got {value}")


def check_min(ap: argparse.ArgumentParser, args: argparse.Namespace,
              names: Sequence[str]) -> None:
    """Exit with one usage error naming all of ``names`` when any is below 1."""
    values = [getattr(args, n) for n in names]
    if min(values) < 1:
        flags = [f"--{n.replace('_', '-')}" for n in names]
        listed = ", ".join(flags[:-1]) + " and " + flags[-1]
        ap.error(f"{listed} must be >= 1, got " + ", ".join(str(v) for v in values))


#: Rates checked by :func:`check_common`: option -> True when it must be > 0 (else >= 0).
RATES = {"lr": True, "lr_decay": True, "weight_decay": False, "alpha": False}


def check_common(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error when ``--seed`` is outside numpy's [0, 2**32), ``--threads``
    is below 1 or any ``--*-dim`` size is below 1 (each reached numpy or torch as a
    traceback), a rate of :data:`RATES` is negative or not finite (torch's raw
    ``ValueError``, or a run that diverged), ``--scheduler`` is no registered name, or
    ``--out`` is a folder."""
    seed = getattr(args, "seed", 0)
    if not is_seed(seed):
        p.error(f"--seed must be in [0, 2**32), got {seed}")
    sizes = {k: v for k, v in vars(args).items()
             if (k in ("threads", "dim") or k.endswith("_dim")) and isinstance(v, int) and v < 1}
    for name, value in sizes.items():
        p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    for name, strict in RATES.items():
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and (value > 0 or
                                                                 (value == 0 and not strict))):
            p.error(f"--{name.replace('_', '-')} must be a finite number "
                    f"{'>' if strict else '>='} 0, got {value}")
    if isinstance(getattr(args, "scheduler", None), str):
        try:
            make_scheduler(args.scheduler)
        except UnknownNameError as e:
            p.error(f"--scheduler: {e.args[0]}")
    if getattr(args, "out", None) is not None:  # (None: no summary file)
        try:
            out_file(str(args.out))
        except argparse.ArgumentTypeError as e:
            p.error(f"argument --out: {e}")


def log_main(p: argparse.ArgumentParser, argv: Sequence[str] | None, names: Iterable[str],
             train: Callable[[argparse.Namespace], dict[str, Any]],
             bounds: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Entry point of the long-form CLIs: log to stderr, parse, check, train."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = p.parse_args(argv)
    check_at_least(p, args, names, bounds)
    check_common(p, args)
    return run(train, args)  # type: ignore[no-any-return]  # (an edbatch error: one line)


def write_json(path: str | Path, summary: Mapping[str, Any], indent: int) -> None:
    """Write ``summary`` as JSON to ``path``, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=indent) + "\n")


def finish(summary: Mapping[str, Any], out: Path | None) -> None:
    """Print ``summary`` as JSON and write it to ``out`` when given (short CLIs)."""
    print(json.dumps(summary, indent=2))
    if out is not None:
        write_json(out, summary, 2)


def snapshot(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Detached copies of ``params`` (the parameters of the best epoch so far)."""
    return {k: v.detach().clone() for k, v in params.items()}


def best_epoch(history: Sequence[Mapping[str, float]], key: str) -> int:
    """The 1-based epoch of ``history`` with the highest ``key``."""
    return 1 + int(np.argmax([h[key] for h in history]))


def step(optimizer: torch.optim.Optimizer, loss: Tensor, count: int) -> float:
    """One optimizer step on ``loss / count``; the summed loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    (loss / count).backward()
    optimizer.step()
    return float(loss.detach())


def graph_step(workload: Workload, executor: TorchExecutor, scheduler: Scheduler,
               strategy: str, params: Mapping[str, Tensor], optimizer: torch.optim.Optimizer,
               indices: list[int]) -> tuple[float, int]:
    """One optimizer step on the mean loss of train ``indices`` merged into one graph,
    scheduled, memory-planned (``strategy``) and run; the summed loss and the executor
    batches of the schedule."""
    graph = workload.minibatch("train", indices)
    schedule = scheduler(graph)
    res = executor.run(graph, schedule, plan_memory(graph, schedule, strategy), params,
                       grad=True)
    assert res.loss is not None
    return step(optimizer, res.loss, len(indices)), schedule.num_batches


def chunks(rng: np.random.Generator, n: int, batch_size: int) -> list[list[int]]:
    """``range(n)`` cut into sorted mini-batches of a seeded permutation."""
    perm = rng.permutation(n)
    return [np.sort(perm[k:k + batch_size]).tolist() for k in range(0, n, batch_size)]


def epoch_steps(rng: np.random.Generator, batches: Sequence[list[int]],
                loss: Callable[[list[int]], Tensor], optimizer: torch.optim.Optimizer) -> float:
    """One epoch: every mini-batch in a seeded order, one step on its mean loss each; the
    summed loss."""
    total = 0.0
    for k in rng.permutation(len(batches)).tolist():
        total += step(optimizer, loss(batches[k]), len(batches[k]))
    return total
