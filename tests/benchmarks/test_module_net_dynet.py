"""The DyNet peer of the CLEVR module network (``benchmarks/peers/dynet/module_net.py``):
its loss and gradients (autobatch 1, backward through DyNet's batched kernels) equal the
workload's reference executor on the same parameters, and another draw of the parameters
gives another loss (the check can fail)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from edbatch.executor import init_params, reference_loss
from edbatch.workloads.module_net import ModuleNet
from tests.benchmarks.conftest import assert_dynet_grads

__all__: list[str] = []


def _params(wl: ModuleNet, seed: int) -> dict[str, torch.Tensor]:
    """``init_params`` moved off zero (non-zero biases and scalars exercise every term)."""
    p = init_params(wl, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for value in p.values():
            value.add_(0.1 * torch.randn(value.shape, generator=gen))
    return {k: v.requires_grad_(True) for k, v in p.items()}


def _dynet_loss(dy: Any, params: dict[str, torch.Tensor], insts: list[Any]) -> Any:
    from benchmarks import dynet_peer

    _, peer = dynet_peer.build_peer(dy, "module_net", {k: v.detach().numpy()
                                                      for k, v in params.items()})
    return peer, dynet_peer.PEERS["module_net"](dy, peer, 5, insts)


def test_dynet_loss_and_gradients_equal_the_reference(dy: Any) -> None:
    wl = ModuleNet(embed_dim=4, hidden_dim=5)
    insts = list(wl.load("val")[:12])
    params = _params(wl, 3)
    ref = reference_loss(wl.build_graph(insts), params).reshape(())
    want = dict(zip(params, torch.autograd.grad(ref, list(params.values()), allow_unused=True,
                                                materialize_grads=True), strict=True))
    peer, loss = _dynet_loss(dy, params, insts)
    assert loss.value() == pytest.approx(float(ref.detach()), rel=1e-4)
    loss.backward()
    assert_dynet_grads(peer, want, "")
    _, other = _dynet_loss(dy, _params(wl, 9), insts)
    assert abs(other.value() - float(ref.detach())) > 1e-3 * abs(float(ref.detach()))
