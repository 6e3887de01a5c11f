"""The workload registry imports without torch: the DyNet worker of the benchmarks imports it
(through ``benchmarks.peers``), and its measured peak memory must be DyNet's, not torch's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_every_workload_and_the_peer_finder_loads_no_torch() -> None:
    code = ("import sys, edbatch.workloads, benchmarks.peers; "
            "print(sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
