"""Calibrate a cost model: ``python -m experiments.calibrate workload=... granularity=...``.

Times the executor's kernel of every op type of the workload at each batch size of
``batch_sizes`` on ``device`` (medians of ``reps`` runs, ``num_threads`` torch threads), fits
the per-op model of :mod:`edbatch.executor.cost_model` plus the executor's cost per batch
(from one executed graph of ``sample_split``) and writes it as JSON to ``output``. Prints the
modelled milliseconds per op type at a few batch sizes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from edbatch.errors import ConfigError
from edbatch.executor.cost_model import CostModel, calibrate, load_cost_model
from edbatch.graph import Graph
from experiments._cli import guarded
from experiments._common import graph_set, one_workload, seed_everything

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> CostModel:
    """Calibrate the configured workload and save the model to ``cfg.output``."""
    torch.set_num_threads(int(cfg.num_threads))
    seed_everything(cfg.seed)
    name, workload, _ = one_workload(cfg.workload, cfg.granularity)
    graphs = graph_set(workload, cfg.sample_split, cfg.sample_batch_size, 1)
    log.info("calibrating %s (%s) on %s: %d op types x %d batch sizes", name,
             workload.granularity, cfg.device, len(workload.vocab), len(cfg.batch_sizes))
    model = calibrate(workload, batch_sizes=list(cfg.batch_sizes), reps=cfg.reps,
                      device=cfg.device, dtype=cfg.dtype, backward=cfg.backward,
                      graphs=graphs, launch_reps=cfg.launch_reps, seed=cfg.seed,
                      stat=cfg.stat)
    path = model.save(cfg.output)
    _print(model)
    print(f"cost model: {path} ({model.meta['calibration_seconds']:.1f} s)")
    return model


def resolve_cost_model(spec: str | None, workload: Any, graphs: Sequence[Graph],
                       save_to: str | Path, *, device: str = "cpu") -> CostModel | None:
    """``spec`` of ``env.cost_model`` / ``evaluate cost_model``: ``None`` -> ``None``; a
    file path -> the loaded model (checked against the workload's op types and the device);
    ``"calibrate"`` -> a model calibrated now on ``graphs`` and saved to ``save_to``."""
    if spec is None or spec == "":
        return None
    if str(spec) != "calibrate":
        return load_cost_model(str(spec), workload.vocab, device=device)
    t0 = time.perf_counter()
    model = calibrate(workload, graphs=list(graphs)[:1], device=device)
    path = model.save(save_to)
    log.info("calibrated the cost model in %.1fs: %s", time.perf_counter() - t0, path)
    return model


def attach_cost_model(cfg: DictConfig, trainer: Any, workload: Any, graphs: Sequence[Graph]
                      ) -> None:
    """With ``env.reward=cost_model``, give ``trainer`` (its ``cost_model`` attribute, which
    its envs receive) the model of ``env.cost_model``; otherwise do nothing.

    Raises:
        ConfigError: the trainer does not train on the env's reward (the tabular and expert
            learners count batches); use ``trainer=maskable_ppo`` or ``trainer=dqn``.
    """
    env = cfg.get("env") or {}
    if env.get("reward") != "cost_model":
        return
    if not hasattr(trainer, "cost_model"):
        raise ConfigError("env.reward", "cost_model", "a trainer that learns from the env's "
                          "reward", "pass trainer=maskable_ppo or trainer=dqn (the tabular "
                          "and expert learners minimise batches)")
    trainer.cost_model = resolve_cost_model(env.get("cost_model"), workload, graphs,
                                            Path(cfg.run_dir) / "cost_model.json")


def _print(model: CostModel) -> None:
    from rich.console import Console
    from rich.table import Table

    sizes = [n for n in (1, 8, 64, 256) if n <= max(max(c.sizes) for c in model.ops.values())]
    table = Table(title=f"Modelled ms per launch ({model.meta['device']}, "
                        f"{model.meta['mode']}; launch_ms {model.launch_ms:.4f} included)")
    table.add_column("op type")
    for n in sizes:
        table.add_column(f"n={n}", justify="right")
    table.add_column("a + b n (ms)", justify="right")
    for name, cost in model.ops.items():
        table.add_row(name, *(f"{model(name, n):.4f}" for n in sizes),
                      f"{cost.intercept_ms:.4f} + {cost.slope_ms:.5f} n")
    Console(width=200).print(table)


@hydra.main(version_base="1.3", config_path="../conf", config_name="calibrate")
@guarded
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the modelled ms of one launch of every op type at n=1."""
    model = run(cfg)
    return sum(model(name, 1) for name in model.ops)


if __name__ == "__main__":
    main()
