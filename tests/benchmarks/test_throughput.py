"""``benchmarks/throughput.py`` end to end on a tiny model: rows, losses, files, errors.

Nothing here asserts anything about speed: one mini-batch, one pass, no warm-up, ``8x6``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import _throughput_report as report
from benchmarks import throughput as tp
from benchmarks._throughput_dynet import dynet_worker_rows

__all__: list[str] = []

TINY = ["--workloads", "tree_lstm", "--sizes", "8x6", "--minibatches", "1", "--repeats", "1",
        "--warmup", "0", "--fsm-episodes", "2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One tiny run without DyNet; returns the results and its folder."""
    tmp = tmp_path_factory.mktemp("throughput")
    results = tp.main([*TINY, "--full", "--no-dynet", "--policy-dir", str(tmp / "policies"),
                       "--out", str(tmp / "out.json"), "--plot", str(tmp / "out.png")])
    return results, tmp  # (--full: every contender; the explicit sizes and count stay)


def test_a_row_per_contender_and_mode_with_positive_totals(run: tuple[dict[str, Any], Path]
                                                            ) -> None:
    results, tmp = run
    saved = json.loads((tmp / "out.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(results["rows"]))
    keys = {(r["contender"], r["mode"]) for r in saved["rows"]}
    # the CUDA-graph contender runs on --device cuda only; per-instance PyTorch where the
    # workload's peers module has an Unbatched
    skip = {tp.GRAPHED} if "tree_lstm" in tp.unbatched_models() else {tp.GRAPHED,
                                                                        tp.PT_UNBATCHED}
    assert keys == {(c, m) for c in (*tp.EDBATCH_CONTENDERS, *tp.OTHER_CONTENDERS)
                    if c not in skip for m in tp.MODES}
    for row in saved["rows"]:
        assert row["total_ms"] > 0 and row["items_per_s"] > 0, row
        assert row["items"] == 64 and (row["framework"] != "edbatch" or row["batches"] >= 1)
        assert 0 <= row["overhead_share"] <= 1
        parts = sum(row[f"{p}_ms"] for p in tp.PHASES)
        assert math.isclose(parts, row["total_ms"], rel_tol=1e-9)
        assert (row["backward_ms"] > 0) == (row["mode"] == "train")
    for key in ("machine", "args", "loadavg_before", "loadavg_after", "policies", "dynet",
                "date", "git_sha", "data", "torchfold"):
        assert key in saved
    assert saved["dynet"]["used"] is False and "--no-dynet" in saved["dynet"]["note"]


def test_every_contender_agrees_with_the_unbatched_reference(
        run: tuple[dict[str, Any], Path]) -> None:
    """Same mini-batch, same loss: edbatch's rows, the hand-batched PyTorch model (TorchFold
    cannot run on this torch: its reason is recorded instead)."""
    results = run[0]
    for mode in tp.MODES:
        rows = [r for r in results["rows"] if r["mode"] == mode and r["contender"] != "floor"]
        ref = next(r["loss"] for r in rows if r["contender"] == "unbatched")
        assert {r["contender"] for r in rows} >= {"pytorch_hand", "fsm+cse", "fsm+fastbuild"}
        for row in rows:
            assert row["loss"] == pytest.approx(ref, rel=1e-4), row["contender"]
            assert row.get("loss_match", True) is True, row["contender"]
    assert results["torchfold"] == "runs" or "raised" in results["torchfold"]


REQUIRED = {"workload": str, "mode": str, "contender": str, "data": str,
            "items_per_s": float, "overhead_share": float, "total_ms": float,
            **{f"{p}_ms": float for p in tp.PHASES}}


def test_json_rows_hold_the_documented_schema(run: tuple[dict[str, Any], Path]) -> None:
    saved = json.loads((run[1] / "out.json").read_text())
    assert saved["data"] == "reshuffled"
    floors = {r["mode"]: r for r in saved["rows"] if r["contender"] == "floor"}
    for row in saved["rows"]:
        for key, kind in REQUIRED.items():
            assert isinstance(row[key], kind), (key, row)
        assert row["mode"] in tp.MODES and row["data"] == "reshuffled"
        assert row["ratio_to_dynet_agenda"] is None  # no DyNet in this run
        assert row["floor_multiple"] == pytest.approx(
            row["total_ms"] * row["scale"] / floors[row["mode"]]["total_ms"])
        assert row["peak_rss_mb"] is None or row["peak_rss_mb"] >= 0
    assert all(f["floor_multiple"] == pytest.approx(1.0) for f in floors.values())
    assert all(f["gemms"] > 0 for f in floors.values())


def test_plot_is_written_and_policy_saved_then_reloaded(run: tuple[dict[str, Any], Path],
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    results, tmp = run
    assert (tmp / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    info = results["policies"]["tree_lstm"]
    assert info["trained"] and Path(info["path"]).is_file()
    again = tp.main([*TINY, "--no-dynet", "--contenders", "fsm", "--modes", "infer",
                     "--policy-dir", str(tmp / "policies"), "--out", str(tmp / "again.json"),
                     "--plot", str(tmp / "again.png")])
    assert again["policies"]["tree_lstm"]["trained"] is False
    assert [r["contender"] for r in again["rows"]] == ["fsm"]
    assert "loaded FSM policy" in capsys.readouterr().out


def test_the_default_run_is_the_small_set_and_full_is_everything() -> None:
    default = tp.build_parser().parse_args([])
    assert default.sizes == list(tp.DEFAULT_SIZES) and default.minibatches == 2
    assert default.contenders == list(tp.DEFAULT_CONTENDERS) and not default.full
    assert default.workloads == list(tp.DEFAULT_WORKLOADS) and default.modes == list(tp.MODES)
    assert set(tp.DEFAULT_WORKLOADS) < set(tp.WORKLOADS)
    assert "--full" in tp.build_parser().format_help()
    # unbatched per-instance PyTorch (the seeds' baseline) is in the default run, on every
    # default workload, on the first --unbatched-minibatches only, and the help says so
    assert tp.PT_UNBATCHED in tp.DEFAULT_CONTENDERS and default.unbatched_minibatches == 1
    assert set(tp.DEFAULT_WORKLOADS) <= set(tp.unbatched_models())
    epilog = " ".join((tp.build_parser().epilog or "").split())
    assert f"contenders {' '.join(tp.DEFAULT_CONTENDERS)} (pytorch_unbatched" in epilog
    assert "first --unbatched-minibatches only" in epilog and "xunb" in epilog


def test_rows_divide_by_unbatched_pytorch_and_the_table_shows_fsm_x_unbatched(
        run: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]) -> None:
    results = run[0]
    for mode in tp.MODES:
        rows = [r for r in results["rows"] if r["mode"] == mode]
        unb = next(r for r in rows if r["contender"] == tp.PT_UNBATCHED)
        assert unb["framework"] == "pytorch" and unb["loss_match"] is True
        for row in rows:
            assert row["ratio_to_unbatched"] == pytest.approx(
                row["items_per_s"] / unb["items_per_s"]), row["contender"]
        report.print_table(rows)
        out = capsys.readouterr().out
        assert "xunb = items/s / pytorch_unbatched" in out.splitlines()[1]
        fsm = next(r for r in rows if r["contender"] == "fsm")
        table = {line.split()[0]: line.split() for line in out.splitlines()[4:]
                 if line.split() and line.split()[0] in ("fsm", "pytorch_unbatched")}
        col = [name for name, _ in report._COLUMNS].index("xunb")
        assert float(table["fsm"][col]) == pytest.approx(fsm["ratio_to_unbatched"], rel=0.01,
                                                         abs=0.006)
        assert float(table["pytorch_unbatched"][col]) == 1.0
        assert f"fsm: {fsm['ratio_to_unbatched']:.1f}x the items/s of pytorch_unbatched" in out
    bare = [{**r, "ratio_to_unbatched": None} for r in results["rows"]
            if r["contender"] != tp.PT_UNBATCHED]
    report.add_ratios(bare)  # without the unbatched row: no ratio, "-" in the table
    assert all(r["ratio_to_unbatched"] is None for r in bare)


@pytest.mark.parametrize("argv, named", [
    (["--sizes", "300by150"], "300by150"),
    (["--sizes", "0x8"], "0x8"),
    (["--contenders", "fsm_planned"], "fsm_planned"),
    (["--modes", "eval"], "eval"),
])
def test_bad_arguments_fail_with_argparse_naming_the_value(
        argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        tp.build_parser().parse_args(argv)
    assert e.value.code == 2
    assert named in capsys.readouterr().err


def test_loss_match_against_a_stub_worker(tmp_path: Path) -> None:
    """The subprocess path and the loss cross-check, with a worker that needs no DyNet."""
    stub = tmp_path / "peer.py"
    stub.write_text(
        "import json, sys\n"
        "a = sys.argv\n"
        "ab = int(a[a.index('--autobatch') + 1])\n"
        "loss = 10.0 if ab == 1 else 11.0\n"
        "ph = {'construction_ms': 1.0, 'forward_ms': 2.0, 'backward_ms': 3.0,\n"
        "      'update_ms': 0.5, 'total_ms': 6.5, 'items_per_s': 64 / 6.5e-3}\n"
        "print(json.dumps({'contender': f'dynet_autobatch{ab}', 'items': 64,\n"
        "                  'losses': [loss], 'infer': ph, 'train': ph}))\n")
    args = argparse.Namespace(contenders=["dynet_autobatch0", "dynet_autobatch1"],
                              dynet_peer=stub, repeats=1, warmup=0, modes=["train"])
    wl = tp.make_workload("tree_lstm", granularity="cell", embed_dim=8, hidden_dim=6)
    errors: list[str] = []
    rows = dynet_worker_rows("tree_lstm", "8x6", wl, 1, args, errors)
    assert not errors and [r["contender"] for r in rows] == list(args.contenders)
    edb = {"framework": "edbatch", "contender": "depth", "losses": [10.0 + 1e-4]}
    report.check_losses([edb, *rows])
    assert [r["loss_match"] for r in rows] == [False, True]
    assert rows[1]["execution_ms"] == 2.0 and rows[1]["total_ms"] == 6.5


def test_worker_failure_is_recorded_not_raised(tmp_path: Path) -> None:
    stub = tmp_path / "peer.py"
    stub.write_text("import sys\nprint('boom', file=sys.stderr)\nsys.exit(2)\n")
    args = argparse.Namespace(contenders=["dynet_autobatch1"], dynet_peer=stub, repeats=1,
                              warmup=0, modes=["infer"])
    wl = tp.make_workload("tree_lstm", granularity="cell", embed_dim=8, hidden_dim=6)
    errors: list[str] = []
    assert dynet_worker_rows("tree_lstm", "8x6", wl, 1, args, errors) == []
    assert len(errors) == 1 and "boom" in errors[0] and "exited 2" in errors[0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("dynet") is None, reason="DyNet not installed")
def test_real_dynet_worker_losses_match_on_reshuffled_minibatches(tmp_path: Path) -> None:
    """The interleaved worker runs the instances the harness names (reshuffled train
    mini-batches) and its losses equal edbatch's and the hand-batched model's."""
    results = tp.main([*TINY, "--repeats", "2", "--contenders", "depth", "pytorch_hand",
                       "dynet_autobatch1", "--policy-dir", str(tmp_path / "policies"),
                       "--out", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")])
    assert not results["dynet_errors"], results["dynet_errors"]
    rows = {(r["contender"], r["mode"]): r for r in results["rows"]}
    for mode in tp.MODES:
        assert rows["dynet_autobatch1", mode]["loss_match"] is True
        assert rows["pytorch_hand", mode]["loss_match"] is True
        assert rows["depth", mode]["ratio_to_dynet_agenda"] > 0
        assert rows["dynet_autobatch1", mode]["peak_rss_mb"] >= 0


@pytest.mark.parametrize("construction", ["api", "fastbuild", "cached"])
def test_memo_contender_alone_and_both_constructions(tmp_path: Path, construction: str) -> None:
    """The memo contender needs the FSM even when no other FSM row is asked for."""
    results = tp.main([*TINY, "--no-dynet", "--modes", "infer", "--construction", construction,
                       "--contenders", "depth", "fsm+planned+memo",
                       "--policy-dir", str(tmp_path / "policies"),
                       "--out", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")])
    rows = {r["contender"]: r for r in results["rows"]}
    assert set(rows) == {"depth", "fsm+planned+memo"}
    assert math.isclose(rows["depth"]["loss"], rows["fsm+planned+memo"]["loss"], rel_tol=1e-5)


def test_best_of_two_dynet_runs_keeps_the_faster_row_and_both_speeds() -> None:
    def row(contender: str, mode: str, speed: float) -> dict[str, Any]:
        return {"contender": contender, "mode": mode, "items_per_s": speed}

    before = [row("dynet_autobatch1", "infer", 100.0), row("dynet_autobatch1", "train", 50.0)]
    after = [row("dynet_autobatch1", "infer", 120.0), row("dynet_autobatch1", "train", 40.0)]
    best = {(r["contender"], r["mode"]): r for r in tp.best_of([before, after])}
    assert best["dynet_autobatch1", "infer"]["items_per_s"] == 120.0
    assert best["dynet_autobatch1", "train"]["items_per_s"] == 50.0
    assert best["dynet_autobatch1", "train"]["items_per_s_runs"] == [50.0, 40.0]
    assert tp.best_of([after]) == [{**r, "items_per_s_runs": [r["items_per_s"]]}
                                   for r in after]


_SERVING_STUB = """\
import json, sys
a = sys.argv
ab = int(a[a.index('--autobatch') + 1])
die_at = {die_at}
log = open({log!r}, 'a')
if die_at == -1:
    print('cannot start', file=sys.stderr)
    sys.exit(2)
probe = '--preload-split' in a  # a memory-probe worker: --mem FOR,BACK,PARAM,SCRATCH
back = int(a[a.index('--mem') + 1].split(',')[1]) if probe else 0
hello = {{'ready': True, 'contender': f'dynet_autobatch{{ab}}', 'sizes': [64], 'rss_mb': 100.0}}
print(json.dumps(hello), flush=True)
for n, line in enumerate(sys.stdin):
    req = json.loads(line)
    log.write(f"{{'probe ' if probe else ''}}{{req['mode']}} {{req['batch']}}\\n")
    log.flush()
    if n == die_at:
        print('worker crashed', file=sys.stderr)
        sys.exit(3)
    if probe and req['mode'] == 'train' and back < 20:
        print(json.dumps({{'error': 'please pre-allocate enough memory'}}), flush=True)
        continue
    ph = {{'construction': 0.001, 'forward': 0.002, 'maxrss_mb': 130.0}}
    if req['mode'] == 'train':
        ph.update(backward=0.003, update=0.0005)
    print(json.dumps({{**ph, 'loss': 10.0}}), flush=True)
"""


def _interleaved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, die_at: int | None
                 ) -> tuple[dict[str, Any], list[str]]:
    """A tiny run with depth and a serving stub worker (no DyNet needed)."""
    log = tmp_path / "requests.log"
    stub = tmp_path / "peer.py"
    stub.write_text(_SERVING_STUB.format(die_at=die_at, log=str(log)))
    monkeypatch.setattr(tp, "dynet_available", lambda: True)
    results = tp.main([*TINY, "--repeats", "2", "--warmup", "1", "--contenders", "depth",
                       "dynet_autobatch1", "--dynet-peer", str(stub),
                       "--policy-dir", str(tmp_path / "policies"),
                       "--out", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")])
    return results, log.read_text().splitlines() if log.exists() else []


def test_interleaved_dynet_worker_rows_and_requests(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    results, requests = _interleaved(tmp_path, monkeypatch, die_at=None)
    assert "interleaved" in results["dynet"]["note"] and not results["dynet_errors"]
    # one request per mini-batch pass, warm-up included, in the harness's pass order; then
    # the memory probe's fresh workers, a one-instance warm-up request first (training:
    # backward pools of 8 and 16 MB fail at the warm-up, 32 and 24 MB are enough)
    assert requests == (["infer 0"] * 3 + ["probe infer 0"] * 2 + ["train 0"] * 3
                        + ["probe train 0"] * 6)
    rows = {(r["contender"], r["mode"]): r for r in results["rows"]}
    assert set(rows) == {(c, m) for c in ("depth", "dynet_autobatch1") for m in tp.MODES}
    infer, train = rows["dynet_autobatch1", "infer"], rows["dynet_autobatch1", "train"]
    assert infer["framework"] == "dynet" and "batches" not in infer
    assert (infer["construction_ms"], infer["execution_ms"], infer["total_ms"]) == \
        pytest.approx((1.0, 2.0, 3.0))
    assert (train["backward_ms"], train["update_ms"], train["total_ms"]) == \
        pytest.approx((3.0, 0.5, 6.5))
    assert infer["losses"] == [10.0] and infer["loss_match"] is False  # the stub's loss is off
    # memory: RSS growth 30 MB, plus in training the largest backward pool that was not
    # enough (16 MB; 24 was)
    assert (infer["peak_rss_mb"], train["peak_rss_mb"]) == (30.0, 46.0)


@pytest.mark.parametrize(("die_at", "needle"), [(-1, "cannot start"), (1, "worker crashed")])
def test_interleaved_worker_failure_is_recorded_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, die_at: int, needle: str) -> None:
    results, requests = _interleaved(tmp_path, monkeypatch, die_at=die_at)
    assert len(results["dynet_errors"]) == 1 and needle in results["dynet_errors"][0]
    assert len(requests) == (0 if die_at < 0 else 2)  # no request after the crash
    assert {r["contender"] for r in results["rows"]} == {"depth"}
    assert {r["mode"] for r in results["rows"]} == set(tp.MODES)


def test_block_timed_dynet_worker_runs_before_and_after(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--no-dynet-interleave``: one whole-run worker before and one after edbatch's passes;
    the faster counts and both speeds are kept."""
    stub = tmp_path / "peer.py"
    count = tmp_path / "runs"
    stub.write_text(
        "import json, pathlib, sys\n"
        f"p = pathlib.Path({str(count)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "ph = {'construction_ms': 1.0, 'forward_ms': float(n), 'total_ms': 1.0 + n,\n"
        "      'items_per_s': 64 / ((1.0 + n) / 1e3)}\n"
        "print(json.dumps({'contender': 'dynet_autobatch1', 'items': 64, 'losses': [10.0],\n"
        "                  'infer': ph}))\n")
    monkeypatch.setattr(tp, "dynet_available", lambda: True)
    results = tp.main([*TINY, "--modes", "infer", "--contenders", "depth", "dynet_autobatch1",
                       "--no-dynet-interleave", "--data", "repeated", "--dynet-peer", str(stub),
                       "--policy-dir", str(tmp_path / "policies"),
                       "--out", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")])
    assert count.read_text() == "2" and "before and after" in results["dynet"]["note"]
    (row,) = [r for r in results["rows"] if r["contender"] == "dynet_autobatch1"]
    assert row["execution_ms"] == 1.0 and len(row["items_per_s_runs"]) == 2  # run 1 was faster


def test_a_worker_that_dies_at_start_leaves_no_open_pipes(tmp_path: Path) -> None:
    import gc
    import sys
    import warnings

    from benchmarks._dynet_server import DynetServer, PeerServerError

    stub = tmp_path / "peer.py"
    stub.write_text("import sys\nprint('no dynet here', file=sys.stderr)\nsys.exit(2)\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(PeerServerError, match="exited 2: no dynet here"):
            DynetServer([sys.executable, str(stub)], {}, tmp_path)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
