"""experiments.train and experiments.compare end to end (tiny budgets), trackers, launchers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edbatch.workloads import make_workload
from policies import FSMPolicy

ROOT = Path(__file__).resolve().parents[2]
TINY = ["trainer=q_learning", "workload=lattice_lstm", "num_train_graphs=1", "num_val_graphs=1",
        "batch_size=16", "trainer.max_episodes=20", "trainer.eval_every=10",
        "trainer.early_stop_ratio=0",        "progress=false"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=full_env, text=True,
                          capture_output=True, timeout=300)


def test_train_saves_artifact_checkpoint_curve_and_wandb_run_and_resumes(tmp_path: Path) -> None:
    """One end-to-end run (W&B offline) checks the artifact, checkpoint, curve and W&B files;
    a rerun resumes from the checkpoint."""
    run_dir = tmp_path / "run"
    r = _run("experiments.train", *TINY, f"run_dir={run_dir}", "logger=wandb",
             env={"WANDB_MODE": "offline"})
    assert r.returncode == 0, r.stderr
    policy = FSMPolicy.load(run_dir / "policy.json", make_workload("lattice_lstm").vocab)
    assert policy.metadata["workload"] == "lattice_lstm" and policy.metadata["seed"] == 0
    assert policy.metadata["episodes"] == 20 and len(policy.metadata["git_sha"]) >= 7
    ckpt = json.loads((run_dir / "checkpoint.json").read_text())
    assert ckpt["episode"] == 20
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))
    again = _run("experiments.train", *TINY, f"run_dir={run_dir}", "logger=wandb",
                 env={"WANDB_MODE": "offline"})  # rerun: resumes, done
    assert again.returncode == 0, again.stderr
    assert "resuming from checkpoint" in again.stderr + again.stdout


def test_bad_trainer_option_is_rejected(tmp_path: Path) -> None:
    r = _run("experiments.train", *TINY, f"run_dir={tmp_path}", "trainer.encodng=base")
    assert r.returncode != 0 and "encodng" in r.stderr


@pytest.mark.slow  # two training processes: the slow suite
def test_joblib_multirun_trains_one_policy_per_seed(tmp_path: Path) -> None:
    r = _run("experiments.train", "-m", *TINY, "seed=0,1", "hydra/launcher=joblib",
             "hydra.launcher.n_jobs=2", f"run_dir={tmp_path}/s${{seed}}",
             f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr
    seeds = {FSMPolicy.load(tmp_path / f"s{k}" / "policy.json").metadata["seed"] for k in (0, 1)}
    assert seeds == {0, 1}


@pytest.mark.slow  # an end-to-end run of 20-40 s: the slow suite
def test_submitit_local_launcher_runs_jobs(tmp_path: Path) -> None:
    r = _run("experiments.train", "-m", *TINY, "seed=3", "hydra/launcher=submitit_local",
             f"run_dir={tmp_path}/s${{seed}}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr
    assert FSMPolicy.load(tmp_path / "s3" / "policy.json").metadata["seed"] == 3


def test_compare_trains_both_learners_and_prints_table(tmp_path: Path) -> None:
    r = _run("experiments.compare", "eval_limit=1", "num_train_graphs=1", "batch_size=16",
             "trainers.ed_batch.max_episodes=20", "trainers.fsm.max_episodes=20",
             "trainers.expert.budget=5000",
             "trainers.expert.augment=0", "trainers.priority.iterations=2",
             "trainers.priority.population=4", "trainers.priority.elite=2",
             "scheduler=[depth,typewise_greedy]", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    names = {x["scheduler"] for x in lines}
    assert names == {"depth", "typewise_greedy", "fsm_ed_batch", "fsm_fsm", "fsm_expert",
                     "fsm_priority"}
    assert {x["workload"] for x in lines} == {"tree_lstm", "lattice_lstm"}
    out = [x for x in r.stdout.splitlines() if not x.startswith("[20")]  # not log records
    nothing = [x for x in out if " learned nothing" in x]  # one unwrapped line each
    worse = [x for x in out if " is WORSE than the best single heuristic " in x]
    out = [x for x in out if x not in nothing and x not in worse]
    assert max(len(x) for x in out) <= 100, max(out, key=len)  # fits a 100-column terminal
    assert not [x for x in out if "\u2026" in x]  # and no cell is cut short with an ellipsis
    # trees: critical path meets LB, so the guarded Q-learner keeps nothing and says why
    assert any(x.startswith("tree_lstm fsm seed 0 learned nothing: 0 states, critical_path "
                            "alone; ") for x in nothing), nothing
    text = " ".join(out)
    for said in ("evaluated on: tree_lstm", "batch size 16", "seeds [0]", "LB: lower bound",
                 "batches / LB", "hit rate:", "fsm_fsm",
                 "learners ['ed_batch', 'fsm', 'expert', 'priority']"):
        assert said in text, said
    assert all(x["num_batches"] >= x["lower_bound"] for x in lines)
    assert "FSM training (per seed)" in r.stdout
    assert "fallback alone" in r.stdout and "gain" in r.stdout and "best/LB" in r.stdout
    # every learner run is checked against the best single heuristic of its workload
    verdict = [x for x in out if x.startswith("never worse than the best single heuristic")]
    assert len(verdict) == 1 and verdict[0].endswith(f"{8 - len(worse)} of 8 learner runs")
    assert all(x.startswith(("tree_lstm ", "lattice_lstm ")) for x in worse)
    assert (tmp_path / "batches.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # an end-to-end run of 20-40 s: the slow suite
def test_sb3_trainers_with_the_default_policy_resolve_the_auto_fallback(tmp_path: Path) -> None:
    """`trainer=maskable_ppo` / `dqn` with `policy=fsm` (fallback auto, rollout lookahead):
    the distilled FSM gets the heuristic chosen on the validation graphs."""
    for trainer, steps in (("maskable_ppo", 300), ("dqn", 600)):
        run_dir = tmp_path / trainer
        r = _run("experiments.train", "workload=tree_lstm", f"trainer={trainer}",
                 f"trainer.total_timesteps={steps}", "num_train_graphs=1", "num_val_graphs=1",
                 "batch_size=8", "progress=false", f"run_dir={run_dir}")
        assert r.returncode == 0, r.stderr[-2000:]
        policy = FSMPolicy.load(run_dir / "policy.json")
        assert policy.fallback_name in ("critical_path", "typewise_greedy", "dynet_agenda",
                                        "ed_batch_agenda")
        assert policy.lookahead == "rollout" and policy.metadata["trainer"] == trainer


def test_train_reports_unseen_gain_and_why_nothing_was_learned(tmp_path: Path) -> None:
    r = _run("experiments.train", *TINY, f"run_dir={tmp_path / 'a'}", "num_eval_graphs=2")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "unseen test mini-batches" in x)
    assert line.startswith("q_learning on 2 unseen test mini-batches: ") and "x LB" in line
    for said in ("its fallback", "alone", "gain", "states, hit rate"):
        assert said in line, said
    policy = FSMPolicy.load(tmp_path / "a" / "policy.json")
    assert policy.metadata["guard"]["train_table"] <= policy.metadata["guard"]["train_fallback"]
    # a learner kept from keeping anything says so in one line, with the reason
    r = _run("experiments.train", *TINY, f"run_dir={tmp_path / 'b'}", "num_eval_graphs=1",
             "trainer.guard_max_evals=0")
    assert r.returncode == 0, r.stderr
    nothing = [x for x in r.stdout.splitlines() if "learned nothing" in x]
    assert len(nothing) == 1 and "0 states" in nothing[0], r.stdout
    assert "guard_max_evals=0" in nothing[0] or "never disagreed" in nothing[0]


def test_a_trainer_config_of_another_learner_is_shown_as_the_user_chose_it(tmp_path: Path
                                                                          ) -> None:
    """`trainer=ed_batch` runs the tabular Q-learner with ED-Batch's settings: its lines say
    `ed_batch (q_learning)`, not a learner the user did not name."""
    r = _run("experiments.train", "trainer=ed_batch", *TINY[1:], "trainer.max_episodes=5",
             "num_eval_graphs=1", f"run_dir={tmp_path / 'e'}")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "unseen test mini-batches" in x)
    assert line.startswith("ed_batch (q_learning) on 1 unseen test mini-batches: "), line
