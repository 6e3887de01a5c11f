"""``benchmarks/gpu_fused_calls.py``: the per-call timing of a compiled cell body (the GPU
check's question, also runnable on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_fused_calls.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only build")
def test_cuda_on_a_cpu_build_is_one_usage_line() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "argument --device: device 'cuda'" in run.stderr and "use device='cpu'" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_times_every_variant_on_the_cpu(tmp_path: Path) -> None:
    """Each row count has the eager, compiled and no-guards timings (the first CPU compile
    takes about a minute, hence slow)."""
    out = tmp_path / "calls.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--calls", "3",
                          "--hidden", "8", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900,
                         env={**os.environ,
                              "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert run.returncode == 0, run.stderr[-2000:]
    info = json.loads(out.read_text())
    assert [r["rows"] for r in info["rows"]] == [8, 64, 512]
    for row in info["rows"]:
        assert set(row) == {"rows", "eager", "compiled", "no-guards"}
        assert all(v["host_us"] > 0 and "device_us" not in v
                   for k, v in row.items() if k != "rows")
