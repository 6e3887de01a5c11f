"""MoE training step, routing inside the per-sentence program, against its peers.

``python benchmarks/moe_routing.py``: the ``moe`` workload's model (``examples/moe_routing.py``:
noisy top-2-of-8 gating, two MoE layers, UPOS tagging of EWT sentences) for one training
step (forward and backward, gate noise on) per mini-batch of 64 sentences, the contenders
on the same parameters, interleaved in a new random order on a freshly drawn (reshuffled)
mini-batch each repeat, one CPU thread:

* ``edbatch``: :meth:`DynamicBatch.run_programs`, the routing decided in each sentence's
  program from the gate's values (one synchronisation per layer);
* ``pytorch_hand``: the MoE a practitioner vectorises by hand: every token at once, ``topk``,
  per expert the (token, slot) pairs routed to it (one sort of the flat choices, then one
  ``index_select``, expert call and ``index_add`` per expert);
* ``per_token``: the per-instance loop (Suarez et al.'s baseline): each token alone through
  the same modules;
* ``dynet``: DyNet 2.2 (autobatch 1, the agenda) in a worker process, the sentences
  interleaved by hand in one graph, one ``dy.forward`` per layer before reading the gates
  (``benchmarks/_moe_dynet.py``; timed in the worker, its loss checked against the hand
  model's in float32). ``--no-dynet`` leaves it out.

Before timing, the three PyTorch losses and all gradients are checked equal in float64.
Printed: the median milliseconds per step of each (wall, then this process's CPU time), the
ratios, the *cell time* (Suarez's terms: seconds inside the cells' forward, ``gate``/
``expert``/``combine``/``classify`` modules, per-token loop against edbatch) and edbatch's
time by phase (recording, graph, schedule, memory plan, forward execution, reads; the rest
of its step is backward). Timings depend on the machine and its load: report them with both.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch, not an installed one
    sys.path.insert(0, str(ROOT))

from benchmarks import _args  # noqa: E402
from edbatch.workloads.moe import MoETagger  # noqa: E402

__all__ = ["hand_loss", "main", "per_token_loss"]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("moe_routing_example",
                                                  ROOT / "examples" / "moe_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_loss(model: Any, insts: Sequence[Any]) -> Tensor:
    """The hand-vectorised MoE loss of a mini-batch (sum over tokens)."""
    w = model.workload
    words = torch.tensor([x for i in insts for x in i.word_ids])
    tags = torch.tensor([t for i in insts for t in i.tag_ids])
    keys = torch.cat([w.keys(i) for i in insts])
    x = model.embed(words)
    token = torch.arange(len(words)).repeat_interleave(model.k)
    for lay in range(model.layers):
        h = model.gates[lay](x, keys[:, lay])
        top = h.topk(model.k, dim=1).indices
        gate = torch.softmax(h.gather(1, top), dim=1).reshape(-1)
        flat = top.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=model.experts).tolist()
        out = torch.zeros_like(x)
        for a, pairs in enumerate(torch.split(order, counts)):
            if len(pairs):
                rows = token[pairs]
                y = model.expert_nets[lay][a](x.index_select(0, rows))
                out = out.index_add(0, rows, gate[pairs, None] * y)
        x = x + out
    return F.cross_entropy(F.linear(x, model.classify.W, model.classify.b), tags,
                           reduction="sum")


def per_token_loss(model: Any, insts: Sequence[Any]) -> Tensor:
    """The per-instance loop: every token alone (``MoE.reference``)."""
    total = torch.zeros((), dtype=model.embed.weight.dtype)
    for inst in insts:
        total = total + model.reference(inst)[0]
    return total


def edbatch_loss(model: Any, insts: Sequence[Any], scheduler: str) -> Tensor:
    """The loss of ``run_programs`` (routing in the per-sentence program)."""
    out = model.run(insts, scheduler)
    model.last = out
    return out.loss  # type: ignore[no-any-return]


def _check(moe: Any, workload: MoETagger, insts: Sequence[Any], scheduler: str) -> float:
    """float64: the three losses and every gradient agree; returns the largest gradient
    difference relative to the per-token reference's largest entry."""
    model = moe.MoE(workload, dtype=torch.float64)
    grads, losses = [], []
    for fn in (lambda: edbatch_loss(model, insts, scheduler), lambda: hand_loss(model, insts),
               lambda: per_token_loss(model, insts)):
        model.zero_grad()
        loss = fn()
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.params().items()
                      if p.grad is not None})
    assert max(losses) - min(losses) <= 1e-9 * abs(losses[2]), losses
    worst = 0.0
    for g in grads[:2]:
        assert g.keys() == grads[2].keys()
        for n, ref in grads[2].items():
            scale = max(float(ref.abs().max()), 1e-12)
            worst = max(worst, float((g[n] - ref).abs().max()) / scale)
    assert worst <= 1e-6, worst
    return worst


