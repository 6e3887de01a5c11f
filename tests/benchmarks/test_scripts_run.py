"""Every benchmark script runs as ``python benchmarks/NAME.py`` from the repository root.

The docs show them that way; run as a script, ``benchmarks`` is not importable unless the
script puts the repository root on ``sys.path`` itself (``runtime_phases.py`` did not).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("[a-z]*.py")
                 if '__name__ == "__main__"' in p.read_text())  # the libraries have no CLI


@pytest.mark.slow  # 9 fresh interpreters importing torch
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help_runs_from_the_repository_root(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
