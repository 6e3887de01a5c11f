"""The DyNet peers of ``benchmarks/dynet_peer.py`` compute edbatch's losses exactly.

DyNet initialises once per process, so the in-process tests share one import (autobatch 1,
set through ``dynet_config`` before ``dynet`` is first imported); the worker CLI runs as a
subprocess with another mode. Biases are randomised so that a swapped bias or gate shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from benchmarks.peers import sized_workload
from edbatch.executor import init_params, reference_loss
from edbatch.workloads import make_workload
from edbatch.workloads._trees import TreeInstance

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "dynet_peer.py"
EMBED, HIDDEN = 8, 6

pytest.importorskip("dynet_config")


def _load_peer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dynet_peer_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dp = _load_peer()
WORKLOADS = tuple(dp.PEERS)  # every workload with a benchmarks/peers/dynet/<name>.py




def _params(wl: Any, seed: int = 0) -> dict[str, torch.Tensor]:
    """edbatch's init_params with non-zero biases (zeros would hide a swapped bias)."""
    params = init_params(wl, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in params.values():
            if p.dim() == 1:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return params


def _reference(wl: Any, instances: list[Any], params: dict[str, torch.Tensor]) -> float:
    torch.set_num_threads(1)
    with torch.no_grad():
        return float(reference_loss(wl.build_graph(instances), params))


def _dynet_loss(dy: Any, wl: Any, instances: list[Any], params: dict[str, torch.Tensor]
                ) -> float:
    arrays = {k: v.detach().numpy() for k, v in params.items()}
    _, peer_params = dp.build_peer(dy, wl.name, arrays)
    return float(dp.PEERS[wl.name](dy, peer_params, wl.hidden_dim, instances).value())


def test_importing_the_worker_does_not_initialise_dynet() -> None:
    code = (f"import importlib.util, sys; s = importlib.util.spec_from_file_location('p', "
            f"{str(SCRIPT)!r}); m = importlib.util.module_from_spec(s); "
            f"s.loader.exec_module(m); assert callable(m.save_params); "
            f"assert 'dynet' not in sys.modules, 'dynet imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("name", WORKLOADS)
def test_loss_matches_edbatch_reference(dy: Any, name: str) -> None:
    wl = sized_workload(name, EMBED, HIDDEN)
    instances = list(wl.load(wl.default_eval_split)[:3])
    if name == "lattice_lstm":  # the sum of several incoming arcs is exercised
        assert max(inst.max_in_degree for inst in instances) > 1
    params = _params(wl)
    expected = _reference(wl, instances, params)
    got = _dynet_loss(dy, wl, instances, params)
    assert got == pytest.approx(expected, rel=1e-4)
    # the comparison can fail: other parameter values give another loss
    other = _dynet_loss(dy, wl, instances, _params(wl, seed=7))
    assert other != pytest.approx(expected, rel=1e-3)


def test_tree_lstm_unary_node_passes_its_childs_state(dy: Any) -> None:
    wl = make_workload("tree_lstm", granularity="cell", embed_dim=EMBED, hidden_dim=HIDDEN)
    # (2 (3 (1 w5) (0 w7))) plus a unary node on top of a leaf: rows in post-order.
    nodes = ((5, -1, -1, 1), (7, -1, -1, 0), (-1, 0, 1, 3), (-1, 2, -1, 2),
             (9, -1, -1, 4), (-1, 4, -1, 1), (-1, 3, 5, 0))
    inst = TreeInstance(None, nodes)  # type: ignore[arg-type]
    assert inst.num_unary == 2
    params = _params(wl)
    assert _dynet_loss(dy, wl, [inst], params) == pytest.approx(
        _reference(wl, [inst], params), rel=1e-4)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_cli_reports_timings_and_reference_losses(tmp_path: Path) -> None:
    wl = make_workload("lattice_lstm", granularity="cell", embed_dim=EMBED, hidden_dim=HIDDEN)
    params = _params(wl)
    path = dp.save_params(tmp_path / "params.npz", params)
    proc = _run_cli("--workload", "lattice_lstm", "--embed", str(EMBED), "--hidden",
                    str(HIDDEN), "--autobatch", "2", "--batch-size", "2", "--minibatches",
                    "2", "--repeats", "1", "--warmup", "0", "--params", str(path),
                    "--modes", "infer", "train", "--mem", "256")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["contender"] == "dynet_autobatch2" and out["autobatch"] == 2
    assert (out["workload"], out["embed"], out["hidden"]) == ("lattice_lstm", EMBED, HIDDEN)
    assert (out["batch_size"], out["num_minibatches"], out["items"]) == (2, 2, 4)
    assert set(out["infer"]) == {"construction_ms", "forward_ms", "total_ms", "items_per_s"}
    assert set(out["train"]) == {"construction_ms", "forward_ms", "backward_ms", "update_ms",
                                 "total_ms", "items_per_s"}
    for mode in ("infer", "train"):
        row = out[mode]
        assert row["total_ms"] == pytest.approx(
            sum(v for k, v in row.items() if k not in ("total_ms", "items_per_s")))
        assert row["items_per_s"] == pytest.approx(4 / (row["total_ms"] / 1e3))
    instances = list(wl.load("dev"))
    expected = [_reference(wl, instances[s:s + 2], params) for s in (0, 2)]
    assert out["losses"] == pytest.approx(expected, rel=1e-4)


def test_cli_rejects_mismatched_params(tmp_path: Path) -> None:
    wrong = make_workload("lattice_lstm", granularity="cell", embed_dim=EMBED,
                          hidden_dim=HIDDEN + 1)
    path = dp.save_params(tmp_path / "wrong.npz", init_params(wrong))
    proc = _run_cli("--workload", "lattice_lstm", "--embed", str(EMBED), "--hidden",
                    str(HIDDEN), "--autobatch", "0", "--params", str(path))
    assert proc.returncode == 2
    assert "lattice_lstm.char_cell" in proc.stderr and "save_params" in proc.stderr
    assert "dynet_autobatch" not in proc.stdout


@pytest.mark.parametrize(("change", "needle"), [
    ({"--workload": "tree_lstmm"}, "tree_lstmm"),
    ({"--params": "missing.npz"}, "missing.npz"),
    ({"--workload": "tree_lstm"}, "lattice_lstm.char_emb"),
    ({"--preload-split": "train"}, "--preload-split needs --serve"),
])
def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           change: dict[str, str], needle: str) -> None:
    wl = make_workload("lattice_lstm", granularity="cell", embed_dim=EMBED, hidden_dim=HIDDEN)
    path = dp.save_params(tmp_path / "p.npz", init_params(wl))
    args = {"--workload": "lattice_lstm", "--embed": str(EMBED), "--hidden": str(HIDDEN),
            "--autobatch": "0", "--params": str(path)}
    args.update({k: (str(tmp_path / v) if k == "--params" else v) for k, v in change.items()})
    assert dp.main([x for kv in args.items() for x in kv]) == 2
    assert needle in capsys.readouterr().err


def test_unknown_preload_split_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = make_workload("bilstm_tagger", granularity="cell", embed_dim=EMBED, hidden_dim=HIDDEN)
    path = dp.save_params(tmp_path / "p.npz", init_params(wl))
    argv = ["--workload", "bilstm_tagger", "--embed", str(EMBED), "--hidden", str(HIDDEN),
            "--autobatch", "1", "--params", str(path), "--serve", "--preload-split", "nope"]
    assert dp.main(argv) == 2
    assert "--preload-split 'nope'" in capsys.readouterr().err


def test_serving_worker_times_one_minibatch_per_request(tmp_path: Path) -> None:
    """``--serve`` through the harness's client: reference losses per request, a bad request
    answered with an error naming it (the worker stays up), a clean exit at end of input."""
    from benchmarks._dynet_server import DynetServer, PeerServerError

    wl = make_workload("bilstm_tagger", granularity="cell", embed_dim=EMBED, hidden_dim=HIDDEN)
    params = _params(wl)
    path = dp.save_params(tmp_path / "params.npz", params)
    cmd = [sys.executable, str(SCRIPT), "--workload", "bilstm_tagger", "--embed", str(EMBED),
           "--hidden", str(HIDDEN), "--autobatch", "1", "--batch-size", "2", "--minibatches",
           "2", "--params", str(path), "--mem", "256", "--serve"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    instances = list(wl.load(wl.default_eval_split))
    expected = [_reference(wl, instances[s:s + 2], params) for s in (0, 2)]
    with DynetServer(cmd, env, ROOT) as server:
        assert server.contender == "dynet_autobatch1" and server.sizes == [2, 2]
        for mode, k in (("infer", 1), ("train", 0), ("infer", 0)):
            phases, loss = server.run(mode, k)
            assert loss == pytest.approx(expected[k], rel=1e-4)
            # (the kernel's RSS counters lag by a few pages: 1 MB of slack)
            assert phases.pop("maxrss_mb") >= phases.pop("rss_before_mb") - 1 > 0
            assert set(phases) == ({"construction", "forward", "backward", "update"}
                                   if mode == "train" else {"construction", "forward"})
            assert all(v >= 0 for v in phases.values())
        with pytest.raises(PeerServerError, match="batch 7 out of range"):
            server.run("infer", 7)
        assert server.run("infer", 1)[1] == pytest.approx(expected[1], rel=1e-4)
        # the reshuffled harness names the instances of each mini-batch
        train = list(wl.load("train"))
        loss = server.run("infer", 0, indices=[5, 3], split="train")[1]
        assert loss == pytest.approx(_reference(wl, [train[5], train[3]], params), rel=1e-4)
    assert server.proc.returncode == 0
