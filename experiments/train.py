"""Train a batching policy and save its FSM artifact: ``python -m experiments.train``.

The run folder is deterministic (``runs/<workload>/<trainer>/seed<seed>``), so rerunning a
killed experiment with the same config resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import time

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from edbatch.tracking import git_sha
from experiments._common import graph_set, make_tracker, one_workload, seed_everything
from experiments.plots import plot_learning_curve
from policies import TrainResult

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> TrainResult:
    """Build graphs, train with the configured trainer, save and track the artifact."""
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    name, workload, _ = one_workload(cfg.workload)
    train_graphs = graph_set(workload, cfg.train_split, cfg.batch_size, cfg.num_train_graphs,
                             shuffle_seed=cfg.seed if cfg.shuffle else None)
    val_graphs = graph_set(workload, cfg.val_split, cfg.batch_size, cfg.num_val_graphs)
    trainer = instantiate(cfg.trainer)
    run_name = f"{name}__{trainer.name}__{cfg.seed}__{int(time.time())}"
    tracker = make_tracker(cfg.logger, cfg, run_name)
    try:
        log.info("training %s on %d %s graphs of %s (%s), validating on %d %s graphs",
                 trainer.name, len(train_graphs), cfg.train_split, name, workload.granularity,
                 len(val_graphs), cfg.val_split)
        result = trainer.fit(
            train_graphs, val_graphs, checkpoint=cfg.checkpoint, progress=cfg.progress,
            callback=lambda row: tracker.log(
                {k: v for k, v in row.items() if k != "episode"}, step=int(row["episode"])),
            metadata={"workload": name, "granularity": workload.granularity,
                      "seed": cfg.seed, "git_sha": git_sha(), "trainer": trainer.name})
        path = result.policy.save(cfg.artifact)
        tracker.log_artifact(path, f"fsm-{name}", "policy")
        tracker.log({"train/best_ratio_to_lb": result.best_ratio,
                     "train/num_states": result.policy.num_states,
                     "train/seconds": result.seconds})
        if result.history:
            plot_learning_curve(result.history, cfg.learning_curve, title=run_name)
        log.info("best validation batches/LB %.4f after %d episodes (%.1fs); %d states; "
                 "saved %s", result.best_ratio, result.episodes, result.seconds,
                 result.policy.num_states, path)
        return result
    finally:
        tracker.finish()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation ratio (for sweeps)."""
    return train(cfg).best_ratio


if __name__ == "__main__":
    main()
