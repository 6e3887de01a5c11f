"""examples/early_exit.py: sentences stop reading when the classifier is confident; loss,
gradients and words read equal a per-sentence PyTorch reference (fp64); one
synchronisation per word position of the longest reading."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_early_exit_equals_per_sentence_reference() -> None:
    data, vocab = _load("moe_routing").sentences(8)
    torch.manual_seed(0)
    model = _load("early_exit").EarlyExit(vocab, dim=6, threshold=0.3, dtype=torch.float64)
    out = model.batch.run_programs([model.program(w, y) for w, y in data])
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref = torch.zeros((), dtype=torch.float64)
    for (w, y), read in zip(data, out.returns, strict=True):
        loss, want = model.reference(w, y)
        assert read == want
        ref = ref + loss
    assert min(out.returns) < max(out.returns) < max(len(w) for w, _ in data)  # exits vary
    assert out.syncs == max(out.returns)
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-9)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[name], p.grad, rtol=1e-6, atol=1e-9, msg=name)
