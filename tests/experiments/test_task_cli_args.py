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
