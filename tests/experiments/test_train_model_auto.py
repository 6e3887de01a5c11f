"""``experiments.train_model batching=auto``: every candidate is timed, one of them is kept,
and the training losses equal those of a fixed scheduler (the numerics do not depend on the
choice)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import experiments  # noqa: F401 - registers the schemas and the output_subdir resolver
from edbatch.errors import ConfigError, UnknownNameError
from edbatch.workloads.tree_lstm import TreeLSTM
from experiments._schema import validate
from experiments.train_model import train_model
from policies import FSMPolicy

ROOT = Path(__file__).resolve().parents[2]
TINY = ["workload.tree_lstm.embed_dim=8", "workload.tree_lstm.hidden_dim=8", "epochs=1",
        "max_steps=8", "train_limit=128", "batch_size=16", "eval_limit=20",
        "eval_batch_size=20", "log_every=1", "eval_every=null", "time_budget_s=600"]
AUTO = ["batching=auto", "auto.schedulers=[depth,typewise_greedy]",
        "auto.strategies=[aligned,naive]", "auto.trials=1"]


def _cfg(run: Path, *extra: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train_model", [*TINY, *extra, f"run_dir={run}"])


def _losses(summary: dict) -> list[float]:
    return [row["train/loss"] for row in summary["history"] if "train/loss" in row]


def test_auto_times_each_candidate_keeps_one_and_trains_like_a_fixed_scheduler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    names = TreeLSTM(embed_dim=8, hidden_dim=8).vocab.names
    fsm = FSMPolicy({}, "base", names, fallback="critical_path").save(tmp_path / "p.json")
    auto = train_model(_cfg(tmp_path / "auto", *AUTO, f"fsm={fsm}"))
    fixed = train_model(_cfg(tmp_path / "fixed", "batching=critical_path", "strategy=planned"))
    labels = ["fsm/aligned", "fsm/naive", "depth/aligned", "depth/naive",
              "typewise_greedy/aligned", "typewise_greedy/naive"]
    assert auto["scheduler"] == "auto" and list(auto["auto"]["timings_s"]) == labels
    assert all(len(t) == 1 and t[0] > 0 for t in auto["auto"]["timings_s"].values())
    assert auto["auto"]["chosen"] in labels and auto["ran"] == auto["auto"]["chosen"]
    assert auto["auto"]["median_s"][auto["ran"]] == min(auto["auto"]["median_s"].values())
    assert fixed["ran"] == "critical_path/planned" and "auto" not in fixed
    got, want = _losses(auto), _losses(fixed)
    assert len(got) == len(want) == 8  # 6 trial steps, then 2 with the chosen candidate
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(got, want)), (got, want)
    assert math.isclose(auto["eval/loss"], fixed["eval/loss"], rel_tol=1e-5)
    assert auto["eval/fine_accuracy"] == fixed["eval/fine_accuracy"]


@pytest.mark.parametrize(("override", "key"), [
    ("auto.trials=0", "auto.trials"), ("auto.strategies=[fast]", "auto.strategies"),
    ("auto.schedulers=[]", "auto.schedulers"), ("fsm_lookahead=maybe", "fsm_lookahead"),
    ("batching=fsm", "fsm"), ("adam=adamw", "adam")])
def test_bad_auto_settings_are_config_errors(tmp_path: Path, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"config key {key}="):
        validate(_cfg(tmp_path, override))


def test_an_unknown_auto_scheduler_is_named_with_a_hint(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UnknownNameError, match="'dpeth'.*Did you mean 'depth'"):
        train_model(_cfg(tmp_path, "batching=auto", "auto.schedulers=[dpeth]"))
    assert not (tmp_path / "summary.json").exists()


def test_fused_adam_trains_like_torchs_default_for_loop_adam(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runs = {impl: train_model(_cfg(tmp_path / impl, "batching=depth", f"adam={impl}"))
            for impl in ("fused", "for_loop")}
    got, want = _losses(runs["fused"]), _losses(runs["for_loop"])
    assert len(got) == len(want) == 8 and got[0] == want[0]  # step 1 precedes any update
    assert got[1:] != [] and all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(got, want))
