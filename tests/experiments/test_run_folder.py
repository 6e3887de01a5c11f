"""A run folder is bound to its configuration; reruns never change what a run wrote; Ctrl-C
saves a checkpoint and exits in one line (issue 16 item 6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import experiments  # noqa: F401 - registers the schemas and the output_subdir resolver
from edbatch.errors import RunDirError
from experiments._cli import hydra_output_subdir
from experiments._rundir import BINDING_FILE, bind_run_dir, differences

ROOT = Path(__file__).resolve().parents[2]
TINY = ["trainer=q_learning", "workload=lattice_lstm", "num_train_graphs=1", "num_val_graphs=1",
        "batch_size=16", "trainer.max_episodes=20", "trainer.eval_every=10",
        "trainer.early_stop_ratio=0",        "progress=false"]


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def _outputs(run: Path) -> list[Path]:
    return [run / "policy.json", run / "checkpoint.json", run / "learning_curve.png"]


def test_binding_refuses_any_changed_setting_and_names_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert bind_run_dir(_cfg(TINY), run, _outputs(run)) == "new"
    (run / "policy.json").write_text("{}")  # a finished run's artifact
    assert bind_run_dir(_cfg(TINY), run, _outputs(run)) == "resume"
    for change, key in [("batch_size=8", "batch_size"),
                        ("workload.lattice_lstm.granularity=primitive",
                         "workload.lattice_lstm.granularity"),
                        ("trainer.alpha=0.5", "trainer.alpha"),
                        ("trainer=ed_batch", "trainer.encoding"),
                        ("policy.encoding=base", "policy.encoding"),
                        ("seed=3", "seed"),
                        ("workload=tree_lstm", "workload.tree_lstm")]:
        with pytest.raises(RunDirError, match="another configuration") as err:
            bind_run_dir(_cfg([*TINY, change]), run, _outputs(run))
        assert key in str(err.value) and "resume=restart" in str(err.value)
        assert (run / "policy.json").read_text() == "{}"
    # settings that do not change what is trained are not bound
    assert bind_run_dir(_cfg([*TINY, "progress=true", "logger=wandb"]), run,
                        _outputs(run)) == "resume"


def test_restart_moves_the_old_run_aside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    bind_run_dir(_cfg(TINY), run, _outputs(run))
    (run / "policy.json").write_text("old")
    assert bind_run_dir(_cfg([*TINY, "batch_size=8"]), run, _outputs(run),
                        resume="restart") == "restart"
    moved = list((run / "replaced").glob("*/policy.json"))
    assert len(moved) == 1 and moved[0].read_text() == "old"
    assert json.loads((run / BINDING_FILE).read_text())["batch_size"] == 8
    assert not (run / "policy.json").exists()


def test_folder_without_binding_but_with_outputs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text("{}")
    with pytest.raises(RunDirError, match="without run_config.json"):
        bind_run_dir(_cfg(TINY), tmp_path, _outputs(tmp_path))


@pytest.mark.parametrize(("binding", "found"), [
    ('{"batch_', "is not JSON"), ("[]", "holds a JSON list, not a config object"),
    ("7", "holds a JSON int"), (b"\xff\xfe", "is not JSON")])
def test_corrupt_binding_file_is_refused_naming_it(tmp_path: Path, binding: str | bytes,
                                                   found: str) -> None:
    """(A binding that parsed to a list was a raw AttributeError.)"""
    bind_run_dir(_cfg(TINY), tmp_path, _outputs(tmp_path))
    (tmp_path / "policy.json").write_text("{}")
    bound = tmp_path / BINDING_FILE
    bound.write_bytes(binding) if isinstance(binding, bytes) else bound.write_text(binding)
    with pytest.raises(RunDirError, match=found):
        bind_run_dir(_cfg(TINY), tmp_path, _outputs(tmp_path))
    assert (tmp_path / "policy.json").read_text() == "{}"


def test_differences_flatten_nested_keys() -> None:
    assert differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 0}) == [
        "a.c: 2 -> 3", "d: '(absent)' -> 0"]
    assert differences({"w": {"x": {"k": 1, "j": 2}}}, {"w": {"y": {"k": 1}}, "e": {}}) == [
        "e: '(absent)' -> {}", "w.x: <2 keys> -> '(absent)'", "w.y: '(absent)' -> <1 keys>"]


def test_hydra_output_subdir_keeps_the_first_runs_config(tmp_path: Path) -> None:
    assert hydra_output_subdir(tmp_path) == ".hydra"
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("x: 1\n")
    assert hydra_output_subdir(tmp_path).startswith(".hydra/reruns/")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=300)


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and "reruns" not in p.parts and p.name != "train.log"}


@pytest.mark.slow
def test_reruns_that_differ_or_fail_change_nothing_of_the_first_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _run(*TINY, f"run_dir={run}")
    assert first.returncode == 0, first.stderr
    before, log = _snapshot(run), (run / "train.log").read_text()
    assert {"policy.json", "checkpoint.json", ".hydra/overrides.yaml", BINDING_FILE} <= set(
        before)
    for change, key in [("batch_size=8", "batch_size"),
                        ("workload.lattice_lstm.granularity=primitive", "granularity"),
                        ("trainer.alpha=0.5", "trainer.alpha"),
                        ("batch_size=0", "batch_size=0")]:  # fails validation
        r = _run(*TINY, f"run_dir={run}", change)
        assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert _snapshot(run) == before, change
        assert (run / "train.log").read_text().startswith(log)
    restart = _run(*TINY, f"run_dir={run}", "batch_size=8", "resume=restart")
    assert restart.returncode == 0, restart.stderr
    old = next((run / "replaced").glob("*"))
    assert (old / "policy.json").read_bytes() == before["policy.json"]
    assert (run / ".hydra" / "config.yaml").read_bytes() == before[".hydra/config.yaml"]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    args = [a for a in TINY if not a.startswith("trainer.")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.train", *args, "trainer.max_episodes=1000000",
         "trainer.eval_every=1000000", "trainer.early_stop_ratio=0", f"run_dir={run}",
         "hydra.verbose=policies.q_learning"],  # logs a line per finished episode
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # a user's Ctrl-C, also when pytest itself runs in the background (SIGINT ignored
        # there, and an ignored SIGINT is inherited: Python would not install its handler)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600  # a bound for a hung run, not a wait
    log = run / "train.log"
    # after the first finished episode (whatever the machine's load), not after a fixed time
    while not log.exists() or "episode 1: " not in log.read_text():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before its first episode: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("no episode finished in 600 s")
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [x for x in err.strip().splitlines() if not x.startswith("[")]  # log records
    assert len(lines) == 1 and lines[0].startswith("interrupted: training stopped by Ctrl-C")
    ckpt = json.loads((run / "checkpoint.json").read_text())
    assert ckpt["episode"] > 0
    assert not (run / "policy.json").exists()  # nothing half-finished saved as the result


def test_ctrl_c_in_an_episodes_bookkeeping_keeps_that_episode(tmp_path: Path) -> None:
    """SIGINT while the trainer updates its table (here: in the per-episode callback) is
    held until the bookkeeping ends: the checkpoint has that episode, and the resumed run
    ends with the table of an uninterrupted one."""
    import numpy as np

    from edbatch.workloads.synthetic import random_lattices
    from policies.q_learning import QLearningConfig, train_q_table

    graphs = [random_lattices(np.random.default_rng(i), 4, 14, 4) for i in range(3)]
    cfg = QLearningConfig(max_episodes=30, eval_every=10, early_stop_ratio=0.0, seed=5)
    full = train_q_table(graphs, cfg)
    ckpt = tmp_path / "ckpt.json"

    def ctrl_c_at_15(row: dict) -> None:
        if row["episode"] == 15:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs in the background
    with pytest.raises(KeyboardInterrupt):
        train_q_table(graphs, cfg, checkpoint=ckpt, callback=ctrl_c_at_15)
    assert json.loads(ckpt.read_text())["episode"] == 15  # not the periodic one at 10
    assert signal.getsignal(signal.SIGINT) is before  # restored
    resumed = train_q_table(graphs, cfg, checkpoint=ckpt)
    assert [r["episode"] for r in resumed.history] == list(range(16, 31))
    assert resumed.policy.table == full.policy.table
