"""The main job's learners train on both cores with the same result as in one process."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from edbatch.workloads import make_workload
from experiments._common import graph_set
from experiments._parallel_fit import FitTask, run_fits

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def _tasks() -> list[FitTask]:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="compare", overrides=[
            "trainers.ed_batch.max_episodes=20", "trainers.fsm.max_episodes=20",
            "trainers.fsm.guard_check=0", "~trainers.expert", "~trainers.priority"])
    wl = make_workload("lattice_lstm")
    graphs = graph_set(wl, "train", 8, 2, shuffle_seed=3)
    val = graph_set(wl, "train", 8, 1)
    return [FitTask(OmegaConf.to_container(node, resolve=True), 3, graphs, val,
                    {"workload": "lattice_lstm", "seed": 3})
            for node in cfg.trainers.values()]


def test_two_processes_give_the_tables_of_one_and_replay_the_log(caplog) -> None:
    tasks = _tasks()
    one = run_fits(tasks, n_jobs=1)
    with caplog.at_level(logging.INFO):
        two = run_fits(tasks, n_jobs=2)
    for a, b in zip(one, two):
        assert a.policy.to_json()["table"] == b.policy.to_json()["table"]
        assert a.episodes == b.episodes
    # the workers' log lines come back under their own loggers (the guard's line, here)
    assert any(r.name == "policies.q_learning" and "guard" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
