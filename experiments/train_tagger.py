"""Train a UPOS tagger on UD English EWT through edbatch's batched executor:
``python -m experiments.train_tagger [--workload bilstm_char_tagger] [--epochs 4] ...``.

``--workload bilstm_char_tagger`` (default: rare words composed by a character BiLSTM) or
``bilstm_tagger`` (the plain 2-layer BiLSTM tagger with ``data="ewt"``; unknown words share
id 0). Every mini-batch of train sentences is merged from the cached per-sentence graphs
(cell granularity), scheduled by a heuristic (``--scheduler``, ``dynet_agenda`` by default),
memory-planned and run forward and backward by
:class:`~edbatch.executor.torch_executor.TorchExecutor`; Adam updates the parameters on the
summed per-word loss divided by the sentences of the batch (learning rate times ``--lr-decay``
after every epoch). After each epoch the dev UPOS
accuracy is computed from the per-word BiLSTM states the executor returns (the MLP of the
loss cell applied to them, argmax over the 17 tags); the parameters of the best dev accuracy
are scored on test. Embeddings start random (no pretrained vectors ship with the repository).

The JSON summary (``--out``) holds the settings, per-epoch dev accuracy, the dev and test
accuracy of the chosen epoch and the wall time.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import Workload, make_workload
from experiments import _task_train as task

__all__ = ["accuracy", "make_tagger", "train", "with_states"]

log = logging.getLogger("experiments.train_tagger")
#: workload -> the prefix of its op types and parameters.
PREFIX = {"bilstm_char_tagger": "char_tagger", "bilstm_tagger": "bilstm"}


def make_tagger(args: argparse.Namespace) -> Workload:
    """The workload at cell granularity with the sizes of ``args`` (EWT data)."""
    if args.workload == "bilstm_tagger":
        return make_workload("bilstm_tagger", data="ewt", embed_dim=args.word_dim,
                             hidden_dim=args.hidden_dim)
    return make_workload("bilstm_char_tagger", char_dim=args.char_dim, embed_dim=args.word_dim,
                         hidden_dim=args.hidden_dim, mlp_dim=args.mlp_dim,
                         min_count=args.min_count)


def with_states(workload: Workload, split: str, indices: Sequence[int]
                ) -> tuple[Graph, np.ndarray, np.ndarray, np.ndarray]:
    """The mini-batch graph with every word's forward and backward top-layer state among
    its outputs (``[loss, fwd..., bwd...]``), those node ids and the gold tag ids (the
    operands and attrs of the loss nodes, in word order)."""
    merged = workload.minibatch(split, indices)
    prefix = PREFIX[workload.name]
    losses = np.flatnonzero(merged.op_ids == merged.vocab.id(f"{prefix}.loss"))
    ptr = merged.operand_ptr[losses]
    fwd = merged.operand_ids[ptr].astype(np.int64)
    bwd = merged.operand_ids[ptr + 1].astype(np.int64)
    outputs = np.concatenate([merged.outputs[:1], fwd, bwd])
    graph = Graph.from_arrays(merged.vocab, merged.op_ids, merged.operand_ptr,
                              merged.operand_ids, attrs=merged.attrs, instance=merged.instance,
                              outputs=outputs, depth=merged.depth, validate=False)
    return graph, fwd, bwd, np.asarray(merged.attrs)[losses]


def accuracy(workload: Workload, executor: TorchExecutor, params: Mapping[str, Tensor],
             split: str, batch_size: int, scheduler: str, strategy: str,
             limit: int | None = None) -> float:
    """UPOS accuracy over the first ``limit`` (default: every) sentences of ``split``."""
    sched, prefix = make_scheduler(scheduler), PREFIX[workload.name]
    n = len(workload.load(split)) if limit is None else min(limit, len(workload.load(split)))
    w_h, b_h, w_o, b_o = (params[f"{prefix}.{k}"] for k in ("hidden", "hidden.b", "out",
                                                            "out.b"))
    hidden = w_h.shape[1] // 2
    right = total = 0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            graph, fwd, bwd, gold = with_states(workload, split,
                                                range(start, min(n, start + batch_size)))
            schedule = sched(graph)
            res = executor.run(graph, schedule, plan_memory(graph, schedule, strategy),  # type: ignore[arg-type]
                               params)
            x = torch.cat([torch.cat([res.outputs[int(v)] for v in ids])[:, :hidden]
                           for ids in (fwd, bwd)], dim=1)
            pred = F.linear(torch.tanh(F.linear(x, w_h, b_h)), w_o, b_o).argmax(1)
            right += int((pred.cpu().numpy() == gold).sum())
            total += len(gold)
    return right / total


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, select the epoch by dev accuracy, score it on test; return the summary."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wl = make_tagger(args)
    params, opt = task.adam(wl, args.seed, args.lr)
    executor = TorchExecutor()
    sched = make_scheduler(args.scheduler)
    n_train = len(wl.load("train"))
    n_train = n_train if args.train_limit is None else min(args.train_limit, n_train)
    rng = np.random.default_rng(args.seed)
    history: list[dict[str, float]] = []
    best: tuple[float, dict[str, Tensor]] | None = None
    start = time.perf_counter()
    batches = 0
    evaluate = {"batch_size": args.eval_batch_size, "scheduler": args.scheduler,
                "strategy": args.strategy, "limit": args.eval_limit}
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n_train)
        total, words = 0.0, 0
        for lo in range(0, n_train, args.batch_size):
            idx = np.sort(order[lo:lo + args.batch_size]).tolist()
            loss, used = task.graph_step(wl, executor, sched, args.strategy, params, opt, idx)
            total, batches = total + loss, batches + used
            words += sum(len(wl.load("train")[i]) for i in idx)
        dev = accuracy(wl, executor, params, "dev", **evaluate)
        history.append({"epoch": epoch, "train_loss_per_word": total / words,
                        "seconds": time.perf_counter() - start, "dev_accuracy": dev})
        log.info("epoch %d: train loss/word %.4f, dev UPOS accuracy %.4f (%.0fs)", epoch,
                 history[-1]["train_loss_per_word"], dev, history[-1]["seconds"])
        if best is None or dev > best[0]:
            best = (dev, task.snapshot(params))
        for group in opt.param_groups:
            group["lr"] *= args.lr_decay
    assert best is not None
    chosen = best[1]
    test = accuracy(wl, executor, chosen, "test", **evaluate)
    summary = {"workload": wl.name, "data": "UD English EWT v2.16 (UPOS)",
               "settings": vars(args), "embeddings": "random (no pretrained vectors)",
               "train_sentences": n_train, "wall_seconds": time.perf_counter() - start,
               "executor_batches": batches, "history": history,
               "best_epoch": task.best_epoch(history, "dev_accuracy"),
               "dev_accuracy": best[0], "test_accuracy": test}
    log.info("best epoch %d: dev UPOS accuracy %.4f; test UPOS accuracy %.4f",
             summary["best_epoch"], best[0], test)
    if args.out:
        task.write_json(args.out, summary, 1)
    return summary


def parser() -> argparse.ArgumentParser:
    """The command-line options."""
    p = argparse.ArgumentParser(prog="python -m experiments.train_tagger", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=tuple(PREFIX), default="bilstm_char_tagger")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--eval-batch-size", type=int, default=256)
    p.add_argument("--char-dim", type=int, default=32)
    p.add_argument("--word-dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=128)
    p.add_argument("--mlp-dim", type=int, default=64)
    p.add_argument("--min-count", type=int, default=6,
                   help="train occurrences for a word to be looked up (char tagger)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--lr-decay", type=float, default=0.6,
                   help="the learning rate is multiplied by this after every epoch")
    task.add_tail_args(p, "runs/tagger/train_tagger.json", "first N train sentences", "sentences")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point."""
    return task.log_main(parser(), argv, ("epochs", "batch_size", "eval_batch_size", "train_limit",
                                     "eval_limit", "word_dim", "hidden_dim"), train)


if __name__ == "__main__":
    main()
