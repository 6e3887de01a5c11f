"""Train a tree sentiment classifier with batched execution: ``python -m experiments.train_model``.

The model is a cell-granularity SST tree workload (Tree-LSTM by default) with a loss at every
tree node. Every mini-batch graph is scheduled by the configured batching (``auto`` by default:
the fastest candidate timed on the first mini-batches; a heuristic name or a trained FSM),
memory-planned, and run forward and backward by
:class:`~edbatch.executor.torch_executor.TorchExecutor`; Adam updates the parameters.

Dev accuracy is computed at the roots (``experiments/_train_model_data.py``: mini-batches,
scoring, evaluation); the loop, its budget and the curves are in
``experiments/_train_model_loop.py``.

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
import os
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from edbatch.errors import ConfigError, PolicyFileError
from edbatch.executor.distributed import DataParallel
from edbatch.tracking import NullTracker
from edbatch.workloads import WORKLOADS
from edbatch.workloads._trees import TreeWorkload
from experiments._cli import guarded
from experiments._common import make_tracker, one_workload, seed_everything
from experiments._rundir import bind_run_dir
from experiments._train_model_data import (
    Minibatch,
    RootScores,
    evaluate,
    prepare_minibatch,
    root_nodes,
)
from experiments._train_model_loop import Trainer, fit, plot_curves

__all__ = ["Minibatch", "RootScores", "evaluate", "prepare_minibatch", "root_nodes",
           "train_model"]

log = logging.getLogger(__name__)

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
    if cfg.fsm and not Path(cfg.fsm).is_file():  # before the data loads
        raise PolicyFileError(cfg.fsm, "no such policy file", "train one with `python -m "
                              "experiments.train` or fix the path")
    if state != "new":
        log.info("%s: %s", cfg.run_dir, "the same config was run here before: training again "
                 "from scratch, its outputs are overwritten" if state == "resume" else
                 "resume=restart: the previous run moved to replaced/")
    torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    if not dp.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    name, workload, _ = one_workload(cfg.workload, granularity="cell")
    if not isinstance(workload, TreeWorkload):  # (it failed deep in the first mini-batch)
        trees = [n for n, c in WORKLOADS.items() if issubclass(c, TreeWorkload)]
        raise ConfigError("workload", name, f"an SST tree workload, one of {trees}",
                          "pass e.g. workload=tree_lstm (the seeds' workloads train with "
                          "python -m experiments.train_<workload>)")
    sched_name = "fsm" if cfg.fsm and cfg.batching != "auto" else cfg.batching
    run_name = f"{name}__{sched_name}__{cfg.seed}__{int(time.time())}"
    tracker = make_tracker(cfg.logger, cfg, run_name) if dp.is_main else NullTracker()
    try:
        trainer = Trainer(cfg, workload, tracker, dp)
        start = time.perf_counter()
        evals = fit(trainer)
        final = evals[-1] if evals else trainer.eval()
        best = max((h["eval/binary_accuracy"] for h in trainer.history
                    if "eval/binary_accuracy" in h), default=final["eval/binary_accuracy"])
        summary: dict[str, Any] = {
            "workload": name, "scheduler": sched_name, "seed": cfg.seed,
            "ran": trainer.auto.leader().label,  # scheduler/strategy (auto: the one chosen)
            **({"auto": trainer.auto.summary()} if cfg.batching == "auto" else {}),
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
        plot_curves(trainer.history, cfg.plot, run_name)
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