def _dynet_server(model: Any, dim: int, check: Sequence[Any]) -> Any:
    """The DyNet worker on ``model``'s parameters, its float32 loss on ``check`` compared
    with the hand model's (printed; more than 1e-4 relative raises)."""
    import tempfile

    from benchmarks._dynet_server import DynetServer
    from benchmarks.dynet_peer import save_params
    folder = tempfile.mkdtemp(prefix="moe_dynet_")
    path = save_params(Path(folder) / "params.npz", model.params())
    cmd = [sys.executable, str(ROOT / "benchmarks" / "_moe_dynet.py"), "--params", str(path),
           "--dim", str(dim), "--noise-round", str(model.workload.noise_round),
           "--max-sentences", str(model.workload.max_sentences or 0)]
    server = DynetServer(cmd, {**os.environ, "PYTHONPATH": str(ROOT)}, ROOT)
    _, got = server.run("train", 0, [i.index for i in check], "train")
    with torch.no_grad():
        want = hand_loss(model, check).item()
    rel = abs(got - want) / abs(want)
    print(f"dynet check: loss {got:.6f} against the hand model's {want:.6f} "
          f"(relative {rel:.1e}, float32)")
    if rel > 1e-4:
        server.close()
        raise AssertionError(f"the DyNet peer's loss {got} differs from {want}")
    return server


def _general(model: Any, fn: Callable[[], Tensor]) -> Tensor:
    """``fn()`` with typed segments switched off (:data:`edbatch.api._typed.TYPED`); the
    phases printed stay the typed run's (``model.last``)."""
    from edbatch.api import _typed
    last, _typed.TYPED = getattr(model, "last", None), False
    try:
        return fn()
    finally:
        _typed.TYPED, model.last = True, last


def _timed(name: str, fn: Callable[[list[Any]], Any], chunk: list[Any],
           times: dict[str, list[float]], cpus: dict[str, list[float]]) -> None:
    """Append the seconds of one training step of contender ``name``, wall to ``times``
    and CPU (this process's, one thread) to ``cpus``; DyNet's: its phases' wall time in
    the worker, no CPU time."""
    if name == "dynet":
        times[name].append(float(sum(fn(chunk).values())))
        return
    t0, c0 = time.perf_counter(), time.process_time()
    fn(chunk).backward()
    times[name].append(time.perf_counter() - t0)
    cpus.setdefault(name, []).append(time.process_time() - c0)


def _cell_times(model: Any, chunk: list[Any], runs: Mapping[str, Any],
                cells: dict[str, list[float]], scheduler: str) -> None:
    """Append the cell time (forward inside the cells, no grad) of edbatch and the
    per-token loop on ``chunk`` (those of them in ``runs``)."""
    for name in cells:
        if name in runs:
            with torch.no_grad():
                clock = CellClock(model)
                if name == "edbatch":
                    model.run(chunk, scheduler, grad=False)
                else:
                    per_token_loss(model, chunk)
                clock.remove()
            cells[name].append(clock.total)


