"""examples/greedy_decode.py: greedy decoding with the seq2seq workload's cells, all
sentences batched; outputs identical to decoding each sentence alone, step by step, with
plain run() calls (the `.value()` way); one synchronisation per decoded position."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("greedy_decode",
                                                  ROOT / "examples" / "greedy_decode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_by_one(model, source: tuple[int, ...], steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Per sentence and step: record the whole prefix, run() it, read the logits."""
    out: list[int] = []
    prev = model.bos
    for _ in range(steps):
        with model.batch.instance():
            state = model.zero()
            for token in source:
                state = model.enc(state, attr=token)
            for token in [model.bos, *out]:
                state = model.dec(state, attr=token)
            logits = model.logits(state)
        prev = int(model.batch.run("depth", outputs=[logits], grad=False)[logits].argmax())
        out.append(prev)
        if prev == model.eos:
            break
    return out


def test_batched_greedy_decoding_equals_one_by_one() -> None:
    ex = _example()
    model = ex.Decoder(hidden=8, vocab_size=64)
    sources = [inst.source_ids for inst in model.wl.load("test")[:4]]
    steps = 5
    outputs, syncs = model.decode(sources, steps)
    want = [_one_by_one(model, s, steps) for s in sources]
    assert outputs == want
    assert syncs == max(len(o) for o in outputs)
