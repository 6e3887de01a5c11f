"""The benchmarks' shared argparse checks: a seed numpy cannot take and a device this machine
lacks end in one usage line naming the value (they were numpy / torch tracebacks)."""

from __future__ import annotations

import argparse
import importlib
import sys

import pytest
import torch

from benchmarks import _args
from benchmarks._throughput_cli import make_parser


@pytest.mark.parametrize("text", ["-1", str(2**32), "x", "1.5", ""])
def test_bad_seed_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"invalid seed {text!r}"):
        _args.seed(text)


@pytest.mark.parametrize("text", ["0", "7", str(2**32 - 1)])
def test_good_seed_is_an_int(text: str) -> None:
    assert _args.seed(text) == int(text)


@pytest.mark.parametrize("text", ["tpu", "cuda:x", "cpu:1"]
                         + ([] if torch.cuda.is_available() else ["cuda"]))
def test_bad_device_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        _args.device(text)


@pytest.mark.parametrize(("module", "args"), [
    ("benchmarks._throughput_cli", ["--seed", "-1"]),
    ("benchmarks._throughput_cli", ["--device", "tpu"]),
    ("benchmarks.runtime_phases", ["--seed", "-1"]),
    ("benchmarks.dump_protocol", ["--seeds", "0", "-1"]),
    ("benchmarks.module_net_peers", ["--seed", "-1"]),
    ("benchmarks.parser_inference", ["--seed", "-1"]),
])
def test_benchmark_command_lines_use_the_checks(module: str, args: list[str],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [module, *args])  # main() parses sys.argv
    if module == "benchmarks._throughput_cli":
        parse = make_parser("throughput").parse_args
    else:
        parse = importlib.import_module(module).main
    with pytest.raises(SystemExit) as err:
        parse()
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert args[0] in last and args[-1] in last and "Traceback" not in last
