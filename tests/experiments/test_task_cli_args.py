"""The per-workload training CLIs refuse a seed numpy cannot take, zero threads and zero
sizes with one usage line (they reached numpy / torch / the workload as tracebacks)."""

from __future__ import annotations

import importlib

import pytest

ENTRIES = ["train_module_net", "train_moe", "train_ggnn", "train_parser", "train_sick",
           "train_tagger"]
SIZE = {"train_moe": "--dim", "train_module_net": "--hidden-dim", "train_ggnn": "--hidden-dim",
        "train_parser": "--hidden-dim", "train_sick": "--hidden-dim",
        "train_tagger": "--hidden-dim"}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("args", "words"), [
    (["--seed", "-1"], ["--seed", "[0, 2**32)", "-1"]),
    (["--seed", str(2**32)], ["--seed", str(2**32)]),
    (["--threads", "0"], ["--threads", ">= 1", "got 0"]),
    (["SIZE", "0"], ["must be >= 1", "got 0"]),
])
def test_bad_run_option_is_one_usage_line(entry: str, args: list[str], words: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(f"experiments.{entry}").main
    args = [SIZE[entry] if a == "SIZE" else a for a in args]
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert all(w in lines[-1] for w in words), lines[-1]
    if args[0] not in ("--seed", "--threads"):
        assert args[0] in lines[-1]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("args", "words"), [
    (["--lr", "-1"], ["--lr must be a finite number > 0", "-1.0"]),
    (["--lr", "nan"], ["--lr must be a finite number > 0", "nan"]),
    (["--scheduler", "nosuch"], ["--scheduler: unknown scheduler 'nosuch'"]),
    (["--out", "."], ["argument --out: '.' is a folder, not a file to write"]),
])
def test_bad_rate_scheduler_or_out_is_one_usage_line(entry: str, args: list[str],
                                                     words: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """(A negative or NaN learning rate was torch's raw ``ValueError`` after the data
    loaded; an unknown scheduler or a folder as ``--out`` a traceback.)"""
    main = importlib.import_module(f"experiments.{entry}").main
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert all(w in last for w in words), last


@pytest.mark.parametrize(("entry", "args", "words"), [
    ("train_sick", ["--weight-decay", "-1"], ["--weight-decay must be a finite number >= 0"]),
    ("train_parser", ["--alpha", "-1"], ["--alpha must be a finite number >= 0"]),
    ("train_tagger", ["--lr-decay", "0"], ["--lr-decay must be a finite number > 0"]),
])
def test_other_rates_are_checked(entry: str, args: list[str], words: list[str],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        importlib.import_module(f"experiments.{entry}").main(args)
    assert err.value.code == 2
    assert all(w in capsys.readouterr().err for w in words)


@pytest.mark.parametrize(("entry", "args", "found"), [
    ("train_ggnn", ["--rounds", "0"], "rounds must be a positive int, got 0"),
    ("train_moe", ["--top-k", "9", "--epochs", "1"], "moe: top_k=9 must be <= experts=8"),
])
def test_a_workload_error_while_running_is_one_error_line(
        entry: str, args: list[str], found: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(A raw ``GraphError`` traceback from the workload's constructor.)"""
    monkeypatch.delenv("EDBATCH_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as err:
        importlib.import_module(f"experiments.{entry}").main(args)
    assert err.value.code == 2
    assert capsys.readouterr().err.splitlines()[0].startswith(f"error: {found}")
