"""The benchmark peers of ``tree_lstm_sick`` and ``ggnn_molecules`` as the throughput harness
finds them (``benchmarks/peers/<name>.py``, ``benchmarks/peers/dynet/<name>.py``):

* the per-instance (``Unbatched``) and hand-batched (``HandBatched``: level by level; PyG)
  PyTorch models equal the workload's node-by-node reference executor in fp64, loss and
  gradients, through the harness's ``prepare`` / ``forward`` split;
* the DyNet peers' gradients (autobatch 1, backward through DyNet's batched kernels) equal
  the reference's, not only their losses (``tests/benchmarks/test_dynet_peer.py``);
* (slow) the harness runs every contender on both workloads, DyNet included, and every
  loss matches edbatch's.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.hand_batched import make_hand_batched, make_unbatched
from benchmarks.peers import sized_workload
from edbatch.executor import init_params, reference_loss
from edbatch.workloads import Workload
from tests.benchmarks.conftest import assert_dynet_grads

__all__: list[str] = []

NAMES = ("tree_lstm_sick", "ggnn_molecules")
TOL = {"atol": 1e-6, "rtol": 1e-6}


@functools.cache
def workload(name: str) -> Workload:
    return sized_workload(name, 6, 5)


def _params(wl: Workload, seed: int, dtype: torch.dtype = torch.float64
            ) -> dict[str, torch.Tensor]:
    """``init_params`` with random non-zero biases (a swapped bias would show)."""
    params = dict(init_params(wl, torch.Generator().manual_seed(seed), dtype=dtype))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in params.values():
            if p.dim() == 1:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=dtype))
    return {k: v.requires_grad_(True) for k, v in params.items()}


def _dense(grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [g.to_dense() if g.is_sparse else g for g in grads]


@pytest.mark.parametrize("model", ["unbatched", "hand"])
@pytest.mark.parametrize("name", NAMES)
def test_pytorch_peers_equal_the_reference_fp64(name: str, model: str) -> None:
    if name == "ggnn_molecules" and model == "hand":
        pytest.importorskip("torch_geometric")
    wl = workload(name)
    instances = list(wl.load("train")[20:27])
    params = _params(wl, 3)
    peer = (make_unbatched if model == "unbatched" else make_hand_batched)(wl, params)
    assert peer is not None, f"{name} has no {model} peer"
    loss = peer.forward(peer.prepare(instances))
    ref = reference_loss(wl.build_graph(instances), params)
    torch.testing.assert_close(loss, ref, **TOL)
    got = _dense(torch.autograd.grad(loss, list(params.values()), allow_unused=True,
                                     materialize_grads=True))
    want = _dense(torch.autograd.grad(ref, list(params.values()), allow_unused=True,
                                      materialize_grads=True))
    for key, g, w in zip(params, got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL, msg=f"{name} {model}: gradient of {key}")
    # the check can fail: another parameter draw gives another loss
    other = peer.__class__(wl, _params(wl, 9)).loss(instances).detach()
    assert abs(float(other) - float(ref.detach())) > 1e-3 * abs(float(ref.detach()))


# ---------------------------------------------------------------------- DyNet


@pytest.mark.parametrize("name", NAMES)
def test_dynet_gradients_equal_the_reference(dy: Any, name: str) -> None:
    from benchmarks import dynet_peer

    wl = workload(name)
    instances = list(wl.load("train")[20:24])
    params = _params(wl, 5, torch.float32)
    ref = reference_loss(wl.build_graph(instances), params)
    want = dict(zip(params, _dense(torch.autograd.grad(
        ref, list(params.values()), allow_unused=True, materialize_grads=True)), strict=True))
    _, peer = dynet_peer.build_peer(dy, name, {k: v.detach().numpy()
                                               for k, v in params.items()})
    loss = dynet_peer.PEERS[name](dy, peer, wl.hidden_dim, instances)  # type: ignore[attr-defined]
    assert loss.value() == pytest.approx(float(ref.detach()), rel=1e-4)
    loss.backward()
    assert_dynet_grads(peer, want, f"{name}: ")


# ---------------------------------------------------------------------- the harness
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("dynet") is None, reason="DyNet not installed")
def test_harness_runs_every_peer_and_every_loss_matches(tmp_path: Path) -> None:
    from benchmarks import throughput as tp

    results = tp.main(["--workloads", *NAMES, "--sizes", "8x6", "--minibatches", "1",
                       "--repeats", "1", "--warmup", "0", "--modes", "infer", "train",
                       "--contenders", "depth", "dynet_agenda", "pytorch_hand",
                       "pytorch_unbatched", "unbatched", "dynet_autobatch1",
                       "dynet_autobatch2", "--out", str(tmp_path / "out.json"),
                       "--plot", str(tmp_path / "out.png")])
    assert not results["dynet_errors"], results["dynet_errors"]
    rows = {(r["workload"], r["contender"], r["mode"]): r for r in results["rows"]}
    for name in NAMES:
        for mode in ("infer", "train"):
            for contender in ("dynet_agenda", "pytorch_hand", "pytorch_unbatched",
                              "dynet_autobatch1", "dynet_autobatch2"):
                row = rows[name, contender, mode]
                assert row["loss_match"] is True, (name, contender, mode)
                assert row["items"] == 64 and row["total_ms"] > 0
