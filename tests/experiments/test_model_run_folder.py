"""``experiments.train_model``'s run folder is bound to its configuration: a rerun with any
other setting, or one that fails, changes nothing the first run wrote (issue 16 item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import experiments  # noqa: F401 - registers the schemas and the output_subdir resolver
from edbatch.errors import RunDirError
from edbatch.executor.distributed import DataParallel
from experiments._rundir import BINDING_FILE
from experiments.train_model import bind_model_run_dir, train_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ["workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8", "epochs=1",
        "max_steps=2", "train_limit=32", "batch_size=16", "eval_limit=20",
        "eval_batch_size=20", "log_every=1", "eval_every=null", "time_budget_s=600"]
#: (override, key the refusal names): workload sizes, optimisation, scheduling, budget
#: (the heuristic is `batching=NAME`; `scheduler` names a config group of evaluate/compare)
CHANGES = [("workload.tree_lstm.hidden_dim=16", "workload.tree_lstm.hidden_dim"),
           ("batch_size=8", "batch_size"), ("lr=0.01", "lr"), ("seed=1", "seed"),
           ("fsm=policy.json", "fsm"), ("strategy=naive", "strategy"),
           ("epochs=2", "epochs"), ("train_limit=16", "train_limit"),
           ("max_steps=1", "max_steps")]


def _cfg(run: Path, *extra: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train_model", [*TINY, *extra, f"run_dir={run}",
                                       f"model_path={run}/model.pt"])


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and "reruns" not in p.parts and p.suffix != ".log"}


def test_a_rerun_with_any_changed_setting_is_refused_and_changes_nothing(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = tmp_path / "run"
    train_model(_cfg(run))
    before = _snapshot(run)
    assert {"summary.json", "curves.png", "model.pt", BINDING_FILE} <= set(before)
    for change, key in CHANGES:
        with pytest.raises(RunDirError, match="another configuration") as err:
            train_model(_cfg(run, change))
        assert key in str(err.value) and "resume=restart" in str(err.value), change
        assert _snapshot(run) == before, change
    # paths and the logger are not bound: the same config trains again, overwriting
    again = train_model(_cfg(run, f"summary={run}/summary.json", "logger=none"))
    assert json.loads((run / "summary.json").read_text())["steps"] == again["steps"] == 2


def test_restart_moves_the_old_run_aside(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = tmp_path / "run"
    train_model(_cfg(run))
    old = (run / "summary.json").read_bytes()
    summary = train_model(_cfg(run, "max_steps=1", "resume=restart"))
    assert summary["steps"] == 1
    moved = next((run / "replaced").glob("*"))
    assert (moved / "summary.json").read_bytes() == old and (moved / "model.pt").exists()
    assert json.loads((run / BINDING_FILE).read_text())["max_steps"] == 1


def test_ranks_other_than_0_check_but_never_write(tmp_path: Path) -> None:
    run = tmp_path / "run"
    second = DataParallel(rank=1, world_size=2)
    assert bind_model_run_dir(_cfg(run), second) == "new"
    assert not run.exists()  # rank 0 writes the binding
    assert bind_model_run_dir(_cfg(run), DataParallel()) == "new"
    (run / "summary.json").write_text("{}")
    binding = (run / BINDING_FILE).read_bytes()
    with pytest.raises(RunDirError, match="batch_size"):
        bind_model_run_dir(_cfg(run, "batch_size=8"), second)
    assert bind_model_run_dir(_cfg(run, "batch_size=8", "resume=restart"), second) == \
        "restart"
    assert (run / BINDING_FILE).read_bytes() == binding and not (run / "replaced").exists()


def _run(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": path}
    for name in ("HYDRA_FULL_ERROR", "WORLD_SIZE"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "experiments.train_model", *TINY, *args],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)


@pytest.mark.slow
def test_cli_reruns_that_differ_or_fail_keep_the_first_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    where = [f"run_dir={run}", f"model_path={run}/model.pt"]
    first = _run(*where)
    assert first.returncode == 0, first.stderr
    before, log = _snapshot(run), (run / "train_model.log").read_text()
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", "summary.json", "model.pt"} <= set(
        before)
    for change, key in [("lr=0.01", "lr"), ("batch_size=0", "batch_size=0")]:  # differs, fails
        r = _run(*where, change)
        assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert _snapshot(run) == before, change
        assert (run / "train_model.log").read_text().startswith(log)
    same = _run(*where)  # the same config: trains again, overwriting its outputs
    assert same.returncode == 0, same.stderr
    after = _snapshot(run)
    assert after[".hydra/config.yaml"] == before[".hydra/config.yaml"]
    assert after[BINDING_FILE] == before[BINDING_FILE]
    assert len(list((run / ".hydra" / "reruns").glob("*/config.yaml"))) == 3
