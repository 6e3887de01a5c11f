"""The DyNet memory probe (``benchmarks/_dynet_memory.py``) on real DyNet workers: the
backward pool it finds is the smallest that runs the mini-batch (one step less fails), the
figure adds it to the measured growth, and a bad argument fails before any worker starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edbatch.executor import init_params
from edbatch.workloads import make_workload

pytest.importorskip("dynet_config")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "dynet_peer.py"


def _cmd(tmp_path: Path, embed: int, hidden: int) -> list[str]:
    import numpy as np

    wl = make_workload("bilstm_tagger", granularity="cell", embed_dim=embed, hidden_dim=hidden)
    path = tmp_path / "params.npz"
    np.savez(path, **{k: t.detach().numpy() for k, t in init_params(wl).items()})
    return [sys.executable, str(SCRIPT), "--workload", "bilstm_tagger", "--embed", str(embed),
            "--hidden", str(hidden), "--autobatch", "1", "--batch-size", "32", "--minibatches",
            "1", "--params", str(path), "--mem", "2048", "--serve"]


def _server(cmd: list[str]):  # type: ignore[no-untyped-def]
    from benchmarks._dynet_server import DynetServer

    return DynetServer(cmd, {**os.environ, "PYTHONPATH": str(ROOT)}, ROOT)


def test_with_pools_replaces_the_memory_flags() -> None:
    from benchmarks._dynet_memory import with_pools

    cmd = ["python", "w.py", "--mem", "2048", "--serve", "--preload-split", "dev"]
    assert with_pools(cmd, 1, 24, "train") == [
        "python", "w.py", "--serve", "--mem", "1,24,256,256", "--preload-split", "train"]
    assert with_pools(cmd, 1, 8, None) == ["python", "w.py", "--serve", "--mem", "1,8,256,256"]


def test_training_probe_finds_the_smallest_backward_pool(tmp_path: Path) -> None:
    from benchmarks._dynet_memory import _trial, dynet_peak_mb, with_pools

    with _server(_cmd(tmp_path, 64, 64)) as server:
        mem = dynet_peak_mb(server, "train", 0, step=1)
        assert mem.backward_pool_mb >= 2 and mem.trials >= 3  # the search had to grow it
        assert mem.peak_mb == pytest.approx(mem.grown_mb + mem.backward_pool_mb - 1)
        assert mem.grown_mb > 0
        # one step less is not enough; the pool found is
        short = with_pools(server.cmd, 1, mem.backward_pool_mb - 1, None)
        assert _trial(server, short, "train", 0, None, None) is None
        enough = with_pools(server.cmd, 1, mem.backward_pool_mb, None)
        assert _trial(server, enough, "train", 0, None, None) is not None
        infer = dynet_peak_mb(server, "infer", 0, step=1)
        assert infer.backward_pool_mb == 0 and infer.trials == 1 and infer.peak_mb >= 0


def test_probe_rejects_a_bad_step_before_starting_workers(tmp_path: Path) -> None:
    from benchmarks._dynet_memory import dynet_peak_mb

    class NoServer:  # any use of it would fail: the check comes first
        cmd = env = cwd = None

    with pytest.raises(ValueError, match="step=0"):
        dynet_peak_mb(NoServer(), "train", step=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit=4"):
        dynet_peak_mb(NoServer(), "train", step=8, limit=4)  # type: ignore[arg-type]


def test_worker_reports_its_own_peak_not_its_parents(tmp_path: Path) -> None:
    """``ru_maxrss`` is inherited across fork + exec on Linux: a worker started by a large
    harness would report the harness's peak. The worker's ``maxrss_mb`` is its own."""
    import numpy as np

    from benchmarks._dynet_memory import with_pools

    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc")
    ballast = np.ones(96 * 2**20)  # 768 MB resident in this (the parent) process
    cmd = with_pools(_cmd(tmp_path, 8, 6), 1, 8, "train")
    with _server(cmd) as worker:
        phases, _ = worker.run("infer", 0, [0, 1], "train")
        assert 0 < phases["rss_before_mb"] <= phases["maxrss_mb"] + 1  # counters lag a little
        assert phases["maxrss_mb"] < 700 < ballast.nbytes / 2**20
