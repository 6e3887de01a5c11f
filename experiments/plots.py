"""Matplotlib figures of the experiments (PNG files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from edbatch.evaluation import SummaryRow

__all__ = ["learning_curve_figure", "plot_batches", "plot_learning_curve", "save_figure"]


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG (creating the folder), close it, return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def plot_batches(rows: Sequence[SummaryRow], path: str | Path,
                 schedulers: Sequence[str] | None = None) -> Path:
    """Grouped bars: mean batches / LB per scheduler, one group per workload."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    names = list(schedulers or dict.fromkeys(r.scheduler for r in rows))
    cell = {(r.workload, r.scheduler): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) * max(len(names), 1) / 4), 4))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [cell[(w, name)].ratio_to_lb if (w, name) in cell else 0.0 for w in workloads]
        ax.bar([k + i * width for k in range(len(workloads))], ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="LB")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(workloads))], workloads,
                  rotation=20, ha="right")
    ax.set_ylabel("mean batches / lower bound")
    ax.set_title("Batches per mini-batch graph, relative to the lower bound")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def learning_curve_figure(history: Sequence[dict[str, float]], title: str = "") -> Any:
    """The learning curve as a matplotlib figure: validation batches/LB of the greedy policy
    (and the best so far) against episodes, or against env timesteps when the rows carry
    ``timestep`` (the SB3 trainers); rows with ``eval/fallback_ratio_to_lb`` add the
    heuristic's level as a horizontal line, ``eval/fsm_ratio_to_lb`` the deployed FSM's
    validation ratio as a star."""
    x = "timestep" if any("timestep" in h for h in history) else "episode"
    pts = [(h[x], h["eval/ratio_to_lb"]) for h in history if "eval/ratio_to_lb" in h and x in h]
    best = [(h[x], h["eval/best_ratio_to_lb"]) for h in history
            if "eval/best_ratio_to_lb" in h and x in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if pts:
        ax.plot(*zip(*pts), marker="o", label="greedy policy")
    if best:
        ax.plot(*zip(*best), linestyle="--", label="best so far")
    fb = [h["eval/fallback_ratio_to_lb"] for h in history if "eval/fallback_ratio_to_lb" in h]
    if fb:  # the heuristic the learner starts from (its fallback alone)
        ax.axhline(fb[-1], color="tab:red", linewidth=1.2, linestyle="-.",
                   label="heuristic (fallback alone)")
    dep = [(h[x], h["eval/fsm_ratio_to_lb"]) for h in history
           if "eval/fsm_ratio_to_lb" in h and x in h]
    if dep:  # what is deployed: the (guarded) FSM, not the raw learner
        ax.plot(*zip(*dep[-1:]), marker="*", markersize=12, linestyle="none",
                color="tab:green", label="deployed FSM")
    ax.axhline(1.0, color="black", linewidth=1, linestyle=":", label="LB")
    ax.set_xlabel("env timestep" if x == "timestep" else "episode")
    ax.set_ylabel("batches / LB (validation)")
    ax.set_title(title or "Learning curve")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_learning_curve(history: Sequence[dict[str, float]], path: str | Path,
                        title: str = "") -> Path:
    """:func:`learning_curve_figure` saved as a PNG."""
    return save_figure(learning_curve_figure(history, title), path, dpi=120)
