"""benchmarks/dump_protocol.py end to end on a small export (slow: subprocess CLIs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dump_protocol.py"


@pytest.mark.slow
def test_lattice_protocol_trains_on_g0_and_reports_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", "lattice_lstm",
                           "--graphs", "3", "--batch-size", "8", "--seeds", "0", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          cwd=SCRIPT.parents[1], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["test_graphs"] == 2 and data["seeds"] == [0, 1]
    rows = {r["scheduler"]: r for r in data["rows"]}
    assert set(rows) == {"fsm", "dynet_agenda", "typewise_greedy", "typewise_greedy_backward",
                         "critical_path"}
    assert rows["fsm"]["seeds"] == 2 and rows["critical_path"]["seeds"] == 1
    # lattices: the FSM (a heuristic fallback chosen on G0, plus rollout) beats DyNet's agenda
    assert rows["fsm"]["mean_batches"] < rows["dynet_agenda"]["mean_batches"]
    assert all(r["ratio_to_lb"] >= 1.0 for r in rows.values())
