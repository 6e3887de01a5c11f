"""experiments.calibrate, and the cost model in experiments.evaluate / experiments.train,
run as subprocesses on tiny sizes (no assertion is about timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ("workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


def _calibrate(tmp_path: Path) -> Path:
    r = _run("experiments.calibrate", "workload=tree_lstm", "granularity=primitive", *TINY,
             "batch_sizes=[1,4]", "reps=1", "launch_reps=1", "sample_batch_size=2",
             f"run_dir={tmp_path / 'cal'}")
    assert r.returncode == 0, r.stderr
    return tmp_path / "cal" / "cost_model.json"


@pytest.mark.slow  # two subprocesses, one executing schedules: ~25 s idle, a minute loaded
def test_calibrate_writes_a_loadable_model_and_evaluate_reports_its_columns(
        tmp_path: Path) -> None:
    path = _calibrate(tmp_path)
    data = json.loads(path.read_text())
    assert data["format"] == "edbatch-cost-model" and data["granularity"] == "primitive"
    assert data["sizes"] == {"embed_dim": 8, "hidden_dim": 8} and data["device"] == "cpu"
    assert all(op["sizes"] == [1, 4] for op in data["ops"].values())
    out = tmp_path / "eval"
    r = _run("experiments.evaluate", "workload=[tree_lstm]", *TINY, "granularities=[primitive]",
             "scheduler=[depth,critical_path]", "limit=1", "batch_size=2", "progress=false",
             f"cost_model={path}", "measure_reps=1", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for rec in lines:
        assert rec["modelled_ms"] > 0 and rec["measured_ms"] > 0
    assert "modelled ms" in r.stdout and "measured ms" in r.stdout
    header = (out / "summary.csv").read_text().splitlines()[0]
    assert "mean_modelled_ms" in header and "mean_measured_ms" in header


def test_evaluate_calibrates_on_the_fly(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    r = _run("experiments.evaluate", "workload=[tree_lstm]", *TINY, "granularities=[cell]",
             "scheduler=[depth]", "limit=1", "batch_size=2", "progress=false",
             "cost_model=calibrate", f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert rec["modelled_ms"] > 0 and rec["measured_ms"] is None
    assert (out / "cost_model" / "tree_lstm_cell.json").is_file()


@pytest.mark.slow  # an end-to-end run of 20-40 s: the slow suite
def test_bad_inputs_fail_in_one_line(tmp_path: Path) -> None:
    r = _run("experiments.calibrate", "batch_sizes=[4,1]", f"run_dir={tmp_path}")
    assert r.returncode == 2 and "batch_sizes" in r.stderr and "increasing" in r.stderr
    r = _run("experiments.evaluate", "workload=[tree_lstm]", "granularities=[cell]",
             f"cost_model={tmp_path / 'nope.json'}", f"hydra.run.dir={tmp_path / 'e'}")
    assert r.returncode == 2 and "nope.json: no such cost-model file" in r.stderr
    assert "Traceback" not in r.stderr
    r = _run("experiments.train", "workload=tree_lstm", "trainer=q_learning", "env=cost_model",
             f"run_dir={tmp_path / 't'}")
    assert r.returncode == 2 and "trainer=maskable_ppo" in r.stderr
    r = _run("experiments.train", "workload=tree_lstm", "trainer=maskable_ppo",
             "env.reward=cost_model", f"run_dir={tmp_path / 't2'}")
    assert r.returncode == 2 and "env.cost_model" in r.stderr
