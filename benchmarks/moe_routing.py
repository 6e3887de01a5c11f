"""Top-2-of-8 MoE training step: routing in the per-sentence program against hand-vectorised
PyTorch.

``python benchmarks/moe_routing.py``: the model of ``examples/moe_routing.py`` on SST
sentences, one training step (forward, backward) per mini-batch, two contenders on the same
parameters, interleaved in a reshuffled order each repeat:

* ``edbatch``: :meth:`DynamicBatch.run_programs` with the routing decided in each sentence's
  program from the gate's values (one synchronisation per mini-batch);
* ``pytorch_hand``: the MoE a practitioner vectorises by hand: every token's embedding and
  gate at once, ``topk``, per expert the tokens routed to it (a boolean mask), one call each,
  the combination and the loss over the whole mini-batch.

Prints the median milliseconds per step of each and their ratio, after checking that both
compute the same loss (float64 check run first). Timings depend on the machine and its
load: report them with both.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch, not an installed one
    sys.path.insert(0, str(ROOT))


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("moe_routing_example",
                                                  ROOT / "examples" / "moe_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_loss(model: Any, chunk: list[tuple[list[int], int]]) -> Tensor:
    """The hand-vectorised MoE loss of a mini-batch (sum over tokens)."""
    words = torch.tensor([w for ws, _ in chunk for w in ws])
    labels = torch.tensor([y for ws, y in chunk for _ in ws])
    x = model.embed(words)
    probs = model.gate(x)
    top = probs.topk(2, dim=1).indices
    outs = [torch.zeros_like(x), torch.zeros_like(x)]
    for k, expert in enumerate(model.experts):
        for slot in (0, 1):
            mask = top[:, slot] == k
            if mask.any():
                outs[slot] = outs[slot].index_put((mask.nonzero()[:, 0],), expert(x[mask]))
    pa, pb = probs.gather(1, top[:, :1]), probs.gather(1, top[:, 1:])
    y = (pa * outs[0] + pb * outs[1]) / (pa + pb)
    return F.cross_entropy(model.classify.linear(y), labels, reduction="sum")


def api_loss(model: Any, chunk: list[tuple[list[int], int]], scheduler: str,
             strategy: str = "planned") -> Tensor:
    out = model.batch.run_programs([model.program(w, y) for w, y in chunk], scheduler,
                                   strategy=strategy)
    assert out.loss is not None
    return out.loss


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=64, help="sentences per mini-batch")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--scheduler", default="typewise_greedy")
    p.add_argument("--strategy", default="planned", help="memory strategy of the API runs")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    moe = _example()
    data, vocab = moe.sentences(args.sentences)
    torch.manual_seed(0)
    check = moe.MoE(vocab, dim=8, dtype=torch.float64)
    a, b = api_loss(check, data, args.scheduler).item(), hand_loss(check, data).item()
    assert abs(a - b) <= 1e-9 * abs(b), (a, b)
    model = moe.MoE(vocab, dim=args.dim)
    from edbatch.api import warmup
    warmup((args.scheduler,))
    runs = {"edbatch": lambda: api_loss(model, data, args.scheduler, args.strategy),
            "pytorch_hand": lambda: hand_loss(model, data)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    rng = np.random.default_rng(0)
    for _ in range(2):  # warm both
        for fn in runs.values():
            fn().backward()
    for _ in range(args.repeats):
        for name in rng.permutation(list(runs)):
            model.zero_grad()
            t0 = time.perf_counter()
            runs[name]().backward()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) * 1000 for name, t in times.items()}
    for name, ms in med.items():
        print(f"{name:>12}: {ms:8.2f} ms per training step ({len(data)} sentences, "
              f"{sum(len(w) for w, _ in data)} tokens)")
    print(f"pytorch_hand / edbatch: {med['pytorch_hand'] / med['edbatch']:.2f}x")
    return med


if __name__ == "__main__":
    main()
