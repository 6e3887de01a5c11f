"""The DyNet peer of the MoE benchmark (``benchmarks/_moe_dynet.py``): its numpy gate noise
equals the workload's, and its training step's loss equals the hand-vectorised model's
(float32; slow: a DyNet worker process)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from benchmarks._moe_dynet import gate_noise
from edbatch.workloads._moe_math import gate_noise as torch_noise

__all__: list[str] = []


def test_numpy_gate_noise_equals_the_workloads() -> None:
    keys = np.array([0, 1, 17, 2 ** 31 + 5, 2 ** 40 + 3, 123456789012], dtype=np.int64)
    got = gate_noise(keys, 8)
    want = torch_noise(torch.from_numpy(keys), 8).numpy()
    assert got.shape == want.shape == (6, 8) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("dynet") is None, reason="dynet not installed")
def test_dynet_step_loss_equals_the_hand_model(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import moe_routing as bench
    from edbatch.workloads.moe import MoETagger

    workload = MoETagger(dim=8, expert_dim=8, max_sentences=12)
    workload.set_noise_round(1)
    model = bench._example().MoE(workload)
    insts = workload.load("train")
    server = bench._dynet_server(model, 8, insts)  # raises when the losses differ
    try:
        phases, loss = server.run("train", 0, [i.index for i in insts[:5]], "train")
    finally:
        server.close()
    with torch.no_grad():
        want = bench.hand_loss(model, insts[:5]).item()
    assert loss == pytest.approx(want, rel=1e-4)
    assert set(phases) == {"construction", "forward", "backward", "update"}
    assert "dynet check: loss" in capsys.readouterr().out
