"""examples/moe_routing.py: routing decided in the per-sentence code from the gate's values;
losses and gradients equal a per-token PyTorch reference in fp64, on SST sentences."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("moe_routing",
                                                  ROOT / "examples" / "moe_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scheduler", ["typewise_greedy", "depth"])
def test_moe_equals_per_token_reference(scheduler: str) -> None:
    moe = _example()
    data, vocab = moe.sentences(6)
    torch.manual_seed(0)
    model = moe.MoE(vocab, dim=6, dtype=torch.float64)
    out = model.batch.run_programs([model.program(w, y) for w, y in data], scheduler)
    assert out.syncs == 1  # one read of every sentence's gates, whatever the count
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref = torch.zeros((), dtype=torch.float64)
    for (w, y), routes in zip(data, out.returns, strict=True):
        loss, want = model.reference(w, y)
        assert routes == want
        ref = ref + loss
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-9)
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and "gate.linear.weight" in got
    for name, g in got.items():
        torch.testing.assert_close(g, want[name], rtol=1e-6, atol=1e-9, msg=name)
    # every expert is one op type: the tokens routed to it ran as one batch
    used = {r // 8 for rs in out.returns for r in rs} | {r % 8 for rs in out.returns for r in rs}
    last = out.segments[-1]
    ids = {last.graph.vocab.id(f"user.expert{k}") for k in used}
    assert sum(1 for b in last.schedule.batches if b.op_id in ids) == len(used)


@pytest.mark.slow  # ~20 s on the shared VM
def test_moe_example_trains() -> None:
    losses = _example().main(["--sentences", "32", "--batch-size", "16", "--epochs", "2"])
    assert losses[1] < losses[0]
