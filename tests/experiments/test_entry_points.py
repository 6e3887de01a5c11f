"""Subprocess smoke runs of the entry points with tiny budgets (CleanRL style)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


def test_evaluate_writes_one_record_per_workload_scheduler_graph(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _run("experiments.evaluate", "workload=[dumps]", "scheduler=[depth,dynet_agenda]",
             "limit=null",
             f"hydra.run.dir={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 9  # 2 schedulers x G1..G9
    assert set(lines[0]) == {"workload", "scheduler", "graph_id", "num_nodes", "num_batches",
                             "lower_bound", "sched_seconds", "modelled_ms", "measured_ms"}
    assert lines[0]["modelled_ms"] is None and lines[0]["measured_ms"] is None  # not asked
    by = {(x["scheduler"], x["graph_id"]): x for x in lines}
    assert sum(by[("depth", f"test/{k}")]["num_batches"] for k in range(9)) == 180  # 20.0 each
    assert "Mean batches per mini-batch graph" in r.stdout
    assert (out / "summary.csv").read_text().startswith("workload,scheduler,num_graphs")


def test_evaluate_rejects_bad_key_with_hint(tmp_path: Path) -> None:
    r = _run("experiments.evaluate", "bacth_size=3", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert r.returncode != 0
    assert "bacth_size" in r.stderr
