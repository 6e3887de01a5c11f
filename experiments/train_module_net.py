"""Train the CLEVR module network through edbatch's batched executor; report answer accuracy.

    nice -n 5 python -m experiments.train_module_net --epochs 15 \\
        --out runs/module_net/summary.json

The training questions are cut into mini-batches once (a seeded permutation); each is merged,
scheduled with a heuristic of :mod:`edbatch.schedule` and memory-planned once, and every epoch
visits them in a new seeded order. A step runs one with
:class:`~edbatch.executor.torch_executor.TorchExecutor` (``grad=True``); Adam updates the
parameters from the gradient of the mean per-question cross-entropy (the ``answer`` nodes,
see :mod:`edbatch.workloads.module_net`). Accuracy runs the graphs of the questions' *terminal*
modules through the same executor and applies the answer classifier to their outputs
(:func:`~edbatch.executor.cells_module_net.answer_logits`). The model of the best validation
accuracy is scored on the test split, overall and per question family.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from edbatch.executor.cells_module_net import answer_logits
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, GraphBuilder
from edbatch.memory import MemoryPlan, plan_memory
from edbatch.schedule import Schedule, make_scheduler
from edbatch.workloads.module_net import ModuleNet
from experiments._task_train import adam, chunks, epoch_steps, run_main, snapshot

__all__ = ["accuracy", "main", "train"]

_Key = tuple[str, tuple[int, ...], bool]


class _Batches:
    """Mini-batch graphs (loss or terminal) with schedules and memory plans, made once."""

    def __init__(self, workload: ModuleNet, scheduler: str) -> None:
        self.workload, self.scheduler = workload, make_scheduler(scheduler)
        self._done: dict[_Key, tuple[Graph, Schedule, MemoryPlan, list[int]]] = {}

    def _get(self, split: str, indices: Sequence[int], terminal: bool
             ) -> tuple[Graph, Schedule, MemoryPlan, list[int]]:
        key = (split, tuple(int(i) for i in indices), terminal)
        if key not in self._done:
            if terminal:
                b = GraphBuilder(self.workload.vocab)
                data = self.workload.load(split)
                outs = []
                for k, i in enumerate(key[1]):
                    b.instance = k
                    outs.append(self.workload.emit_terminal(data[i], b))
                graph = b.build(outs)
            else:
                graph, outs = self.workload.minibatch(split, key[1]), []
            schedule = self.scheduler(graph)
            self._done[key] = (graph, schedule, plan_memory(graph, schedule, "aligned"), outs)
        return self._done[key]

    def loss(self, executor: TorchExecutor, split: str, indices: Sequence[int],
             params: Mapping[str, Tensor]) -> Tensor:
        """The summed cross-entropy of ``indices`` through the batched executor."""
        graph, schedule, plan, _ = self._get(split, indices, False)
        result = executor.run(graph, schedule, plan, params, grad=True)
        assert result.loss is not None
        return result.loss

    def predict(self, executor: TorchExecutor, split: str, indices: Sequence[int],
                params: Mapping[str, Tensor]) -> list[int]:
        """The predicted answer index of each question of ``indices``."""
        graph, schedule, plan, outs = self._get(split, indices, True)
        result = executor.run(graph, schedule, plan, params)
        h = torch.cat([result.outputs[v] for v in outs])
        logits = answer_logits(h, params["module_net.answer.W"], params["module_net.answer.b"])
        return logits.argmax(dim=1).tolist()


def accuracy(batches: _Batches, executor: TorchExecutor, split: str,
             params: Mapping[str, Tensor], batch_size: int = 250) -> tuple[float, dict]:
    """Answer accuracy of ``split`` and per question family."""
    data = batches.workload.load(split)
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            idx = range(start, min(len(data), start + batch_size))
            for i, pred in zip(idx, batches.predict(executor, split, idx, params), strict=True):
                fam = hits[data[i].question.family]
                fam[0] += int(pred == data[i].answer)
                fam[1] += 1
    total = sum(h for h, _ in hits.values()) / len(data)
    return total, {f: round(h / n, 4) for f, (h, n) in sorted(hits.items())}


def train(epochs: int = 15, batch_size: int = 64, lr: float = 5e-3, embed_dim: int = 16,
          hidden_dim: int = 64, scheduler: str = "critical_path", seed: int = 0,
          log: bool = True) -> dict:
    """Train; return the summary (accuracies, per-family test accuracy, epochs, seconds)."""
    torch.manual_seed(seed)
    workload = ModuleNet(embed_dim=embed_dim, hidden_dim=hidden_dim)
    params, optimizer = adam(workload, seed, lr)
    executor = TorchExecutor("cpu")
    batches = _Batches(workload, scheduler)
    rng = np.random.default_rng(seed)
    n_train = len(workload.load("train"))
    parts = chunks(rng, n_train, batch_size)
    best = (-1.0, 0, snapshot(params))
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        train_loss = epoch_steps(
            rng, parts, lambda idx: batches.loss(executor, "train", idx, params), optimizer)
        val, _ = accuracy(batches, executor, "val", params)
        if val > best[0]:
            best = (val, epoch, snapshot(params))
        if log:
            print(f"epoch {epoch:3d}  train loss {train_loss / n_train:.3f}  val acc "
                  f"{val:.3f}  ({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    test, families = accuracy(batches, executor, "test", best[2])
    return {"test_accuracy": test, "test_accuracy_by_family": families,
            "best_val_accuracy": best[0], "best_epoch": best[1], "epochs": epochs,
            "seconds": seconds, "batch_size": batch_size, "embed_dim": embed_dim,
            "hidden_dim": hidden_dim, "lr": lr, "scheduler": scheduler, "seed": seed}


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--embed-dim", type=int, default=16)
    ap.add_argument("--hidden-dim", type=int, default=64)
    ap.add_argument("--scheduler", default="critical_path")
    return run_main(ap, argv, ("epochs", "batch_size"), lambda a: train(
        a.epochs, a.batch_size, a.lr, a.embed_dim, a.hidden_dim, a.scheduler, a.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
