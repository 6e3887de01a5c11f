"""Train the main job's learners on both cores: one task per (workload, seed, learner).

Each task re-seeds Python, NumPy and torch with its own seed before it builds its trainer,
so a learner's result does not depend on which learners ran before it, nor on ``n_jobs``
(``n_jobs=1`` runs the same tasks in this process, in the same order). The workers' log
lines are collected and replayed here, in task order, so the job's log file keeps them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edbatch.graph import Graph

__all__ = ["FitTask", "run_fits"]


@dataclass
class FitTask:
    """One learner to train: its resolved trainer config (a plain dict with ``_target_``),
    seed, training and validation graphs and the metadata its artifact records."""

    trainer: dict[str, Any]
    seed: int
    graphs: Sequence[Graph]
    val: Sequence[Graph]
    metadata: dict[str, Any]

    def cost(self) -> int:
        """A size estimate for longest-first dispatch: the training graphs' nodes."""
        return sum(g.num_nodes for g in self.graphs)


class _Collect(logging.Handler):
    """Keeps (logger name, level, message) of the records a worker's learner logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))


def _fit(task: FitTask) -> tuple[Any, list[tuple[str, int, str]]]:
    """Train one learner (in a worker or here); returns its result and its log lines."""
    from hydra.utils import instantiate

    from experiments._common import seed_everything

    root = logging.getLogger()
    handler = _Collect()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    try:
        seed_everything(task.seed)
        trainer = instantiate(task.trainer, seed=task.seed)
        result = trainer.fit(task.graphs, task.val, metadata=task.metadata)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    return result, handler.lines


def run_fits(tasks: Sequence[FitTask], n_jobs: int) -> list[Any]:
    """The training results of ``tasks``, in task order. With ``n_jobs`` other than 1 the
    tasks run in that many worker processes (joblib), the largest first; log lines of a
    worker are replayed under their own logger names once its task is back."""
    if n_jobs == 1 or len(tasks) < 2:
        out = []
        for t in tasks:  # here the lines were logged as they came: nothing to replay
            result, _ = _fit(t)
            out.append(result)
        return out
    from joblib import Parallel, delayed

    order = sorted(range(len(tasks)), key=lambda i: (-tasks[i].cost(), -i))
    done = Parallel(n_jobs=n_jobs)(delayed(_fit)(tasks[i]) for i in order)
    results: list[Any] = [None] * len(tasks)
    lines: list[list[tuple[str, int, str]]] = [[] for _ in tasks]
    for i, (result, logged) in zip(order, done):
        results[i], lines[i] = result, logged
    for logged in lines:  # replayed in task order: the log reads as a sequential run
        for name, level, msg in logged:
            logging.getLogger(name).log(level, msg)
    return results
