"""Train a batching policy and save its FSM artifact: ``python -m experiments.train``.

The run folder is deterministic (``runs/<workload>/<trainer>/seed<seed>``) and bound to the
config that made it (``run_config.json``): rerunning a killed experiment with the same config
resumes from its last checkpoint; a rerun with any other setting stops before changing
anything and names the differing keys (``resume=restart`` starts the folder over, keeping the
old run under ``replaced/``). Ctrl-C saves a checkpoint (tabular trainer) and exits in one line.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from edbatch.tracking import git_sha
from experiments._cli import guarded
from experiments._common import graph_set, make_tracker, one_workload, seed_everything
from experiments._learned import learned_nothing, score_unseen, unseen_line
from experiments._rundir import bind_run_dir
from experiments.calibrate import attach_cost_model
from experiments.plots import plot_learning_curve
from policies import TrainResult

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> TrainResult:
    """Build graphs, train with the configured trainer, save and track the artifact."""
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    state = bind_run_dir(cfg, cfg.run_dir, [cfg.artifact, cfg.checkpoint, cfg.learning_curve],
                         cfg.resume)
    if state == "restart":
        log.info("resume=restart: the previous run of %s moved to %s/replaced/", cfg.run_dir,
                 cfg.run_dir)
    name, workload, _ = one_workload(cfg.workload)
    train_graphs = graph_set(workload, cfg.train_split, cfg.batch_size, cfg.num_train_graphs,
                             shuffle_seed=cfg.seed if cfg.shuffle else None)
    val_split = cfg.val_split or workload.default_val_split
    val_graphs = graph_set(workload, val_split, cfg.batch_size, cfg.num_val_graphs)
    if cfg.eval_split not in (None, "test", *workload.splits):  # (a typo: not after training)
        workload.load(cfg.eval_split)  # raises UnknownNameError naming the splits
    trainer = instantiate(cfg.trainer)
    attach_cost_model(cfg, trainer, workload, train_graphs)  # env.reward=cost_model only
    run_name = f"{name}__{trainer.name}__{cfg.seed}__{int(time.time())}"
    tracker = make_tracker(cfg.logger, cfg, run_name)
    try:
        log.info("training %s on %d %s graphs of %s (%s), validating on %d %s graphs",
                 _shown(trainer.name), len(train_graphs), cfg.train_split, name,
                 workload.granularity, len(val_graphs), val_split)
        try:
            result = trainer.fit(
                train_graphs, val_graphs, checkpoint=cfg.checkpoint, progress=cfg.progress,
                callback=lambda row: tracker.log(  # step: SB3 timesteps, or episodes
                    {k: v for k, v in row.items() if k not in ("episode", "timestep")},
                    step=int(row.get("timestep", row["episode"]))),
                metadata={"workload": name, "granularity": workload.granularity,
                          "seed": cfg.seed, "git_sha": git_sha(), "trainer": trainer.name})
        except KeyboardInterrupt:
            saved = Path(cfg.checkpoint)
            raise KeyboardInterrupt(
                f"training stopped by Ctrl-C; checkpoint {saved} saved, rerun the same "
                f"command to resume" if saved.is_file() and trainer.name == "q_learning"
                else f"training stopped by Ctrl-C; {trainer.name} keeps no checkpoint, "
                     f"rerun to start again") from None
        path = result.policy.save(cfg.artifact)
        tracker.log_artifact(path, f"fsm-{name}", "policy")
        tracker.log({"train/best_ratio_to_lb": result.best_ratio,
                     "train/num_states": result.policy.num_states,
                     "train/seconds": result.seconds})
        if result.history:
            plot_learning_curve(result.history, cfg.learning_curve, title=run_name)
        log.info("best validation batches/LB %.4f after %s (%.1fs); %d states; saved %s",
                 result.best_ratio, _amount(result), result.seconds,
                 result.policy.num_states, path)
        _report_unseen(cfg, workload, _shown(trainer.name), result, tracker, val_split)
        return result
    finally:
        tracker.finish()


def _shown(name: str) -> str:
    """The learner as the user chose it: ``trainer=ed_batch`` runs the tabular Q-learner
    with ED-Batch's settings, so it shows as ``ed_batch (q_learning)``."""
    try:
        choice = HydraConfig.get().runtime.choices.get("trainer")
    except ValueError:  # (not run through Hydra)
        return name
    return name if choice in (None, name) else f"{choice} ({name})"


def _report_unseen(cfg: DictConfig, workload: Any, name: str, result: TrainResult,
                   tracker: Any, val_split: str) -> None:
    """Print what the learner learned over its fallback on unseen mini-batches
    (``eval_split``, ``num_eval_graphs``; 0 graphs: skipped), or why it learned nothing."""
    if not cfg.num_eval_graphs and cfg.num_eval_graphs is not None:
        return
    split = cfg.eval_split if cfg.eval_split in workload.splits else \
        workload.default_eval_split
    graphs = graph_set(workload, split, cfg.batch_size, cfg.num_eval_graphs)
    if split == val_split:  # validation graphs are not unseen: skip them
        graphs = graphs[cfg.num_val_graphs or len(graphs):]
    if not graphs:
        print(f"{name}: no unseen mini-batches to report on (split {split})")
        return
    u = score_unseen(result.policy, graphs)
    print(unseen_line(name, u, split))
    nothing = learned_nothing(name, result.policy, u)
    if nothing:
        print(nothing)
    tracker.log({"unseen/ratio_to_lb": u.ratio, "unseen/fallback_ratio_to_lb": u.fallback_ratio,
                 "unseen/gain": u.gain, "unseen/hit_rate": u.hit_rate})


def _amount(result: TrainResult) -> str:
    """What the trainer counted: episodes (tabular) and/or env timesteps (SB3)."""
    steps = getattr(result, "timesteps", None)
    eps = f"{result.episodes} episodes"
    return eps if not steps else f"{steps} timesteps ({eps})"


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation ratio (for sweeps)."""
    return train(cfg).best_ratio


if __name__ == "__main__":
    main()
