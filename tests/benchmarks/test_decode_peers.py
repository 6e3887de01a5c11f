"""The decoding demonstrations' contenders (``benchmarks/decode_peers.py``) agree.

* greedy decoding: edbatch's ``run_programs`` and the hand-batched PyTorch decoder output
  exactly the tokens of the per-instance reference decoder (token by token, no batching),
  fp64; edbatch synchronises once per decoded position of the longest output;
* early exit: the same words read and classes as the per-instance reference, fp64; one
  synchronisation per word read by the longest reader;
* DyNet 2.2 (both styles, each in its own worker process) decides the same as the float32
  reference (slow: two DyNet processes).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import decode_peers as dp

__all__: list[str] = []


def _run(demo: dp.Demo, name: str, idx: list[int]) -> list[list[int]]:
    with torch.no_grad():
        return [list(x) for x in demo.contenders[name](idx)]


def test_greedy_outputs_equal_the_per_instance_decoder() -> None:
    demo, _ = dp.greedy_demo(hidden=8, vocab_size=64, max_len=20, max_steps=16, count=22,
                             dtype=torch.float64)
    idx = [9, 0, 21, 3, 1, 5]  # sources of 7, 20, 6, 20, 8, 17 tokens (capped at 20)
    want = _run(demo, "pytorch_unbatched", idx)
    limits = [min(16, 2 * len(demo.model.wl.load("test")[i].source_ids)) for i in idx]
    assert [len(o) for o in want] != [len(want[0])] * len(want)  # lengths differ
    assert all(len(o) <= n for o, n in zip(want, limits, strict=True))
    assert _run(demo, "pytorch_hand", idx) == want
    assert _run(demo, "edbatch", idx) == want
    assert demo.syncs == max(len(o) for o in want)  # one per position of the longest


def test_greedy_stops_at_end_of_sentence() -> None:
    demo, _ = dp.greedy_demo(hidden=8, vocab_size=64, max_len=8, max_steps=9, count=3,
                             dtype=torch.float64)
    model = demo.model
    with torch.no_grad():  # make </s> the argmax from the third step on: outputs end there
        model.params["seq2seq.out.b"][model.eos] += 0.5
        idx = [0, 1, 2]
        want = _run(demo, "pytorch_unbatched", idx)
        assert any(o[-1] == model.eos for o in want)
        assert _run(demo, "pytorch_hand", idx) == want
        assert _run(demo, "edbatch", idx) == want
    assert demo.syncs == max(len(o) for o in want)


def test_early_exit_decisions_equal_the_per_instance_reference() -> None:
    demo, _ = dp.early_exit_demo(dim=6, threshold=0.3, count=12, dtype=torch.float64)
    idx = list(range(demo.count))[::-1]
    want = _run(demo, "pytorch_unbatched", idx)
    reads = [r for r, _ in want]
    longest = max(len(demo.request([i])["sentences"][0]) for i in idx)
    assert min(reads) < max(reads) < longest  # exits vary, some before the last word
    assert _run(demo, "pytorch_hand", idx) == want
    assert _run(demo, "edbatch", idx) == want
    assert demo.syncs == max(reads)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit, match="--batch-size 0 must be >= 1"):
        dp.main(["--batch-size", "0"])


@pytest.mark.slow
def test_dynet_contenders_decide_as_the_reference() -> None:
    greedy, ids = dp.greedy_demo(hidden=8, vocab_size=64, max_len=8, max_steps=6, count=5)
    early, arrays = dp.early_exit_demo(dim=6, threshold=0.3, count=6)
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "p.npz"
        np.savez(params, **ids["arrays"], **arrays)
        for autobatch, style in ((0, "instance"), (1, "interleaved")):
            worker = dp.DynetWorker(params, autobatch, ids["bos"], ids["eos"], 0.3)
            try:
                for demo in (greedy, early):
                    idx = list(range(demo.count))
                    _, got = worker.ask(demo=demo.name, style=style, **demo.request(idx))
                    assert [list(x) for x in got] == _run(demo, "pytorch_unbatched", idx)
            finally:
                worker.close()
