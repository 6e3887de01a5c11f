"""``python -m experiments.train_tagger``: short runs train both EWT taggers through the
batched executor; the accuracy equals one computed from the reference executor's states."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from edbatch.executor import init_params, run_reference
from edbatch.executor.torch_executor import TorchExecutor
from experiments.train_tagger import PREFIX, accuracy, main, make_tagger, with_states

__all__: list[str] = []

SMALL = ["--word-dim", "8", "--hidden-dim", "6", "--char-dim", "4", "--mlp-dim", "5"]


@pytest.mark.parametrize("workload", sorted(PREFIX))
def test_short_run_writes_accuracies(tmp_path: Path, workload: str) -> None:
    out = tmp_path / "tagger.json"
    summary = main(["--workload", workload, "--epochs", "2", "--train-limit", "48",
                    "--batch-size", "16", "--eval-limit", "20", "--eval-batch-size", "8",
                    "--lr", "0.01", *SMALL, "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["workload"] == workload and saved["train_sentences"] == 48
    assert saved["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    h = saved["history"]
    assert len(h) == 2 and h[1]["train_loss_per_word"] < h[0]["train_loss_per_word"]
    assert 0.0 <= saved["dev_accuracy"] <= 1.0 and 0.0 <= saved["test_accuracy"] <= 1.0
    assert saved["executor_batches"] > 0


def test_accuracy_equals_the_reference_states() -> None:
    args = argparse.Namespace(workload="bilstm_char_tagger", char_dim=4, word_dim=8,
                              hidden_dim=6, mlp_dim=5, min_count=6)
    wl = make_tagger(args)
    params = dict(init_params(wl, torch.Generator().manual_seed(2)))
    got = accuracy(wl, TorchExecutor(), params, "dev", 3, "depth", "aligned", limit=7)
    graph, fwd, bwd, gold = with_states(wl, "dev", range(7))
    values = run_reference(graph, params)
    with torch.no_grad():
        x = torch.cat([torch.stack([values[int(v)].reshape(-1)[:6] for v in ids])
                       for ids in (fwd, bwd)], dim=1)
        p = {k: params[f"char_tagger.{k}"] for k in ("hidden", "hidden.b", "out", "out.b")}
        logits = F.linear(torch.tanh(F.linear(x, p["hidden"], p["hidden.b"])), p["out"],
                          p["out.b"])
    want = float((logits.argmax(1).numpy() == gold).mean())
    assert len(gold) == sum(len(i) for i in wl.load("dev")[:7])
    assert got == pytest.approx(want)


@pytest.mark.parametrize("option", ["--epochs", "--word-dim"])
def test_bad_counts_are_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([option, "0"])
    assert f"{option} must be >=" in capsys.readouterr().err
