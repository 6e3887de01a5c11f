"""The training loop of ``experiments.train_model``: parameters, optimizer, budget, the
epoch loop with its evaluations, and the curves' PNG.

Mini-batches are made once from a seeded permutation (their graphs, schedules and memory
plans are cached); each epoch visits them in a new seeded order.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from edbatch.executor import init_params
from edbatch.executor.auto import AUTO_SCHEDULERS, AUTO_STRATEGIES, AutoBatching
from edbatch.executor.device import check_device
from edbatch.executor.distributed import DataParallel, PendingGrads, instance_sizes
from edbatch.executor.params import embedding_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.tracking import Tracker
from edbatch.workloads import Workload
from experiments._train_model_data import (
    Minibatch,
    MinibatchCache,
    RootScores,
    evaluate,
    make_chunks,
    merge_scores,
    model_candidates,
    root_logits,
)

__all__ = ["Trainer", "fit", "freeze_heap", "make_auto", "plot_curves"]

log = logging.getLogger("experiments.train_model")


def make_auto(cfg: DictConfig, dp: DataParallel) -> AutoBatching:
    """The chooser of ``cfg.batching``: one candidate, or ``auto``'s (all ranks choose
    alike: on the medians summed over the ranks)."""
    auto = cfg.get("auto") or {}
    candidates = model_candidates(cfg.batching, cfg.fsm, cfg.strategy, {
        "schedulers": auto.get("schedulers", AUTO_SCHEDULERS),
        "strategies": auto.get("strategies", AUTO_STRATEGIES)}, cfg.get("fsm_lookahead", "none"))
    return AutoBatching(candidates, int(auto.get("trials", 3)),
                        agree=dp.sum if dp.enabled else None)


#: ``adam=`` -> torch's Adam implementation (the same update).
ADAM: dict[str, dict[str, bool]] = {"fused": {"fused": True}, "foreach": {"foreach": True},
                                    "for_loop": {"foreach": False}}


def freeze_heap() -> None:
    """Collect, then move every object the cyclic garbage collector tracks into its
    permanent generation (:func:`gc.freeze`): the loaded data set and the cached mini-batches
    live for the whole run, and every full collection would otherwise walk all of them (the
    SST trees and their cached graphs and plans are about a million objects). Objects frozen
    are still freed by reference counting; only cycles among them are never collected."""
    gc.collect()
    gc.freeze()


class Trainer:
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
                                    weight_decay=cfg.weight_decay, **ADAM[cfg.adam])
        # gloo: embedding tables travel as the rows read (sparse), NCCL: dense (keeps the
        # CUDA-graph capture of training runs, which sparse gradients turn off)
        sparse = dp.enabled and dp.backend == "gloo"
        self.sparse_rows = embedding_params(workload) if sparse else set()
        self.executor = TorchExecutor(device, cuda_graphs=cfg.cuda_graphs,
                                      sparse_grads=sparse)
        self.auto = make_auto(cfg, dp)
        n_train = len(workload.load(cfg.train_split))
        chunks = make_chunks(n_train, cfg.train_limit, cfg.batch_size, cfg.seed)
        self.train_trees = sum(len(c) for c in chunks)
        sizes = instance_sizes(workload.load(cfg.train_split))  # shares of equal node counts
        shares = [dp.shard(c, sizes[c]) for c in chunks]
        self.train = MinibatchCache(workload, cfg.train_split, shares, self.auto)
        # each global mini-batch's (tree nodes, trees): every rank knows the whole of it, so
        # the loss's global denominator needs no collective (a tree's size is its labelled
        # nodes, one loss term each; checked against this rank's share as it is built)
        self.totals = [(int(sizes[c].sum()), len(c)) for c in chunks]
        self._share_nodes = [int(sizes[c].sum()) for c in shares]
        self.dev = MinibatchCache(workload, cfg.eval_split, dp.shard(make_chunks(
            len(workload.load(cfg.eval_split)), cfg.eval_limit, cfg.eval_batch_size, None)),
            self.auto)
        self._pending: PendingGrads | None = None  # the last step, until finish_step
        self.history: list[dict[str, float]] = []
        self.step, self.trees, self.seconds, self.prepare_seconds = 0, 0, 0.0, 0.0
        self.batches, self.nodes = 0, 0
        self.deadline = math.inf if cfg.time_budget_s is None else float(cfg.time_budget_s)
        # whether some rank's budget was spent at the last step's end (it travels with
        # that step's gradient header, so all ranks stop at the same step)
        self._late = self.deadline <= 0
        self._step_start = time.perf_counter()
        if cfg.gc_freeze:
            freeze_heap()

    @property
    def out_of_time(self) -> bool:
        """Whether the training budget is spent (the time on some rank: all stop together)."""
        return self._max_steps_done or (
            math.isfinite(self.deadline) and self.dp.any(self.seconds >= self.deadline))

    @property
    def _max_steps_done(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def train_step(self, mb: Minibatch | None, scores: RootScores,
                   totals: tuple[int, int]) -> bool:
        """One forward/backward/Adam step on a mini-batch (loss: mean over tree nodes; this
        rank's share of it when distributed, ``None`` for an empty share); ``totals`` is the
        global mini-batch's (tree nodes, trees). ``False`` (and nothing done) if the time
        budget is spent (on some rank, at the last step's end)."""
        self._finish()  # the last step's gradient sum and Adam update (timed as this step)
        if self._late if self.dp.enabled else self.seconds >= self.deadline:
            return False
        tree_nodes, trees = totals
        self.opt.zero_grad(set_to_none=True)
        res = None if mb is None else \
            self.executor.run(mb.graph, mb.schedule, mb.plan, self.params, grad=True)
        if res is not None and mb is not None:
            loss = res.outputs[mb.loss_node].reshape(())
            with torch.no_grad():  # before the update: the predictions the loss was made for
                logits = root_logits(res, mb, self.params, self.workload.name)
            (loss / tree_nodes).backward()  # type: ignore[no-untyped-call]
            scores.add(logits, torch.from_numpy(mb.labels), loss.item(), mb.num_tree_nodes)
            self.batches += mb.schedule.num_batches
            self.nodes += mb.graph.num_nodes
        # the gradient sum starts now and ends (with Adam) when the next step begins, so
        # that preparing the next mini-batch overlaps it and the wait for the slowest rank
        spent = self.seconds + time.perf_counter() - self._step_start >= self.deadline
        self._pending = self.dp.sum_grads_async(self.params, self.sparse_rows, [spent])
        self.step += 1
        self.trees += int(trees)
        return True

    def finish_step(self) -> None:
        """Complete the last step: its gradient sum over the ranks, then Adam (a no-op
        when none is pending), counted as training time. The next ``train_step`` does it
        itself; an evaluation and the end of an epoch call this."""
        start = time.perf_counter()
        self._finish()
        self.seconds += time.perf_counter() - start

    def _finish(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.finish()
            self._late = pending.flags()[0] > 0
            self.opt.step()

    def epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch (or until the budget is spent); return its train metrics."""
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.train))
        scores, window = RootScores(), RootScores()
        for k in order.tolist():
            if self._max_steps_done:
                break
            start = self._step_start = time.perf_counter()
            self.train.built(k)  # construction: the same whatever the candidate, not timed
            if self._pending is not None:  # the last step's header is in: send its grads
                self._pending.advance()
            candidate, timer = self.auto.current(), self.auto.clock()
            mb = self.train.get(k, candidate)
            if mb is not None and mb.num_tree_nodes != self._share_nodes[k]:
                raise RuntimeError(f"train_model: mini-batch {k} has {mb.num_tree_nodes} loss "
                                   f"terms but its trees {self._share_nodes[k]} nodes; the "
                                   f"workload must give every tree node one loss")
            prepared = time.perf_counter()
            if not self.train_step(mb, window, self.totals[k]):
                break
            self.auto.record(candidate, self.auto.clock() - timer)  # scheduling to the step
            self.prepare_seconds += prepared - start
            self.seconds += time.perf_counter() - start
            if self.step % self.cfg.log_every == 0:
                window = window.reduced(self.dp)
                self._log(window.metrics("train"))
                merge_scores(scores, window)
                window = RootScores()
            if self.cfg.eval_every and self.step % self.cfg.eval_every == 0:
                self.eval()
        self.finish_step()
        if self.cfg.gc_freeze:  # this epoch's cached mini-batches (not timed as training)
            freeze_heap()
        merge_scores(scores, window.reduced(self.dp))
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
        self.finish_step()
        start = time.perf_counter()
        row = evaluate(self.executor, self.params, self.dev, self.workload.name, self.dp)
        row["eval/seconds"] = time.perf_counter() - start
        row["train/epoch"] = self.epochs_done
        self.history.append(row)
        self.tracker.log(row, step=self.step)
        return row


def plot_curves(history: Sequence[dict[str, float]], path: str | Path, title: str) -> Path:
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


def fit(trainer: Trainer) -> list[dict[str, float]]:
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
                 trainer.rates()["train/batches_per_minibatch"], trainer.auto.leader().label)
    return evals

