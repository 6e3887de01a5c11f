"""``python -m experiments.train_parser``: a short run trains through edbatch, parses dev and
test with the parser's own predictions and reports UAS / LAS; bad options are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.train_parser import main

__all__: list[str] = []


def test_short_run_writes_attachment_scores(tmp_path: Path) -> None:
    out, saved_params = tmp_path / "parser.json", tmp_path / "params.pt"
    summary = main(["--epochs", "2", "--train-limit", "24", "--batch-size", "8",
                    "--eval-limit", "12", "--eval-batch-size", "6", "--embed-dim", "6",
                    "--pos-dim", "3", "--hidden-dim", "5", "--mlp-dim", "7",
                    "--min-count", "50", "--out", str(out), "--save-params", str(saved_params)])
    saved = json.loads(out.read_text())
    assert saved["test_uas"] == pytest.approx(summary["test_uas"])
    assert saved["train_sentences"] == 24 and len(saved["history"]) == 2
    assert saved["nonprojective_left_out"]["train"] == 288
    for key in ("dev_uas", "dev_las", "test_uas", "test_las"):
        assert 0.0 <= saved[key] <= 1.0
    assert saved["dev_las"] <= saved["dev_uas"] and saved["test_sentences"] == 12
    # every sentence is parsed: the synchronisations follow its decisions (at most 2n - 1)
    assert 1 <= saved["test_max_syncs"] <= 2 * 159
    assert set(torch.load(saved_params)) >= {"parser.W_h", "parser.E_w"}


@pytest.mark.parametrize("option", ["--epochs", "--train-limit"])
def test_bad_counts_are_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([option, "0"])
    assert f"{option} must be >=" in capsys.readouterr().err
