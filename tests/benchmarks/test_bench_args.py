"""The benchmarks' shared argparse checks: a seed numpy cannot take and a device this machine
lacks end in one usage line naming the value (they were numpy / torch tracebacks)."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import _args
from benchmarks._throughput_cli import make_parser
from edbatch.errors import PolicyFileError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["-1", str(2**32), "x", "1.5", ""])
def test_bad_seed_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"invalid seed {text!r}"):
        _args.seed(text)


@pytest.mark.parametrize("text", ["0", "7", str(2**32 - 1)])
def test_good_seed_is_an_int(text: str) -> None:
    assert _args.seed(text) == int(text)


@pytest.mark.parametrize("text", ["0", "-3", "x", "2.5"])
def test_bad_count_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"invalid count {text!r}"):
        _args.positive(text)


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
    ("benchmarks.priority_cost", ["--reps", "0"]),
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


def test_run_turns_an_edbatch_error_into_one_line(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def main(path: str) -> None:
        raise PolicyFileError(path, "not valid JSON", "re-train it")

    monkeypatch.delenv("EDBATCH_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as err:
        _args.run(main, "p.json")
    assert err.value.code == 2
    assert capsys.readouterr().err.splitlines()[0].startswith("error: p.json: not valid JSON")
    monkeypatch.setenv("EDBATCH_FULL_ERROR", "1")
    with pytest.raises(PolicyFileError):
        _args.run(main, "p.json")


def test_corrupt_policy_file_in_throughput_is_one_line_and_kept(tmp_path: Path) -> None:
    bad = tmp_path / "tree_lstm_expert.json"
    bad.write_text('{"kind": "fsm", "tab')
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--policy-dir",
         str(tmp_path), "--workloads", "tree_lstm", "--minibatches", "1", "--repeats", "1",
         "--no-dynet", "--contenders", "fsm", "--out", str(tmp_path / "t.json"), "--plot",
         str(tmp_path / "t.png")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "EDBATCH_FULL_ERROR": "0"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: {bad}: not valid JSON" in proc.stderr
    assert bad.read_text() == '{"kind": "fsm", "tab'  # the file is not lost


@pytest.mark.parametrize("flags, named", [
    (["--out", "{tmp}"], "is a folder, not a file to write"),
    (["--plot", "{tmp}"], "is a folder, not a file to write"),
    (["--plot", "{tmp}/plot.txt"], "matplotlib cannot write a .txt plot"),
    (["--policy-dir", "{tmp}/a_file"], "is a file, not a folder"),
    (["--fsm-episodes", "-1"], "invalid count '-1'"),
])
def test_throughput_output_paths_are_checked_before_the_run(
        tmp_path: Path, flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """A folder as --out (or a plot type matplotlib lacks) failed after the whole run, the
    results lost in a traceback; a file as --policy-dir and a negative --fsm-episodes were a
    traceback / silently accepted."""
    (tmp_path / "a_file").write_text("keep")
    with pytest.raises(SystemExit) as e:
        make_parser("t").parse_args([f.format(tmp=tmp_path) for f in flags])
    assert e.value.code == 2 and named in capsys.readouterr().err
    assert (tmp_path / "a_file").read_text() == "keep"


def test_good_output_paths_pass() -> None:
    args = make_parser("t").parse_args(["--out", "r/x.json", "--plot", "r/x.pdf",
                                        "--policy-dir", "r/pol", "--fsm-episodes", "3"])
    assert (args.out, args.plot, args.policy_dir, args.fsm_episodes) == (
        Path("r/x.json"), Path("r/x.pdf"), "r/pol", 3)
