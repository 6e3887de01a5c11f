"""experiments.train_model end to end with a tiny budget (subprocess, CleanRL style)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edbatch.workloads.tree_lstm import TreeLSTM
from policies import FSMPolicy

ROOT = Path(__file__).resolve().parents[2]
TINY = ["workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8", "epochs=2",
        "max_steps=3", "train_limit=48", "batch_size=16", "eval_limit=40",
        "eval_batch_size=20", "log_every=1", "eval_every=2"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": path, **(env or {})}
    return subprocess.run([sys.executable, "-m", "experiments.train_model", *args], cwd=ROOT,
                          env=full_env, text=True, capture_output=True, timeout=300)


def test_train_model_writes_summary_with_accuracies_and_curves(tmp_path: Path) -> None:
    r = _run(*TINY, f"run_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("eval/fine_accuracy", "eval/binary_accuracy", "eval/best_binary_accuracy"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["steps"] == 3 and summary["eval_trees"] == 40
    assert summary["scheduler"] == "auto" and summary["train_trees"] == 48  # the default
    assert summary["auto"]["chosen"] is None and summary["ran"] in summary["auto"]["median_s"]
    assert summary["train/batches_per_minibatch"] > 0 and summary["train/examples_per_s"] > 0
    history = summary["history"]
    assert any("train/loss" in row for row in history)
    assert sum("eval/binary_accuracy" in row for row in history) >= 2  # step 2, epoch end
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_train_model_runs_an_fsm_artifact_with_wandb_offline(tmp_path: Path) -> None:
    names = TreeLSTM(embed_dim=8, hidden_dim=8).vocab.names
    artifact = FSMPolicy({}, "base", names, fallback="typewise_greedy").save(tmp_path / "p.json")
    r = _run(*TINY, f"run_dir={tmp_path}", "batching=fsm", f"fsm={artifact}", "logger=wandb",
             env={"WANDB_MODE": "offline"})
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["scheduler"] == "fsm" and 0.0 <= summary["eval/binary_accuracy"] <= 1.0
    assert list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_model_trains_on_cuda_with_graph_replayed_evaluation(tmp_path: Path) -> None:
    r = _run(*TINY, f"run_dir={tmp_path}", "device=cuda", "eval_every=1")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device"] == "cuda" and summary["steps"] == 3
    assert 0.0 <= summary["eval/binary_accuracy"] <= 1.0


def test_a_workload_that_is_no_sst_tree_workload_is_refused_by_name(tmp_path: Path) -> None:
    """It ran the data loading and failed in the first mini-batch with a raw RuntimeError
    ('mini-batch 10 has 3103 loss terms but its trees 64 nodes')."""
    r = _run("workload=lattice_lstm", "workload.lattice_lstm.hidden_dim=8", "max_steps=1",
             f"run_dir={tmp_path}")
    assert r.returncode == 2, r.stderr
    assert "config key workload='lattice_lstm': expected an SST tree workload, one of " \
           "['tree_lstm', 'tree_gru', 'mvrnn']" in r.stderr
    assert "Traceback" not in r.stderr
