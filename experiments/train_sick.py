"""Train the SICK relatedness Tree-LSTM through edbatch's batched executor:
``python -m experiments.train_sick [--epochs 10] [--hidden-dim 100] ...``.

Every mini-batch of pairs is merged from the cached per-pair graphs of
:class:`~edbatch.workloads.tree_lstm_sick.TreeLSTMSick`, scheduled by a heuristic
(``--scheduler``, ``dynet_agenda`` by default), memory-planned, and run forward and backward
by :class:`~edbatch.executor.torch_executor.TorchExecutor`; Adagrad (lr 0.05, weight decay
1e-4, as Tai et al.; ``--optimizer adam`` for Adam) updates the parameters on the mean KL
per pair. After each epoch the dev metrics (Pearson r, Spearman rho, MSE of
``sum_k k p_k``) are computed from the root states the executor returns; the parameters of
the best dev Pearson are scored on test. The word embeddings start random (no GloVe ships
with the repository) and are trained.

The JSON summary (``--out``) holds the settings, per-epoch dev metrics, the test metrics and
the wall time.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor import init_params
from edbatch.executor.cells_sick import similarity_probs
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.tree_lstm_sick import TreeLSTMSick, relatedness_metrics
from experiments import _task_train as task

__all__ = ["predict", "train", "with_roots"]

log = logging.getLogger("experiments.train_sick")
_P = "tree_lstm_sick"


def with_roots(workload: TreeLSTMSick, split: str, indices: Sequence[int]
               ) -> tuple[Graph, list[int], list[int]]:
    """The mini-batch graph with both root states of every pair among its outputs
    (``[loss, roots_a..., roots_b...]``) and the root node ids."""
    merged = workload.minibatch(split, indices)
    sims = np.flatnonzero(merged.op_ids == merged.vocab.id(f"{_P}.sim"))
    ptr = merged.operand_ptr[sims]
    roots_a = merged.operand_ids[ptr].astype(np.int64)
    roots_b = merged.operand_ids[ptr + 1].astype(np.int64)
    outputs = np.concatenate([merged.outputs[:1], roots_a, roots_b])
    graph = Graph.from_arrays(merged.vocab, merged.op_ids, merged.operand_ptr,
                              merged.operand_ids, attrs=merged.attrs, instance=merged.instance,
                              outputs=outputs, depth=merged.depth, validate=False)
    return graph, roots_a.tolist(), roots_b.tolist()


def predict(workload: TreeLSTMSick, executor: TorchExecutor, params: Mapping[str, Tensor],
            split: str, batch_size: int, scheduler: str, strategy: str,
            limit: int | None = None) -> np.ndarray:
    """Predicted scores ``sum_k k p_k`` of the first ``limit`` (default: every) pairs of
    ``split`` (batched, no grad)."""
    sched = make_scheduler(scheduler)
    n = len(workload.load(split)) if limit is None else min(limit, len(workload.load(split)))
    out: list[Tensor] = []
    hidden = workload.hidden_dim
    head = [params[f"{_P}.{k}"] for k in ("W_x", "W_abs", "W_x.b", "W_p", "W_p.b")]
    with torch.no_grad():
        for start in range(0, n, batch_size):
            graph, ra, rb = with_roots(workload, split, range(start, min(n, start + batch_size)))
            schedule = sched(graph)
            res = executor.run(graph, schedule, plan_memory(graph, schedule, strategy),  # type: ignore[arg-type]
                               params)
            h_a = torch.cat([res.outputs[v] for v in ra])[:, :hidden]
            h_b = torch.cat([res.outputs[v] for v in rb])[:, :hidden]
            probs = similarity_probs(h_a, h_b, *head).exp()
            out.append(probs @ torch.arange(1, probs.shape[1] + 1, dtype=probs.dtype))
    return torch.cat(out).cpu().numpy()


def _scores(workload: TreeLSTMSick, split: str, limit: int | None) -> np.ndarray:
    return np.array([inst.score for inst in workload.load(split)[:limit]])


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, select the epoch by dev Pearson, score it on test; return the summary."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wl = TreeLSTMSick(embed_dim=args.embed_dim, hidden_dim=args.hidden_dim,
                      sim_dim=args.sim_dim)
    params = init_params(wl, torch.Generator().manual_seed(args.seed))
    optimizer = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}[args.optimizer]
    opt = optimizer(params.values(), lr=args.lr, weight_decay=args.weight_decay)
    executor = TorchExecutor()
    sched = make_scheduler(args.scheduler)
    n_train = len(wl.load("train"))
    n_train = n_train if args.train_limit is None else min(args.train_limit, n_train)
    rng = np.random.default_rng(args.seed)
    gold_dev = _scores(wl, "dev", args.eval_limit)
    gold_test = _scores(wl, "test", args.eval_limit)
    history: list[dict[str, float]] = []
    best: tuple[float, dict[str, Tensor]] | None = None
    start = time.perf_counter()
    batches = 0
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n_train)
        total = 0.0
        for lo in range(0, n_train, args.batch_size):
            idx = np.sort(order[lo:lo + args.batch_size]).tolist()
            loss, used = task.graph_step(wl, executor, sched, args.strategy, params, opt, idx)
            total, batches = total + loss, batches + used
        pred = predict(wl, executor, params, "dev", args.eval_batch_size, args.scheduler,
                       args.strategy, args.eval_limit)
        dev = relatedness_metrics(pred, gold_dev)
        history.append({"epoch": epoch, "train_kl": total / n_train,
                        "seconds": time.perf_counter() - start,
                        **{f"dev_{k}": v for k, v in dev.items()}})
        log.info("epoch %d: train KL %.4f, dev pearson %.4f spearman %.4f mse %.4f (%.0fs)",
                 epoch, total / n_train, dev["pearson"], dev["spearman"], dev["mse"],
                 history[-1]["seconds"])
        if best is None or dev["pearson"] > best[0]:
            best = (dev["pearson"], task.snapshot(params))
    assert best is not None
    chosen = best[1]
    test = relatedness_metrics(predict(wl, executor, chosen, "test", args.eval_batch_size,
                                       args.scheduler, args.strategy, args.eval_limit), gold_test)
    dev = relatedness_metrics(predict(wl, executor, chosen, "dev", args.eval_batch_size,
                                      args.scheduler, args.strategy, args.eval_limit), gold_dev)
    summary = {"workload": _P, "settings": vars(args), "embeddings": "random (no GloVe)",
               "train_pairs": n_train, "wall_seconds": time.perf_counter() - start,
               "executor_batches": batches, "history": history,
               "best_epoch": task.best_epoch(history, "dev_pearson"),
               **{f"dev_{k}": v for k, v in dev.items()},
               **{f"test_{k}": v for k, v in test.items()}}
    log.info("best epoch %d: dev pearson %.4f; test pearson %.4f spearman %.4f mse %.4f",
             summary["best_epoch"], dev["pearson"], test["pearson"], test["spearman"],
             test["mse"])
    if args.out:
        task.write_json(args.out, summary, 1)
    return summary


def parser() -> argparse.ArgumentParser:
    """The command-line options."""
    p = argparse.ArgumentParser(prog="python -m experiments.train_sick", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--eval-batch-size", type=int, default=250)
    p.add_argument("--embed-dim", type=int, default=100)
    p.add_argument("--hidden-dim", type=int, default=100)
    p.add_argument("--sim-dim", type=int, default=50)
    p.add_argument("--optimizer", choices=("adam", "adagrad"), default="adagrad")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    task.add_tail_args(p, "runs/tree_lstm_sick/train_sick.json", "first N train pairs only",
                       "pairs")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point."""
    return task.log_main(parser(), argv, ("epochs", "batch_size", "eval_batch_size", "train_limit",
                                     "eval_limit"), train, {"eval_limit": 2})


if __name__ == "__main__":
    main()
