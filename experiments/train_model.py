"""Train a tree sentiment classifier with batched execution: ``python -m experiments.train_model``.

The model is a cell-granularity SST tree workload (Tree-LSTM by default) with a loss at every
tree node. Every mini-batch graph is scheduled by the configured scheduler (a heuristic name or
a trained FSM artifact), memory-planned, and run forward and backward by
:class:`~edbatch.executor.torch_executor.TorchExecutor`; Adam updates the parameters.

Dev accuracy is computed at the roots: the mini-batch graph's outputs are extended with each
tree's root state (the operand of the instance's last loss node: the workloads emit nodes in
post-order, the root last), and ``logits = W_out h_root + b_out`` is computed from the
workload's parameters. Fine-grained accuracy is the 5-class argmax; binary accuracy drops
neutral roots (label 2) and predicts positive when ``p3 + p4 > p0 + p1``.

Mini-batches are made once from a seeded permutation (their graphs, schedules and memory
plans are cached); each epoch visits them in a new seeded order.

Under ``torchrun --nproc_per_node=N`` (docs/distributed.md) ``batch_size`` is the global
mini-batch: each rank records, schedules and runs its share (trees balanced by node count
across the ranks), the gradients are summed over the ranks before Adam steps
(:class:`~edbatch.executor.distributed.DataParallel`), and rank 0 alone logs and writes files.
Evaluation is sharded too (every N-th dev mini-batch) and its counts summed.

The run folder is bound to its config (``run_config.json``, as for ``experiments.train``;
docs/errors.md): a rerun with the same config trains again from scratch and overwrites the
summary, plot and model file (there is no checkpoint to resume); a rerun with any other
setting stops before writing anything and names the differing keys (``resume=restart`` moves
the old run to ``replaced/<time>/`` and starts over).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from omegaconf import DictConfig
from torch import Tensor

from edbatch.executor import init_params
from edbatch.executor.device import check_device
from edbatch.executor.distributed import DataParallel, instance_sizes
from edbatch.executor.params import is_embedding
from edbatch.executor.torch_executor import RunResult, TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import MemoryPlan, plan_memory
from edbatch.schedule import Schedule, Scheduler, make_scheduler
from edbatch.tracking import NullTracker, Tracker
from edbatch.workloads import Workload
from experiments._cli import guarded
from experiments._common import make_tracker, one_workload, seed_everything
from experiments._rundir import bind_run_dir

__all__ = ["Minibatch", "RootScores", "prepare_minibatch", "root_nodes", "train_model"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Minibatch:
    """A scheduled, planned mini-batch graph whose outputs are the loss sum, then the roots.

    Attributes:
        graph: the mini-batch graph; ``graph.outputs = [loss_node, *roots]``.
        schedule: its schedule.
        plan: its memory plan.
        loss_node: the ``loss_sum`` node (sum of every tree node's loss).
        roots: ``int32[T]`` root state node of each tree.
        labels: ``int64[T]`` root label of each tree.
        num_tree_nodes: labelled tree nodes (loss terms) in the mini-batch.
    """

    graph: Graph
    schedule: Schedule
    plan: MemoryPlan
    loss_node: int
    roots: NDArray[np.int32]
    labels: NDArray[np.int64]
    num_tree_nodes: int


@dataclass
class RootScores:
    """Running counts of root predictions and of the loss."""

    fine: int = 0
    binary: int = 0
    binary_total: int = 0
    trees: int = 0
    loss: float = 0.0
    tree_nodes: int = 0

    def add(self, logits: Tensor, labels: Tensor, loss: float, tree_nodes: int) -> None:
        """Count one mini-batch's root predictions (``logits [T, 5]``, ``labels [T]``)."""
        probs = logits.detach().cpu().softmax(dim=1)  # scored on the host, any device
        self.fine += int((probs.argmax(dim=1) == labels).sum())
        polar = labels != 2
        positive = probs[:, 3:].sum(dim=1) > probs[:, :2].sum(dim=1)
        self.binary += int((positive == (labels > 2))[polar].sum())
        self.binary_total += int(polar.sum())
        self.trees += len(labels)
        self.loss += loss
        self.tree_nodes += tree_nodes

    def reduced(self, dp: DataParallel) -> RootScores:
        """These counts summed over the data-parallel ranks (``self`` for one process)."""
        if not dp.enabled:
            return self
        fine, binary, total, trees, loss, nodes = dp.sum(
            [self.fine, self.binary, self.binary_total, self.trees, self.loss, self.tree_nodes])
        return RootScores(int(fine), int(binary), int(total), int(trees), loss, int(nodes))

    def metrics(self, stage: str) -> dict[str, float]:
        """``<stage>/fine_accuracy``, ``binary_accuracy``, ``loss`` (per tree node)."""
        return {f"{stage}/fine_accuracy": self.fine / max(self.trees, 1),
                f"{stage}/binary_accuracy": self.binary / max(self.binary_total, 1),
                f"{stage}/loss": self.loss / max(self.tree_nodes, 1),
                f"{stage}/num_trees": float(self.trees)}


def root_nodes(graph: Graph, loss_op: int) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """Each instance's root state node and root label.

    The root's loss is the last loss node of its instance (post-order emission); its single
    operand is the root state and its attr the root label.
    """
    losses = np.flatnonzero(graph.op_ids == loss_op)
    last = np.full(graph.num_instances, -1, dtype=np.int64)
    np.maximum.at(last, graph.instance[losses], losses)
    roots = graph.operand_ids[graph.operand_ptr[last]]
    return roots.astype(np.int32), graph.attrs[last].astype(np.int64)


def prepare_minibatch(workload: Workload, split: str, indices: Sequence[int],
                      scheduler: Scheduler, strategy: str) -> Minibatch:
    """Merge, schedule and plan one mini-batch; add the root states to the graph's outputs."""
    merged = workload.minibatch(split, indices)
    schedule = scheduler(merged)  # on the merged graph: the scheduler reuses its parts' caches
    loss_op = merged.vocab.id(f"{workload.name}.loss")
    roots, labels = root_nodes(merged, loss_op)
    loss_node = int(merged.outputs[0])
    graph = Graph.from_arrays(merged.vocab, merged.op_ids, merged.operand_ptr,
                              merged.operand_ids, attrs=merged.attrs, instance=merged.instance,
                              outputs=np.concatenate([[loss_node], roots]), depth=merged.depth,
                              validate=False)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    return Minibatch(graph, schedule, plan, loss_node, roots, labels,
                     int(merged.type_counts[loss_op]))


def root_logits(result: RunResult, batch: Minibatch, params: Mapping[str, Tensor],
                prefix: str) -> Tensor:
    """``W_out h_root + b_out`` for every tree of the mini-batch, ``[T, classes]``."""
    weight, bias = params[f"{prefix}.W_out"], params[f"{prefix}.W_out.b"]
    states = torch.cat([result.outputs[int(v)] for v in batch.roots])
    return F.linear(states[:, :weight.shape[1]], weight, bias)


class _Cache:
    """Mini-batches of one split, prepared on first use and kept."""

    def __init__(self, workload: Workload, split: str, chunks: list[list[int]],
                 scheduler: Scheduler, strategy: str) -> None:
        self.workload, self.split, self.chunks = workload, split, chunks
        self.scheduler, self.strategy = scheduler, strategy
        self._done: dict[int, Minibatch] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def get(self, k: int) -> Minibatch | None:
        """Mini-batch ``k`` (prepared now if it is the first use); ``None`` if chunk ``k``
        is empty (a rank's share of a global mini-batch smaller than the world)."""
        if not self.chunks[k]:
            return None
        if k not in self._done:
            self._done[k] = prepare_minibatch(self.workload, self.split, self.chunks[k],
                                              self.scheduler, self.strategy)
        return self._done[k]

    def __iter__(self) -> Iterator[Minibatch]:
        return (mb for mb in map(self.get, range(len(self))) if mb is not None)


def _chunks(num: int, limit: int | None, batch_size: int, seed: int | None) -> list[list[int]]:
    """Consecutive chunks of the first ``limit`` instances, seeded-shuffled if ``seed``."""
    order = np.arange(num if limit is None else min(limit, num))
    if seed is not None:
        np.random.default_rng(seed).shuffle(order)
    return [sorted(order[i:i + batch_size].tolist()) for i in range(0, len(order), batch_size)]


def make_model_scheduler(name: str, fsm: str | None) -> Scheduler:
    """A heuristic by registry name, or the FSM artifact at ``fsm`` when given."""
    if fsm:
        from policies import FSMScheduler

        return FSMScheduler(fsm)
    return make_scheduler(name)


def evaluate(executor: TorchExecutor, params: Mapping[str, Tensor], batches: _Cache,
             prefix: str, dp: DataParallel | None = None) -> dict[str, float]:
    """Root accuracies and the per-node loss over every mini-batch (no grad, in place);
    with ``dp``, over every rank's mini-batches."""
    scores = RootScores()
    with torch.no_grad():
        for mb in batches:
            res = executor.run(mb.graph, mb.schedule, mb.plan, params, grad=False)
            scores.add(root_logits(res, mb, params, prefix), torch.from_numpy(mb.labels),
                       float(res.outputs[mb.loss_node].sum()), mb.num_tree_nodes)
    return (scores if dp is None else scores.reduced(dp)).metrics("eval")


class _Trainer:
    """The training loop's state: parameters, optimizer, budget, counters and history."""

    def __init__(self, cfg: DictConfig, workload: Workload, tracker: Tracker,
                 dp: DataParallel | None = None) -> None:
        self.cfg, self.workload, self.tracker = cfg, workload, tracker
        self.dp = dp = dp or DataParallel()
        device = check_device(dp.device(cfg.device))
        self.params = init_params(workload, torch.Generator().manual_seed(cfg.seed),
                                  device=device)
        dp.broadcast(self.params.values())  # identical start on every rank
        self.opt = torch.optim.Adam(self.params.values(), lr=cfg.lr,
                                    weight_decay=cfg.weight_decay)
        # gloo: embedding tables travel as the rows read (sparse), NCCL: dense (keeps the
        # CUDA-graph capture of training runs, which sparse gradients turn off)
        sparse = dp.enabled and dp.backend == "gloo"
        self.sparse_rows = {n for n in self.params if is_embedding(n)} if sparse else set()
        self.executor = TorchExecutor(device, cuda_graphs=cfg.cuda_graphs,
                                      sparse_grads=sparse)
        scheduler = make_model_scheduler(cfg.batching, cfg.fsm)
        n_train = len(workload.load(cfg.train_split))
        chunks = _chunks(n_train, cfg.train_limit, cfg.batch_size, cfg.seed)
        self.train_trees = sum(len(c) for c in chunks)
        sizes = instance_sizes(workload.load(cfg.train_split))  # shares of equal node counts
        self.train = _Cache(workload, cfg.train_split, [dp.shard(c, sizes[c]) for c in chunks],
                            scheduler, cfg.strategy)
        self.dev = _Cache(workload, cfg.eval_split, dp.shard(_chunks(
            len(workload.load(cfg.eval_split)), cfg.eval_limit, cfg.eval_batch_size, None)),
            scheduler, cfg.strategy)
        self.history: list[dict[str, float]] = []
        self.step, self.trees, self.seconds, self.prepare_seconds = 0, 0, 0.0, 0.0
        self.batches, self.nodes = 0, 0
        self.deadline = math.inf if cfg.time_budget_s is None else float(cfg.time_budget_s)

    @property
    def out_of_time(self) -> bool:
        """Whether the training budget is spent (the time on some rank: all stop together)."""
        return self._max_steps_done or (
            math.isfinite(self.deadline) and self.dp.any(self.seconds >= self.deadline))

    @property
    def _max_steps_done(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def train_step(self, mb: Minibatch | None, scores: RootScores) -> bool:
        """One forward/backward/Adam step on a mini-batch (loss: mean over tree nodes; this
        rank's share of it when distributed, ``None`` for an empty share); ``False`` (and
        nothing done) if the time budget is spent (on some rank)."""
        local = (0, 0) if mb is None else (mb.num_tree_nodes, len(mb.roots))
        # the global mini-batch's counts, and whether to stop, in one collective that runs
        # during the forward pass (a late step's forward is thrown away)
        counts = self.dp.sum_async([*local, self.seconds >= self.deadline])
        self.opt.zero_grad(set_to_none=True)
        res = None if mb is None else \
            self.executor.run(mb.graph, mb.schedule, mb.plan, self.params, grad=True)
        tree_nodes, trees, late = counts.result()
        if late:
            return False
        if res is not None and mb is not None:
            loss = res.outputs[mb.loss_node].reshape(())
            with torch.no_grad():  # before the update: the predictions the loss was made for
                logits = root_logits(res, mb, self.params, self.workload.name)
            (loss / tree_nodes).backward()  # type: ignore[no-untyped-call]
            scores.add(logits, torch.from_numpy(mb.labels), loss.item(), mb.num_tree_nodes)
            self.batches += mb.schedule.num_batches
            self.nodes += mb.graph.num_nodes
        self.dp.sum_grads(self.params, self.sparse_rows)
        self.opt.step()
        self.step += 1
        self.trees += int(trees)
        return True

    def epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch (or until the budget is spent); return its train metrics."""
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.train))
        scores, window = RootScores(), RootScores()
        for k in order.tolist():
            if self._max_steps_done:
                break
            start = time.perf_counter()
            mb = self.train.get(k)
            prepared = time.perf_counter()
            if not self.train_step(mb, window):
                break
            self.prepare_seconds += prepared - start
            self.seconds += time.perf_counter() - start
            if self.step % self.cfg.log_every == 0:
                window = window.reduced(self.dp)
                self._log(window.metrics("train"))
                _merge(scores, window)
                window = RootScores()
            if self.cfg.eval_every and self.step % self.cfg.eval_every == 0:
                self.eval()
        _merge(scores, window.reduced(self.dp))
        return scores.metrics("train")

    def _log(self, metrics: dict[str, float]) -> None:
        row = {**metrics, **self.rates(), "train/epoch": self.epochs_done}
        self.history.append(row)
        self.tracker.log(row, step=self.step)

    @property
    def epochs_done(self) -> float:
        """Training trees seen, in epochs of the (limited) training set."""
        return self.trees / max(1, self.train_trees)

    def rates(self) -> dict[str, float]:
        """Throughput (global trees over this rank's seconds) and schedule size so far
        (this rank's mini-batches when distributed)."""
        steps = max(self.step, 1)
        return {"train/examples_per_s": self.trees / max(self.seconds, 1e-9),
                "train/seconds": self.seconds,
                "train/prepare_seconds": self.prepare_seconds,
                "train/batches_per_minibatch": self.batches / steps,
                "train/nodes_per_minibatch": self.nodes / steps}

    def eval(self) -> dict[str, float]:
        """Dev metrics now; logged and kept in the history."""
        start = time.perf_counter()
        row = evaluate(self.executor, self.params, self.dev, self.workload.name, self.dp)
        row["eval/seconds"] = time.perf_counter() - start
        row["train/epoch"] = self.epochs_done
        self.history.append(row)
        self.tracker.log(row, step=self.step)
        return row


def _merge(into: RootScores, part: RootScores) -> None:
    for name in ("fine", "binary", "binary_total", "trees", "tree_nodes"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    into.loss += part.loss


def _plot(history: Sequence[dict[str, float]], path: str | Path, title: str) -> Path:
    """Train loss and dev accuracies (fine, binary) against epochs, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> tuple[list[float], list[float]]:
        pts = [(h["train/epoch"], h[key]) for h in history if key in h]
        return [x for x, _ in pts], [y for _, y in pts]

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(*series("train/loss"), label="train (window)")
    left.plot(*series("eval/loss"), marker="o", label="dev")
    left.set(xlabel="epoch", ylabel="loss per tree node", title="loss")
    for key, label in (("eval/fine_accuracy", "dev fine (5 classes)"),
                       ("eval/binary_accuracy", "dev binary"),
                       ("train/binary_accuracy", "train binary (window)")):
        right.plot(*series(key), marker="o" if key.startswith("eval") else None, label=label)
    right.set(xlabel="epoch", ylabel="root accuracy", title="accuracy")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    from experiments.plots import save_figure

    return save_figure(fig, path)


def _fit(trainer: _Trainer) -> list[dict[str, float]]:
    """Epoch loop with evaluation after each epoch (and every ``eval_every`` steps)."""
    cfg, evals = trainer.cfg, []
    for epoch in range(1, cfg.epochs + 1):
        if trainer.out_of_time:
            break
        start = time.perf_counter()
        train = trainer.epoch(epoch)
        row = {**trainer.eval(), **train}
        evals.append(row)
        log.info("epoch %d (%.1f epochs of %d trees, %.0fs): train loss %.3f | dev fine %.4f "
                 "binary %.4f | %.1f trees/s, %.1f batches per mini-batch (%s)", epoch,
                 trainer.epochs_done, trainer.train_trees,
                 time.perf_counter() - start, train["train/loss"], row["eval/fine_accuracy"],
                 row["eval/binary_accuracy"], trainer.rates()["train/examples_per_s"],
                 trainer.rates()["train/batches_per_minibatch"], trainer.train.scheduler)
    return evals


def train_model(cfg: DictConfig) -> dict[str, Any]:
    """Train, evaluate on dev, write the JSON summary and the PNG; return the summary.

    Under ``torchrun`` every rank runs this; rank 0 alone logs, tracks and writes files.
    """
    dp = DataParallel.from_env(cfg.device, cfg.get("dist_backend"))
    try:
        return _train_model(cfg, dp)
    finally:
        dp.close()


#: Top-level keys a ``train_model`` run folder is not bound to: paths and the logger.
UNBOUND = ("run_dir", "summary", "plot", "model_path", "logger", "resume")


def bind_model_run_dir(cfg: DictConfig, dp: DataParallel) -> str:
    """Check ``run_dir`` against ``run_config.json`` (every rank, before anything is
    written; rank 0 alone writes the binding or moves an old run to ``replaced/``).

    A folder holding a run (summary, plot or model file) made with another config is
    refused (:class:`~edbatch.errors.RunDirError` naming the differing keys) unless
    ``resume=restart``; the same config trains again from scratch (there is no checkpoint)
    and overwrites the outputs.
    """
    outputs = [cfg.summary, cfg.plot, *([cfg.model_path] if cfg.get("model_path") else [])]
    return bind_run_dir(cfg, cfg.run_dir, outputs, cfg.get("resume", "auto"),
                        unbound=UNBOUND, write=dp.is_main)


def _train_model(cfg: DictConfig, dp: DataParallel) -> dict[str, Any]:
    state = bind_model_run_dir(cfg, dp)  # all ranks see the same files: all raise together
    if state != "new":
        log.info("%s: %s", cfg.run_dir, "the same config was run here before: training again "
                 "from scratch, its outputs are overwritten" if state == "resume" else
                 "resume=restart: the previous run moved to replaced/")
    torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    if not dp.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    name, workload, _ = one_workload(cfg.workload, granularity="cell")
    sched_name = "fsm" if cfg.fsm else cfg.batching
    run_name = f"{name}__{sched_name}__{cfg.seed}__{int(time.time())}"
    tracker = make_tracker(cfg.logger, cfg, run_name) if dp.is_main else NullTracker()
    try:
        trainer = _Trainer(cfg, workload, tracker, dp)
        start = time.perf_counter()
        evals = _fit(trainer)
        final = evals[-1] if evals else trainer.eval()
        best = max((h["eval/binary_accuracy"] for h in trainer.history
                    if "eval/binary_accuracy" in h), default=final["eval/binary_accuracy"])
        summary: dict[str, Any] = {
            "workload": name, "scheduler": sched_name, "seed": cfg.seed,
            "embed_dim": workload.embed_dim, "hidden_dim": workload.hidden_dim,  # type: ignore[attr-defined]
            "steps": trainer.step, "epochs": trainer.epochs_done,
            "train_trees": trainer.train_trees,
            "eval_trees": int(final["eval/num_trees"]),
            "wall_seconds": time.perf_counter() - start, **trainer.rates(),
            **{k: v for k, v in final.items() if k.startswith("eval/")},
            "eval/best_binary_accuracy": best, "num_threads": cfg.num_threads,
            "world_size": dp.world_size, "batch_size": cfg.batch_size,
            "device": cfg.device, "cpu_count": os.cpu_count(), "history": trainer.history}
        if not dp.is_main:
            return summary
        tracker.log({k: v for k, v in summary.items() if k.startswith("eval/")},
                    step=trainer.step)
        path = Path(cfg.summary)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
        _plot(trainer.history, cfg.plot, run_name)
        tracker.log_artifact(path, f"summary-{name}", "summary")
        if cfg.get("model_path"):
            model = Path(cfg.model_path)
            model.parent.mkdir(parents=True, exist_ok=True)
            torch.save({n: v.detach().cpu() for n, v in trainer.params.items()}, model)
        log.info("dev fine %.4f binary %.4f after %d steps (%.2f epochs, %.0fs, %d rank%s); "
                 "wrote %s", final["eval/fine_accuracy"], final["eval/binary_accuracy"],
                 trainer.step, trainer.epochs_done, summary["wall_seconds"], dp.world_size,
                 "s" if dp.enabled else "", path)
        return summary
    finally:
        tracker.finish()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_model")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final dev binary accuracy (for sweeps)."""
    return float(train_model(cfg)["eval/binary_accuracy"])


if __name__ == "__main__":
    main()
