"""``benchmarks/train_scaling.py``: experiments.train with each trainer in its own process
under a time limit, on dumps of shapes the workloads do not have; every row says what the
run printed last, its failure or its timeout."""

from __future__ import annotations

import json

import pytest

from benchmarks import train_scaling


@pytest.mark.slow  # (fresh interpreters, ~10 s each)
def test_rows_report_the_last_line_an_error_and_a_timeout(tmp_path) -> None:
    out = tmp_path / "rows.json"
    rows = train_scaling.main(["--shapes", "types", "--trainers", "priority", "afterstate",
                               "--scale", "0.1", "--timeout", "300", "--out", str(out)])
    assert [(r["shape"], r["trainer"], r["nodes"], r["types"]) for r in rows] == [
        ("types", "priority", 501, 501), ("types", "afterstate", 501, 501)]
    ok, refused = rows
    assert ok["rc"] == 0 and ok["rss_mb"] > 100 and "learned nothing" in ok["line"]
    assert refused["rc"] == 2 and refused["line"].startswith("error: the afterstate policy")
    assert "trainer=priority" in refused["line"]  # (501 op types: over its 400)
    assert len(json.loads(out.read_text())) == 2
    for shape in ("types", "chain"):  # one trainer on two shapes: a run folder each
        train_scaling.write_shape(shape, 0.002, tmp_path / shape)
        again = train_scaling.measure(tmp_path / shape, "priority", 300, tmp_path)
        assert again["rc"] == 0 and "learned nothing" in again["line"], again
    train_scaling.write_shape("wide", 0.2, tmp_path / "wide")
    slow = train_scaling.measure(tmp_path / "wide", "ed_batch", 1.0, tmp_path)
    assert slow == {"trainer": "ed_batch", "error": "TIMEOUT after 1 s"}


def test_every_trainer_config_is_a_choice() -> None:
    assert {"q_learning", "ed_batch", "priority", "afterstate", "maskable_ppo"} <= set(
        train_scaling.TRAINERS)


@pytest.mark.parametrize("argv", [["--scale", "0"], ["--scale", "1.5"],
                                  ["--trainers", "sarsa"], ["--shapes", "ring"],
                                  ["--timeout", "0"]])
def test_bad_arguments_are_one_usage_line(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        train_scaling.main(argv)
    assert "usage:" in capsys.readouterr().err
