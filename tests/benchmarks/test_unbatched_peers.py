"""The per-instance PyTorch peers (``Unbatched`` of ``benchmarks/peers/<name>.py``, the
throughput benchmark's ``pytorch_unbatched`` contender) of ED-Batch's three workloads compute
the workload's loss and gradients: equal to edbatch's node-by-node reference executor on the
same instances and parameters (fp64)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from benchmarks.hand_batched import make_unbatched, unbatched_models
from benchmarks.peers import sized_workload
from edbatch.executor import init_params, reference_loss

__all__: list[str] = []

TOL = 1e-6


def _grads(loss: Tensor, params: dict[str, Tensor]) -> list[Tensor]:
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.to_dense() if g.is_sparse else g
            for g, p in zip(grads, params.values(), strict=True)]


@pytest.mark.parametrize("name, split, start", [
    ("tree_lstm", "train", 0), ("tree_lstm", "test", 100), ("lattice_lstm", "train", 0),
    ("lattice_lstm", "test", 20), ("bilstm_tagger", "train", 0), ("bilstm_tagger", "dev", 7)])
def test_unbatched_peer_equals_the_reference_fp64(name: str, split: str, start: int) -> None:
    wl = sized_workload(name, 6, 5)
    data = wl.load(split)
    instances = [data[i] for i in range(start, start + 6)]
    params = {k: v.requires_grad_(True) for k, v in init_params(
        wl, torch.Generator().manual_seed(2), dtype=torch.float64).items()}
    ref = reference_loss(wl.build_graph(instances), params)
    model = make_unbatched(wl, params)
    assert model is not None and name in unbatched_models()
    loss = model.loss(instances)
    torch.testing.assert_close(loss, ref, atol=TOL, rtol=TOL)
    for key, got, want in zip(params, _grads(loss, params), _grads(ref, params), strict=True):
        torch.testing.assert_close(got, want, atol=TOL, rtol=TOL, msg=f"gradient of {key}")