class CellClock:
    """Seconds inside the forward of the model's cell modules (Suarez's cell time)."""

    def __init__(self, model: Any) -> None:
        self.total, self._start = 0.0, 0.0
        modules = [*model.gates, *[e for row in model.expert_nets for e in row],
                   model.combiner, model.classify]
        self.handles = []
        for m in modules:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def _post(self, *args: Any) -> None:
        self.total += time.perf_counter() - self._start

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _ratios(med: dict[str, float], what: str = "") -> dict[str, float]:
    """The medians with edbatch's speed relative to the hand model (printed)."""
    out = dict(med)
    out["hand_over_edbatch"] = med["pytorch_hand"] / med["edbatch"]
    print(f"{what}edbatch speed relative to pytorch_hand: {out['hand_over_edbatch']:.2f}x")
    if "edbatch_general" in med:
        out["hand_over_general"] = med["pytorch_hand"] / med["edbatch_general"]
        print(f"{what}edbatch_general (typed segments off) relative to pytorch_hand: "
              f"{out['hand_over_general']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=64, help="sentences per mini-batch")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--scheduler", default="typewise_greedy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-per-token", action="store_true", help="skip the slow per-token loop")
    p.add_argument("--general", action="store_true",
                   help="also time edbatch_general: typed segments off (the scheduler, memory "
                        "planner and compiled reads for every segment), interleaved")
    p.add_argument("--dynet", action=argparse.BooleanOptionalAction,
                   default=importlib.util.find_spec("dynet") is not None,
                   help="time the DyNet 2.2 peer (default: when dynet is installed)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    moe = _example()
    workload = MoETagger(dim=args.dim, expert_dim=args.dim)
    pool = list(workload.load("train"))
    workload.set_noise_round(1)
    small = MoETagger(dim=8, expert_dim=8, max_sentences=16)
    small.set_noise_round(1)
    worst = _check(moe, small, small.load("train"), args.scheduler)
    print(f"float64 check: losses equal, gradients within {worst:.1e} (relative)")
    model = moe.MoE(workload)
    from edbatch.api import warmup
    warmup((args.scheduler,))
    rng = np.random.default_rng(0)
    runs: dict[str, Callable[[list[Any]], Any]] = {
        "edbatch": lambda b: edbatch_loss(model, b, args.scheduler),
        "pytorch_hand": lambda b: hand_loss(model, b)}
    if args.general:
        runs["edbatch_general"] = lambda b: _general(model, lambda: edbatch_loss(
            model, b, args.scheduler))
    if not args.no_per_token:
        runs["per_token"] = lambda b: per_token_loss(model, b)
    first = [pool[int(i)] for i in rng.choice(len(pool), args.sentences, replace=False)]
    server = _dynet_server(model, args.dim, first) if args.dynet else None
    if server is not None:
        runs["dynet"] = lambda b: server.run("train", 0, [i.index for i in b], "train")[0]
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {}
    cells: dict[str, list[float]] = {"edbatch": [], "per_token": []}
    phases: dict[str, list[float]] = {}
    for name, fn in runs.items():  # warm every path
        if name != "dynet":
            fn(first).backward()
    for _ in range(args.repeats):
        chunk = [pool[int(i)] for i in rng.choice(len(pool), args.sentences, replace=False)]
        for name in rng.permutation(list(runs)):
            model.zero_grad()
            _timed(name, runs[name], chunk, times, cpus)
        _cell_times(model, chunk, runs, cells, args.scheduler)
        for key, sec in model.last.seconds.items():
            phases.setdefault(key, []).append(sec)
    med = {name: statistics.median(t) * 1000 for name, t in times.items()}
    tokens = sum(len(i) for i in first)
    load = os.getloadavg()[0]
    print(f"{args.sentences} sentences per mini-batch (~{tokens} tokens), dim {args.dim}, "
          f"{workload.experts} experts, top {workload.top_k}, {workload.layers} layers, "
          f"{args.threads} thread(s), load average {load:.1f}")
    for name, ms in med.items():
        print(f"{name:>12}: {ms:8.2f} ms per training step (median of {args.repeats})")
    out = _ratios(med)
    cpu = {name: statistics.median(t) * 1000 for name, t in cpus.items()}
    print("CPU time (process, median ms): " + ", ".join(f"{n} {ms:.2f}" for n, ms in cpu.items()))
    cpu_ratios = _ratios(cpu, "CPU time: ")
    out.update({f"cpu_{k}": v for k, v in cpu_ratios.items()})
    if "dynet" in med:
        out["dynet_over_edbatch"] = med["dynet"] / med["edbatch"]
        print(f"edbatch speed relative to dynet: {out['dynet_over_edbatch']:.2f}x")
        server.close()  # type: ignore[union-attr]
    if "per_token" in med:
        out["per_token_over_edbatch"] = med["per_token"] / med["edbatch"]
        c_pt, c_ed = statistics.median(cells["per_token"]), statistics.median(cells["edbatch"])
        out["cell_speedup"] = c_pt / c_ed
        print(f"end to end over the per-token loop: {out['per_token_over_edbatch']:.1f}x; "
              f"cell time (forward inside the cells) {c_pt * 1000:.1f} ms per-token loop vs "
              f"{c_ed * 1000:.2f} ms edbatch: {out['cell_speedup']:.0f}x")
    print("edbatch phases (ms, median): " + ", ".join(
        f"{k} {statistics.median(v) * 1000:.2f}" for k, v in phases.items())
        + "; the rest of the step is backward")
    out["load"] = load
    return out


if __name__ == "__main__":
    _args.run(main)
