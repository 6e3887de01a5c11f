"""``benchmarks/schedule_scaling.py``: each scheduler in its own subprocess under a time
limit, on shapes the workloads do not have; rows name the batches or the failure."""

from __future__ import annotations

import pytest

from benchmarks import schedule_scaling
from edbatch.schedule import lower_bound


@pytest.mark.slow  # (fresh interpreters)
def test_rows_report_batches_and_a_timeout_is_a_row(tmp_path) -> None:
    out = tmp_path / "rows.json"
    rows = schedule_scaling.main(["--shapes", "chain", "types", "--schedulers", "exact",
                                  "critical_path", "--scale", "0.002", "--out", str(out)])
    assert [(r["shape"], r["scheduler"]) for r in rows] == [
        ("chain", "exact"), ("chain", "critical_path"), ("types", "exact"),
        ("types", "critical_path")]
    for row in rows:  # a chain needs one batch a node: every scheduler meets LB
        graph = schedule_scaling.build(row["shape"], 0.002)
        assert row["batches"] == graph.num_nodes == lower_bound(graph) == row["nodes"]
    assert out.read_text().count('"scheduler"') == 4
    slow = schedule_scaling._measure("wide", 0.05, "exact", timeout=0.5)
    assert slow["error"].startswith("TIMEOUT")


def test_shapes_are_built_at_scale() -> None:
    g = schedule_scaling.build("wide", 0.01)
    assert g.num_nodes == 210 and len(g.vocab) == 21
    star = schedule_scaling.build("star", 0.001)
    assert star.num_nodes == 201 and lower_bound(star) == 2


@pytest.mark.parametrize("argv", [["--scale", "0"], ["--scale", "2"],
                                  ["--schedulers", "fastest"], ["--shapes", "ring"]])
def test_bad_arguments_are_one_usage_line(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        schedule_scaling.main(argv)
    assert "usage:" in capsys.readouterr().err
