"""Experiment tracking through one door: a ``Tracker`` protocol, a no-op and W&B.

Only this module imports wandb, and only when a :class:`WandbTracker` is created. W&B runs
offline by default (no account needed); ``mode="online"`` syncs when configured.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["NullTracker", "Tracker", "WandbTracker", "git_sha", "machine_info"]


class Tracker(Protocol):
    """Where metrics, configs and artifacts go."""

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record ``stage/metric`` values."""
        ...

    def log_artifact(self, path: str | Path, name: str, kind: str) -> None:
        """Attach a file (e.g. an FSM policy) to the run."""
        ...

    def finish(self) -> None:
        """Close the run (always called, in a ``finally``)."""
        ...


class NullTracker:
    """Tracks nothing (the default, and what tests use)."""

    def __init__(self, **_: Any) -> None:
        self.logged: list[tuple[dict[str, float], int | None]] = []

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Keep the metrics in memory (handy for tests); send them nowhere."""
        self.logged.append((dict(metrics), step))

    def log_artifact(self, path: str | Path, name: str, kind: str) -> None:
        """Do nothing."""

    def finish(self) -> None:
        """Do nothing."""


class WandbTracker:
    """Weights & Biases run; ``mode`` is ``offline`` (default), ``online`` or ``disabled``.

    Args:
        project: W&B project.
        run_config: the resolved config (plain dict) plus seed and git SHA.
        mode: offline keeps everything in ``dir`` (sync later with ``wandb sync``).
        dir: where W&B writes its files.
        name, group, tags, entity: as in ``wandb.init``.
    """

    def __init__(self, project: str = "edbatch", *, run_config: Mapping[str, Any] | None = None,
                 mode: str = "offline", dir: str | Path = "wandb",
                 name: str | None = None, group: str | None = None,
                 tags: list[str] | None = None, entity: str | None = None) -> None:
        try:
            import wandb
        except ImportError as e:  # pragma: no cover - wandb is a core dependency
            raise ImportError("W&B tracking needs wandb: pip install wandb") from e
        Path(dir).mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(project=project, entity=entity, config=dict(run_config or {}),
                              mode=os.environ.get("WANDB_MODE", mode),  # type: ignore[arg-type]
                              dir=str(dir), name=name,
                              group=group, tags=tags, reinit="finish_previous")

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log metrics at ``step``."""
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: str | Path, name: str, kind: str) -> None:
        """Log a file as a W&B artifact."""
        artifact = self._wandb.Artifact(name, type=kind)
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        """Finish the run."""
        self.run.finish()


def git_sha() -> str:
    """The repository's current commit (``"unknown"`` outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict[str, str]:
    """CPU model, cores, 1-minute load, Python, torch, its thread count and the GPU if any
    (for benchmarks)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    info = {"cpu": cpu, "cores": str(os.cpu_count()), "load_1m": f"{load[0]:.2f}",
            "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, threads=str(torch.get_num_threads()))
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    return info
