"""The char tagger's unbatched per-instance and hand-batched PyTorch peers equal the
workload's node-by-node reference in fp64 (loss and gradients)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.peers.bilstm_char_tagger import HandBatched, Unbatched, unbatched_loss
from edbatch.executor import init_params, reference_loss
from edbatch.workloads import make_workload

TOL = 1e-6


@pytest.mark.parametrize("split, start", [("train", 0), ("test", 40)])
def test_unbatched_and_hand_batched_equal_the_reference_fp64(split: str, start: int) -> None:
    wl = make_workload("bilstm_char_tagger", embed_dim=6, hidden_dim=5, char_dim=4, mlp_dim=3)
    params = dict(init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64))
    instances = list(wl.load(split)[start:start + 5])
    assert sum(i.num_rare for i in instances) > 0
    ref = reference_loss(wl.build_graph(instances), params)
    got = unbatched_loss(instances, params)
    torch.testing.assert_close(got, ref, atol=TOL, rtol=TOL)
    names = list(params)
    for name, g, w in zip(names, torch.autograd.grad(got, list(params.values())),
                          torch.autograd.grad(ref, list(params.values())), strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=TOL, msg=name)
    hand = HandBatched(wl, params).loss(instances)
    torch.testing.assert_close(hand, ref, atol=TOL, rtol=TOL)
    torch.testing.assert_close(Unbatched(wl, params).loss(instances), ref, atol=TOL, rtol=TOL)
    # another parameter draw gives another loss: the comparison can fail
    other = dict(init_params(wl, torch.Generator().manual_seed(4), dtype=torch.float64))
    assert abs(float(unbatched_loss(instances, other).detach()) - float(ref.detach())) > 1e-3
