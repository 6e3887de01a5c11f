"""BiLSTM tagger execution only: ``fsm`` (hoisted: the executor's default), ``fsm+unhoisted``
and packed ``nn.LSTM``.

Mini-batches of 64 reshuffled train sentences (seeded permutation) are built, scheduled
(critical path: what the expert FSM writes down on the tagger) and planned (naive) before
any timing; each pass then runs every contender on every mini-batch, interleaved in one
process with a rotating first contender, and reports the median CPU time (and wall time)
per mini-batch of executor compile + forward (+ backward in ``train``). With
``--op-counts`` it instead counts the aten ops one run issues per mini-batch (compute ops
and view ops apart), which do not move with the machine's load. It asserts nothing.

    python benchmarks/bilstm_exec.py [--mode infer|train] [--size 300x150] [--repeats 5]
    python benchmarks/bilstm_exec.py --op-counts
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks import _args
from benchmarks.hand_batched import make_hand_batched
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload

VIEWS = {"slice", "select", "narrow", "as_strided", "view", "t", "transpose", "split",
         "split_with_sizes", "unsqueeze", "expand", "alias", "detach", "unbind", "reshape",
         "_reshape_alias", "permute", "squeeze", "chunk", "unsafe_split", "unsafe_chunk"}


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def contenders(size: str, train: bool, minibatches: int, seed: int
               ) -> dict[str, Callable[[int], float]]:
    embed, hidden = map(int, size.split("x"))
    wl = make_workload("bilstm_tagger", embed_dim=embed, hidden_dim=hidden)
    data = wl.load("train")
    perm = np.random.default_rng(seed).permutation(len(data))
    params = {k: p.detach().clone().requires_grad_(train) for k, p in
              init_params(wl, torch.Generator().manual_seed(0)).items()}
    hand = make_hand_batched(wl, params)
    assert hand is not None
    prepared = []
    for k in range(minibatches):
        instances = [data[i] for i in perm[64 * k:64 * (k + 1)]]
        graph = wl.build_graph(instances)
        schedule = make_scheduler("critical_path")(graph)
        prepared.append((graph, schedule, plan_memory(graph, schedule, "naive"),
                         hand.prepare(instances)))

    def finish(loss: torch.Tensor) -> float:
        if train:
            loss.backward()
        for p in list(params.values()) + hand.parameters():
            p.grad = None
        return float(loss.detach())

    def edbatch(hoist: bool) -> Callable[[int], float]:
        def run(k: int) -> float:
            graph, schedule, plan, _ = prepared[k]
            with torch.set_grad_enabled(train):
                res = TorchExecutor("cpu", sparse_grads=train, hoist=hoist).run(
                    graph, schedule, plan, params, grad=train)
                assert res.loss is not None
                return finish(res.loss)
        return run

    def packed(k: int) -> float:
        with torch.set_grad_enabled(train):
            return finish(hand.forward(prepared[k][3]))

    return {"fsm+unhoisted": edbatch(False), "fsm": edbatch(True), "pytorch_hand": packed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["infer", "train"], default="infer")
    parser.add_argument("--size", default="300x150", help="EMBEDxHIDDEN")
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--op-counts", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = contenders(args.size, args.mode == "train", args.minibatches, args.seed)
    n = args.minibatches
    if args.op_counts:
        for name, fn in runs.items():
            fn(0)  # first-use caches outside the count
            total: Counter[str] = Counter()
            for k in range(n):
                counter = _Count()
                with counter:
                    fn(k)
                total.update(counter.ops)
            views = sum(v for op, v in total.items() if op in VIEWS)
            copies = {op: total[op] / n for op in ("cat", "copy_", "index_select")}
            print(f"{args.mode} {name:13s} per mini-batch: compute ops "
                  f"{(sum(total.values()) - views) / n:.0f}, view ops {views / n:.0f}, {copies}")
        return
    names = list(runs)
    for fn in runs.values():
        fn(0)
    cpu: dict[str, list[float]] = {c: [] for c in names}
    wall: dict[str, list[float]] = {c: [] for c in names}
    losses: dict[str, list[float]] = {c: [] for c in names}
    for r in range(args.repeats):
        for k in range(n):
            turn = (r + k) % len(names)
            for c in names[turn:] + names[:turn]:
                t0, w0 = time.process_time(), time.perf_counter()
                loss = runs[c](k)
                cpu[c].append(time.process_time() - t0)
                wall[c].append(time.perf_counter() - w0)
                if r == 0:
                    losses[c].append(loss)
    print(f"{args.mode} {args.size}, load {os.getloadavg()}")
    hand = statistics.median(cpu["pytorch_hand"])
    for c in names:
        med = statistics.median(cpu[c])
        print(f"{c:13s} CPU ms per mini-batch {1e3 * med:7.1f} (x packed nn.LSTM "
              f"{med / hand:.2f}), wall {1e3 * statistics.median(wall[c]):7.1f}, first losses "
              f"{[round(v, 3) for v in losses[c][:2]]}")


if __name__ == "__main__":
    _args.run(main)
