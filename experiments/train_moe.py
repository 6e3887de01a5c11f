"""Train the sparsely gated MoE UPOS tagger on EWT through edbatch's batched executor.

    python -m experiments.train_moe --train-sentences 4000 --epochs 3 --out runs/moe/summary.json

Every step routes its mini-batch with the *current* parameters
(:meth:`~edbatch.workloads.moe.MoETagger.set_routing_params`, then
:meth:`~edbatch.workloads.moe.MoETagger.route_all`: the graph follows the routing, see
:mod:`edbatch.workloads.moe`), builds the mini-batch graph, schedules it with a heuristic of
:mod:`edbatch.schedule`, plans its memory and runs it with
:class:`~edbatch.executor.torch_executor.TorchExecutor` (``grad=True``); Adam steps on the
mean per-token loss. Training uses Shazeer's gate noise (round = epoch); evaluation none.
The metric is dev and test token accuracy against the majority baseline (the train split's
most frequent tag, ``NOUN``, on every token).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.moe import MoEInstance, MoETagger, route
from experiments._task_train import adam, run_main, step

__all__ = ["accuracy", "main", "train"]


def _run(workload: MoETagger, executor: TorchExecutor, scheduler: object,
         insts: Sequence[MoEInstance], params: Mapping[str, Tensor], grad: bool) -> Tensor:
    workload.route_all(insts)
    graph = workload.build_graph(insts)
    schedule = scheduler(graph)  # type: ignore[operator]
    result = executor.run(graph, schedule, plan_memory(graph, schedule, "aligned"), params,
                          grad=grad)
    assert result.loss is not None
    return result.loss


def accuracy(workload: MoETagger, split: str, params: Mapping[str, Tensor]) -> float:
    """Token accuracy of ``split`` without gate noise: the argmax tag of ``W_o x^L + b_o``
    (the executor's graphs give losses, so predictions use the same vectorised forward the
    builder routes with, :func:`~edbatch.workloads.moe.route`)."""
    workload.set_noise_round(-1)
    data = workload.load(split)
    words = torch.tensor([w for i in data for w in i.word_ids])
    tags = torch.tensor([t for i in data for t in i.tag_ids])
    keys = torch.full((len(words), workload.layers), -1, dtype=torch.int64)
    names = workload.names
    with torch.no_grad():
        _, x = route(params, words, keys, workload.layers, workload.experts, workload.top_k)
        pred = torch.nn.functional.linear(x, params[names["out"]],
                                          params[names["out_b"]]).argmax(1)
    return float((pred == tags).double().mean())


def majority(workload: MoETagger, split: str) -> float:
    """Accuracy of always predicting the train split's most frequent tag."""
    top = Counter(t for i in workload.load("train") for t in i.tag_ids).most_common(1)[0][0]
    tags = [t for i in workload.load(split) for t in i.tag_ids]
    return sum(t == top for t in tags) / len(tags)


def train(train_sentences: int = 4000, epochs: int = 3, batch_size: int = 64,
          lr: float = 5e-3, dim: int = 32, experts: int = 8, top_k: int = 2, layers: int = 2,
          scheduler: str = "typewise_greedy", seed: int = 0, log: bool = True
          ) -> dict[str, float]:
    """Train; return the summary (accuracies, majority baselines, seconds)."""
    torch.manual_seed(seed)
    workload = MoETagger(dim=dim, expert_dim=dim, experts=experts, top_k=top_k,
                         layers=layers, seed=seed)
    params, optimizer = adam(workload, seed, lr)
    executor, make = TorchExecutor("cpu"), make_scheduler(scheduler)
    data = list(workload.load("train"))[:train_sentences]
    rng = np.random.default_rng(seed)
    start, tokens = time.perf_counter(), sum(len(i) for i in data)
    for epoch in range(1, epochs + 1):
        total = 0.0
        perm = rng.permutation(len(data))
        for k in range(0, len(data), batch_size):
            chunk = [data[int(i)] for i in perm[k:k + batch_size]]
            workload.set_noise_round(epoch)
            workload.set_routing_params(params)
            loss = _run(workload, executor, make, chunk, params, True)
            total += step(optimizer, loss, sum(len(i) for i in chunk))
        if log:
            print(f"epoch {epoch}  train loss/token {total / tokens:.3f}  dev accuracy "
                  f"{accuracy(workload, 'dev', params):.3f}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    return {"dev_accuracy": accuracy(workload, "dev", params),
            "test_accuracy": accuracy(workload, "test", params),
            "dev_majority": majority(workload, "dev"),
            "test_majority": majority(workload, "test"),
            "train_sentences": float(len(data)), "epochs": float(epochs),
            "seconds": seconds, "batch_size": float(batch_size), "dim": float(dim),
            "experts": float(experts), "top_k": float(top_k), "layers": float(layers),
            "lr": lr}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train-sentences", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--scheduler", default="typewise_greedy")
    return run_main(ap, argv, ("epochs", "batch_size", "train_sentences"), lambda a: train(
        a.train_sentences, a.epochs, a.batch_size, a.lr, a.dim, a.experts, a.top_k, a.layers,
        a.scheduler, a.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
