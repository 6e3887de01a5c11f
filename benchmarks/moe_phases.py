"""Where a MoE training step's CPU time goes: edbatch's routing-in-the-program model against
the hand-vectorised MoE, phase by phase, on the same reshuffled mini-batches.

``python benchmarks/moe_phases.py``: the two contenders of ``benchmarks/moe_routing.py``
(same model, parameters and losses; 64 sentences, D 64, one thread), interleaved in a new
random order on a freshly drawn mini-batch each repeat, each step timed in this process's
CPU time (``time.process_time``: less load-sensitive than wall) as forward, backward and an
Adam step. edbatch's forward is split further, in CPU time too (timers around
``_Runner.run``, ``typed_program`` and ``run_typed``): recording and values handed back
(the programs' Python, the rounds' loop and reads: the forward less its segments), each
segment's arrays and round plan, typed planning, and the segments' kernels. The autograd
graph of one step (nodes, by type) is counted for both. Printed: medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch, not an installed one
    sys.path.insert(0, str(ROOT))

from benchmarks import _args  # noqa: E402
from benchmarks.moe_routing import _example, edbatch_loss, hand_loss  # noqa: E402
from edbatch.api import _programs, _segments, warmup  # noqa: E402
from edbatch.workloads.moe import MoETagger  # noqa: E402

__all__ = ["autograd_nodes", "main"]


def autograd_nodes(loss: Tensor) -> Counter[str]:
    """The nodes of ``loss``'s autograd graph, counted by type."""
    seen, stack, out = set(), [loss.grad_fn], Counter[str]()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        out[type(node).__name__] += 1
        stack.extend(n for n, _ in node.next_functions)
    return out


class _Timers:
    """CPU seconds inside ``_Runner.run`` (a segment), ``typed_program`` and ``run_typed``
    (patched while it lives)."""

    WHERE = ((_segments, "typed_program", "plan"), (_segments, "run_typed", "kernels"),
             (_programs._Runner, "run", "segments"))

    def __init__(self) -> None:
        self.seconds = {key: 0.0 for _, _, key in self.WHERE}
        self.saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self.WHERE]
        for (owner, name, key), (_, _, fn) in zip(self.WHERE, self.saved, strict=True):
            setattr(owner, name, self._timed(fn, key))

    def _timed(self, fn: Any, key: str) -> Any:
        def run(*args: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args)
            finally:
                self.seconds[key] += time.process_time() - t0
        return run

    def restore(self) -> None:
        for owner, name, fn in self.saved:
            setattr(owner, name, fn)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--scheduler", default="typewise_greedy")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    workload = MoETagger(dim=args.dim, expert_dim=args.dim)
    pool = list(workload.load("train"))
    workload.set_noise_round(1)
    model = _example().MoE(workload)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    warmup((args.scheduler,))
    timers, rng, clock = _Timers(), np.random.default_rng(1), time.process_time
    steps: dict[str, dict[str, list[float]]] = {"edbatch": {}, "pytorch_hand": {}}
    nodes: dict[str, Counter[str]] = {}
    try:
        for r in range(args.repeats + 3):  # (3 to warm)
            for name in rng.permutation(list(steps)):
                chunk = [pool[int(i)] for i in rng.choice(len(pool), args.sentences,
                                                          replace=False)]
                opt.zero_grad()
                timers.seconds.update(plan=0.0, kernels=0.0, segments=0.0)
                t0 = clock()
                loss = edbatch_loss(model, chunk, args.scheduler) if name == "edbatch" \
                    else hand_loss(model, chunk)
                t1 = clock()
                nodes.setdefault(name, autograd_nodes(loss))
                t2 = clock()
                loss.backward()
                t3 = clock()
                opt.step()
                t4 = clock()
                if r < 3:
                    continue
                got = {"step": t1 - t0 + t4 - t2, "forward": t1 - t0, "backward": t3 - t2,
                       "optimizer": t4 - t3}
                if name == "edbatch":
                    seg = timers.seconds
                    got |= {"  recording, hand-back": t1 - t0 - seg["segments"],
                            "  arrays, round plans": seg["segments"] - seg["plan"]
                            - seg["kernels"],
                            "  typed planning": seg["plan"], "  kernels": seg["kernels"]}
                for key, value in got.items():
                    steps[name].setdefault(key, []).append(value)
    finally:
        timers.restore()
    out = {name: {k: statistics.median(v) * 1000 for k, v in d.items()}
           for name, d in steps.items()}
    print(f"{args.sentences} sentences, dim {args.dim}, 1 thread, CPU ms, median of "
          f"{args.repeats} interleaved")
    for name, med in out.items():
        print(f"{name}:")
        for key, ms in med.items():
            print(f"   {key:28s} {ms:8.2f}")
        print(f"   autograd nodes {sum(nodes[name].values())}: " + ", ".join(
            f"{k} {c}" for k, c in nodes[name].most_common(6)))
    return out


if __name__ == "__main__":
    _args.run(main)
