"""Data-parallel ``experiments.train_model``: 2 gloo ranks under torchrun take the same steps as
one process over the same global mini-batches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from edbatch.executor.distributed import DataParallel, DistributedSetupError
from experiments.train_model import train_model

ROOT = Path(__file__).resolve().parents[2]
# 49 trees in global mini-batches of 16: 16, 16, 16, 1 -> rank 1's share of the last is empty
TINY = ["workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8", "epochs=1",
        "max_steps=4", "train_limit=49", "batch_size=16", "eval_limit=30",
        "eval_batch_size=10", "log_every=1", "eval_every=2", "time_budget_s=600"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": path,
           "MASTER_ADDR": "127.0.0.1"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
           "-m", "experiments.train_model", *TINY, *extra, f"run_dir={run_dir}",
           f"model_path={run_dir}/model.pt"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _compose(run_dir: Path) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train_model", [*TINY, f"run_dir={run_dir}",
                                       f"model_path={run_dir}/model.pt"])


def _rank(rank: int, cfg: DictConfig, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train_model(cfg)


def _check_same_training(one_dir: Path, two_dir: Path) -> None:
    one, two = (json.loads((d / "summary.json").read_text()) for d in (one_dir, two_dir))
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["steps"] == one["steps"] == 4
    # the global mini-batch's counts: trees seen and dev trees evaluated (sharded) agree
    assert two["train_trees"] == one["train_trees"] == 49
    assert two["eval_trees"] == one["eval_trees"] == 30
    assert two["epochs"] == pytest.approx(one["epochs"])
    a, b = torch.load(one_dir / "model.pt"), torch.load(two_dir / "model.pt")
    assert a.keys() == b.keys() and len(a) == 10
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=0, msg=name)
    train_loss = [[h["train/loss"] for h in run["history"] if "train/loss" in h]
                  for run in (one, two)]
    assert len(train_loss[0]) == 4 and train_loss[1] == pytest.approx(train_loss[0], abs=1e-5)
    assert two["eval/loss"] == pytest.approx(one["eval/loss"], abs=1e-5)
    assert two["eval/fine_accuracy"] == one["eval/fine_accuracy"]


def test_two_gloo_ranks_match_one_process_over_the_global_minibatches(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """Ranks forked after the reference run (imports and data already loaded: fast)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    train_model(_compose(tmp_path / "one"))
    mp.start_processes(_rank, args=(_compose(tmp_path / "two"), _free_port()), nprocs=2,
                       start_method="fork")
    _check_same_training(tmp_path / "one", tmp_path / "two")


def _rank_budget(rank: int, cfg: DictConfig, port: int, budgets: tuple[float, float]) -> None:
    cfg.time_budget_s = budgets[rank]
    _rank(rank, cfg, port)


@pytest.mark.parametrize("budgets, steps", [((600.0, 1e-6), 1), ((0.0, 0.0), 0)])
def test_ranks_stop_at_the_same_step_when_one_rank_is_out_of_time(
        tmp_path: Path, monkeypatch, budgets: tuple[float, float], steps: int) -> None:
    """Rank 1's budget is spent after its first step (or before any): the flag travels in
    that step's gradient header, so rank 0 stops at the same step (else it would wait for
    rank 1 in a collective for ever: joined with a timeout)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = mp.start_processes(_rank_budget, args=(_compose(tmp_path), _free_port(), budgets),
                             nprocs=2, start_method="fork", join=False)
    try:
        for _ in range(120):
            if ctx.join(timeout=1):
                break
        else:
            pytest.fail("the ranks did not stop together within 120 s")
    finally:
        for proc in ctx.processes:
            proc.kill()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == steps


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(tmp_path: Path, monkeypatch) -> None:
    """The documented command line: ``torchrun --nproc_per_node=2 -m experiments...``."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks = _torchrun(tmp_path / "two")  # runs while this process trains the reference
    try:
        train_model(_compose(tmp_path / "one"))
        out, _ = ranks.communicate(timeout=240)
    finally:
        ranks.kill()
    assert ranks.returncode == 0, out[-3000:]
    _check_same_training(tmp_path / "one", tmp_path / "two")


def _slurm_task(rank: int, port: int, out: Path) -> None:
    """A SLURM task as submitit starts it (the variables sbatch and submitit set)."""
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        os.environ.pop(key, None)
    os.environ.update(SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="7", SLURM_NTASKS="2",
                      SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_JOB_NUM_NODES="1",
                      SLURM_NODEID="0", SLURM_JOB_NODELIST="127.0.0.1", MASTER_PORT=str(port))
    dp = DataParallel.from_env("cpu")
    total = dp.sum([rank + 1])
    (out / f"rank{dp.rank}").write_text(f"{dp.world_size} {total[0]}")
    dp.close()


def test_a_slurm_job_of_two_tasks_forms_a_group_through_submitit(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    mp.start_processes(_slurm_task, args=(_free_port(), tmp_path), nprocs=2,
                       start_method="fork")
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["2 3.0", "2 3.0"]


def test_single_process_data_parallel_is_the_identity() -> None:
    dp = DataParallel()
    assert not dp.enabled and dp.is_main and dp.shard([1, 2, 3]) == [1, 2, 3]
    assert dp.sum([1, 2.5]) == [1.0, 2.5] and dp.any(True) and not dp.any(False)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    dp.sum_grads({"w": p})
    assert p.grad.tolist() == [2.0, 2.0, 2.0]


def test_shards_are_disjoint_and_cover_the_minibatch() -> None:
    items = list(range(7))
    shares = [DataParallel(rank=r, world_size=3).shard(items) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]


@pytest.mark.parametrize(("device", "backend", "says"), [
    ("cpu", "mpi", "dist_backend='mpi' is not supported"),
    ("cpu", "nccl", "needs device=cuda"),
])
def test_bad_backend_is_a_clear_error(monkeypatch, device: str, backend: str,
                                      says: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedSetupError, match=says):
        DataParallel.from_env(device, backend)
