"""Train the GGNN on ESOL through edbatch's batched executor; report RMSE in log units.

    python -m experiments.train_ggnn --epochs 40 --out runs/ggnn_molecules/summary.json

The training molecules are cut into mini-batches once (a seeded permutation); each is
merged, scheduled with a heuristic of :mod:`edbatch.schedule` and memory-planned once, and
every epoch visits them in a new seeded order. A step runs one with
:class:`~edbatch.executor.torch_executor.TorchExecutor` (``grad=True``); Adam updates the
parameters from the gradient of the mean per-molecule loss. The loss is the squared error of
the *standardised* target (see :mod:`edbatch.workloads.ggnn_molecules`), so the RMSE in log
units is ``std * sqrt(sum of losses / molecules)``. The model of the lowest validation RMSE
is the one scored on the test split.

(``experiments.train_model`` scores SST tree roots and is not used for this regression.)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads.ggnn_molecules import GGNNMolecules
from experiments._task_train import adam, chunks, epoch_steps, run_main, snapshot

__all__ = ["main", "rmse", "train"]


class _Batches:
    """Mini-batch graphs with their schedules and memory plans, made once and kept."""

    def __init__(self, workload: GGNNMolecules, scheduler: str) -> None:
        self.workload, self.scheduler = workload, make_scheduler(scheduler)
        self._done: dict[tuple[str, tuple[int, ...]], tuple[Graph, Schedule, MemoryPlan]] = {}

    def run(self, executor: TorchExecutor, split: str, indices: Sequence[int],
            params: Mapping[str, Tensor], grad: bool) -> Tensor:
        """The summed loss of ``indices`` of ``split`` through the batched executor."""
        key = (split, tuple(int(i) for i in indices))
        if key not in self._done:
            graph = self.workload.minibatch(split, key[1])
            schedule = self.scheduler(graph)
            self._done[key] = (graph, schedule, plan_memory(graph, schedule, "aligned"))
        result = executor.run(*self._done[key], params, grad=grad)
        assert result.loss is not None
        return result.loss


def rmse(batches: _Batches, executor: TorchExecutor, split: str,
         params: Mapping[str, Tensor], batch_size: int = 128) -> float:
    """RMSE of ``split`` in log units (``std * sqrt(mean squared standardised error)``)."""
    workload = batches.workload
    n = len(workload.load(split))
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            idx = range(start, min(n, start + batch_size))
            total += float(batches.run(executor, split, idx, params, False))
    return workload.target_stats()[1] * math.sqrt(total / n)


def train(epochs: int = 40, batch_size: int = 32, lr: float = 2e-3, hidden_dim: int = 64,
          rounds: int = 4, scheduler: str = "depth", seed: int = 0,
          log: bool = True) -> dict[str, float]:
    """Train; return the summary (RMSEs, epochs, seconds)."""
    torch.manual_seed(seed)
    workload = GGNNMolecules(hidden_dim=hidden_dim, rounds=rounds)
    params, optimizer = adam(workload, seed, lr)
    executor = TorchExecutor("cpu")
    batches = _Batches(workload, scheduler)
    rng = np.random.default_rng(seed)
    n_train = len(workload.load("train"))
    parts = chunks(rng, n_train, batch_size)
    best = (math.inf, 0, snapshot(params))
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        train_loss = epoch_steps(
            rng, parts, lambda idx: batches.run(executor, "train", idx, params, True), optimizer)
        train_rmse = workload.target_stats()[1] * math.sqrt(train_loss / n_train)
        valid = rmse(batches, executor, "valid", params)
        if valid < best[0]:
            best = (valid, epoch, snapshot(params))
        if log:
            print(f"epoch {epoch:3d}  train (running) {train_rmse:.3f}  valid {valid:.3f}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    test = rmse(batches, executor, "test", best[2])
    return {"test_rmse": test, "best_valid_rmse": best[0], "best_epoch": float(best[1]),
            "epochs": float(epochs), "seconds": seconds, "batch_size": float(batch_size),
            "hidden_dim": float(hidden_dim), "rounds": float(rounds), "lr": lr}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--hidden-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scheduler", default="depth")
    return run_main(ap, argv, ("epochs", "batch_size"), lambda a: train(
        a.epochs, a.batch_size, a.lr, a.hidden_dim, a.rounds, a.scheduler, a.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
