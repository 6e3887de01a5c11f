"""``python -m experiments.train_sick``: a short run trains through the batched executor and
reports dev and test metrics; bad options are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.train_sick import main

__all__: list[str] = []


def test_short_run_writes_metrics(tmp_path: Path) -> None:
    out = tmp_path / "sick.json"
    summary = main(["--epochs", "2", "--train-limit", "60", "--batch-size", "20",
                    "--eval-limit", "40", "--eval-batch-size", "20", "--embed-dim", "8",
                    "--hidden-dim", "8", "--sim-dim", "4", "--lr", "0.01", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["test_pearson"] == pytest.approx(summary["test_pearson"])
    assert saved["train_pairs"] == 60 and len(saved["history"]) == 2
    assert saved["history"][1]["train_kl"] < saved["history"][0]["train_kl"]
    for key in ("dev_pearson", "dev_spearman", "test_pearson", "test_spearman"):
        assert -1.0 <= saved[key] <= 1.0
    assert saved["test_mse"] > 0 and saved["executor_batches"] > 0
    assert saved["best_epoch"] in (1, 2)


@pytest.mark.parametrize("option", ["--epochs", "--eval-limit"])
def test_bad_counts_are_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([option, "1" if option == "--eval-limit" else "0"])
    assert f"{option} must be >=" in capsys.readouterr().err
