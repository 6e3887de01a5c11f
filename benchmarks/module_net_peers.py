"""Peers of the CLEVR module network (``module_net``) on the workload's own parameters.

    nice -n 5 python benchmarks/module_net_peers.py --minibatches 4 --rounds 1

Same equations (:mod:`edbatch.workloads.module_net`), parameters (the dict of
:func:`edbatch.executor.init_params`, read by name) and loss (the summed cross-entropy):

* :func:`unbatched_loss` (:mod:`benchmarks._module_net_models`, as is the next):
  **unbatched per-instance PyTorch**, one question and one module call at a time (the loop
  Suarez et al. divide by).
* :func:`suarez_loss`: **Suarez et al.'s depth-and-module batching**: a program node's depth
  is one more than its deepest input; all nodes of one module type at one depth, across the
  mini-batch, run as one call; the objects of every scene and the answer classifier are one
  call each.
* edbatch: the workload's mini-batch graph (each question's graph built once, merged per
  mini-batch: :meth:`~edbatch.workloads.base.Workload.minibatch`, as
  ``experiments.train_module_net`` does) through its heuristics and ``auto``
  (:class:`~edbatch.executor.auto.AutoBatching`), ``TorchExecutor``, training mode.
* ``dynet_autobatch1`` (DyNet's agenda) and ``dynet_autobatch2`` (by depth), ``--dynet
  1 2``: :mod:`benchmarks.peers.dynet.module_net` in a ``dynet_peer.py --serve`` worker
  each (DyNet fixes its autobatch mode per process), timed one mini-batch per request
  between the others (the worker's own construction, forward, backward and update, learning
  rate 0), loaded with the same parameters (an ``.npz``); ``--dynet`` with nothing skips them.
* ``floor``: the same mini-batch's GEMMs alone (forward ``X W^T``, backward ``dY W`` and
  one ``dY^T X`` per weight; shapes of the ``critical_path`` schedule's batches, rows =
  batch size, on the model's weights, as ``benchmarks/throughput.py``'s floor:
  :mod:`benchmarks._gemm_floor`);
  every row's ``xfloor`` is its time over the floor's.
* ``--policy PATH`` adds a learned artifact (``experiments.train``'s ``policy.json``: FSM,
  priority or distilled priority FSM) as ``edbatch/learned``: its run-time scheduler (no
  lookahead, whatever the artifact's ``lookahead`` says). ``--split test`` draws the
  mini-batches from questions no policy was trained on; ``--hidden-dim 64`` with small
  cells is where the per-batch cost dominates.
* ``--unfused`` adds ``edbatch/critical_path/unfused``: the same run with the compiled cell
  bodies off (``TorchExecutor(fused=False)``: ``relate`` as its torch body), the before of
  an interleaved before/after; ``--only NAME ...`` keeps only those contenders (the first
  one kept is then the loss reference, else the unbatched loop).
* ``--clock cpu`` times the in-process contenders in this thread's CPU time
  (``time.thread_time``), which the other processes of a loaded machine do not inflate
  (the floor included; not with DyNet, whose workers time themselves in wall-clock time).

:func:`main` interleaves them on reshuffled training mini-batches (1 thread; every
contender runs forward and backward on the same mini-batch, in a shuffled order), checks
that their losses agree and prints batches (kernel calls of modules) and milliseconds per
mini-batch (medians over the counted mini-batches). Only the run, not its numbers, is
checked here (timing under load means little).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch import Tensor

from benchmarks import _args
from benchmarks._dynet_server import DynetServer
from benchmarks._module_net_models import suarez_loss, unbatched_loss
from benchmarks._throughput_data import GemmFloor, gemm_shapes
from edbatch.executor import init_params
from edbatch.executor.auto import AutoBatching, make_candidates
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads.module_net import ModuleNet, QuestionInstance

__all__ = ["main", "suarez_loss", "unbatched_loss"]

HEURISTICS = ("depth", "dynet_agenda", "typewise_greedy", "critical_path")


def _edbatch(workload: ModuleNet, insts: Sequence[QuestionInstance],
             params: Mapping[str, Tensor], scheduler: object, strategy: str,
             executor: TorchExecutor) -> tuple[Tensor, int]:
    graph = workload.minibatch(insts[0].split, [i.index for i in insts])
    schedule = scheduler(graph)  # type: ignore[operator]
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    result = executor.run(graph, schedule, plan, params, grad=True)
    assert result.loss is not None
    return result.loss, schedule.num_batches


@dataclass
class _Context:
    workload: ModuleNet
    executor: TorchExecutor
    unfused: TorchExecutor
    auto: AutoBatching
    schedulers: dict[str, Any]
    dynet: dict[str, DynetServer]
    split: str = "train"


def _dynet_workers(args: argparse.Namespace, params: Mapping[str, Tensor], folder: str
                   ) -> dict[str, DynetServer]:
    """One serving DyNet worker per ``--dynet`` autobatch mode, on ``params``."""
    root = Path(__file__).resolve().parents[1]
    path = Path(folder) / "params.npz"
    np.savez(path, **{k: v.detach().numpy() for k, v in params.items()})  # type: ignore[arg-type]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = {}
    for mode in args.dynet:
        cmd = [sys.executable, str(root / "benchmarks" / "dynet_peer.py"), "--workload",
               "module_net", "--embed", str(ModuleNet(hidden_dim=1).embed_dim), "--hidden",
               str(args.hidden_dim), "--autobatch", str(mode), "--minibatches", "1",
               "--params", str(path), "--modes", "train", "--mem", "1024", "--serve",
               "--preload-split", args.split]
        out[f"dynet_autobatch{mode}"] = DynetServer(cmd, env, root)
    return out


def _step(name: str, insts: Sequence[QuestionInstance], params: Mapping[str, Tensor],
          ctx: _Context, counted: bool) -> tuple[float, int, float | None]:
    """One contender's forward and backward on a mini-batch: ``(loss, batches, seconds)``
    (``seconds`` as the DyNet worker timed itself, else ``None``: the caller's clock)."""
    if name in ctx.dynet:
        phases, value = ctx.dynet[name].run("train", 0, [i.index for i in insts], ctx.split)
        return value, -1, sum(v for k, v in phases.items() if k in (
            "construction", "forward", "backward", "update"))
    if name == "unbatched":
        loss, batches = unbatched_loss(insts, params)
    elif name == "suarez":
        loss, batches = suarez_loss(insts, params)
    elif name == "auto" and counted:  # timed by auto itself while it decides
        with ctx.auto.timed() as cand:
            loss, batches = _edbatch(ctx.workload, insts, params, cand.scheduler,
                                     cand.strategy, ctx.executor)
            loss.backward()
    else:
        sched = ctx.auto.current().scheduler if name == "auto" else \
            ctx.schedulers[name.split("/")[1]]
        executor = ctx.unfused if name.endswith("/unfused") else ctx.executor
        loss, batches = _edbatch(ctx.workload, insts, params, sched, "aligned", executor)
    if name != "auto" or not counted:
        loss.backward()
    for p in params.values():
        p.grad = None
    return float(loss.detach()), batches, None


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Interleave the contenders; print and return batches, median ms per mini-batch, the
    speed-up over the unbatched loop and the multiple of the GEMM floor."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--minibatches", type=int, default=8, help="per round")
    ap.add_argument("--rounds", type=int, default=1, help="reshuffles of the training set")
    ap.add_argument("--warmup", type=int, default=1,
                    help="first mini-batches run by every contender but not counted "
                         "(numba compilation, allocator)")
    ap.add_argument("--hidden-dim", type=int, default=64)
    ap.add_argument("--seed", type=_args.seed, default=0)
    ap.add_argument("--policy", default=None,
                    help="a learned FSM or priority artifact (policy.json): contender "
                         "edbatch/learned")
    ap.add_argument("--split", default="train", help="questions to draw mini-batches from")
    ap.add_argument("--unfused", action="store_true",
                    help="add edbatch/critical_path/unfused (compiled cell bodies off)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="contenders to keep (names as printed, e.g. edbatch/learned)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time contenders in wall-clock or this thread's CPU time")
    ap.add_argument("--dynet", type=int, nargs="*", choices=(1, 2),
                    default=[1] if importlib.util.find_spec("dynet") else [],
                    help="DyNet autobatch modes to run (1 agenda, 2 depth; none: no DyNet)")
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.dynet:
        ap.error(f"--clock cpu cannot time the DyNet workers (--dynet {args.dynet}: they time "
                 f"themselves in wall-clock time); pass --dynet with no mode, or --clock wall")
    torch.set_num_threads(1)
    workload = ModuleNet(hidden_dim=args.hidden_dim)
    params = init_params(workload, torch.Generator().manual_seed(args.seed))
    for p in params.values():
        p.requires_grad_(True)
    train = workload.load(args.split)
    need = (args.minibatches + args.warmup - 1) * args.batch_size + 1  # the last may be short
    if need > len(train):
        ap.error(f"--minibatches {args.minibatches} (+ --warmup {args.warmup}) x --batch-size "
                 f"{args.batch_size} needs over {need - 1} questions; --split {args.split} has "
                 f"{len(train)}: lower --minibatches or raise --rounds (each reshuffles)")
    for i in range(len(train)):  # each question's graph, built once (as the trainer does)
        workload.instance_graph(args.split, i)
    auto = AutoBatching(make_candidates(), trials=1)
    heuristics = list(HEURISTICS)
    with tempfile.TemporaryDirectory(prefix="module_net_peers-") as folder:
        ctx = _Context(workload, TorchExecutor("cpu"), TorchExecutor("cpu", fused=False), auto,
                       {h: make_scheduler(h) for h in HEURISTICS},
                       _dynet_workers(args, params, folder), args.split)
        try:
            if args.policy:
                from policies.fsm import FSMPolicy  # benchmarks may import every layer
                from policies.user import load_policy
                policy = load_policy(args.policy)
                if isinstance(policy, FSMPolicy):  # its table names this vocabulary's types
                    policy = FSMPolicy.load(args.policy, workload.vocab)
                ctx.schedulers["learned"] = policy.runtime_scheduler("learned")
                heuristics.append("learned")
            stats = _interleave(args, train, params, ctx, heuristics)
        finally:
            for server in ctx.dynet.values():
                server.close()
    return _report(stats, auto)


def _interleave(args: argparse.Namespace, train: Sequence[QuestionInstance],
                params: Mapping[str, Tensor], ctx: _Context, heuristics: Sequence[str]
                ) -> dict[str, list[tuple[int, float]]]:
    """Every contender on every mini-batch, in a shuffled order; losses checked."""
    rng, order_rng = np.random.default_rng(args.seed), random.Random(args.seed)
    gen, shapes = torch.Generator().manual_seed(args.seed), ctx.workload.param_shapes()
    stats: dict[str, list[tuple[int, float]]] = defaultdict(list)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    for r in range(args.rounds):
        perm = rng.permutation(len(train))
        for m in range(args.minibatches + (args.warmup if r == 0 else 0)):
            counted = r > 0 or m >= args.warmup
            insts = [train[i] for i in perm[m * args.batch_size:(m + 1) * args.batch_size]]
            graph = ctx.workload.minibatch(args.split, [i.index for i in insts])
            floor = GemmFloor(gemm_shapes(graph, ctx.schedulers["critical_path"](graph),
                                          shapes, hoist=False), True, params, gen)
            names = ["unbatched", "suarez", *(f"edbatch/{h}" for h in heuristics), "auto",
                     *ctx.dynet, "floor"]
            if args.unfused:
                names.append("edbatch/critical_path/unfused")
            if args.only is not None:
                names = [n for n in names if n in args.only]
            reference = "unbatched" if "unbatched" in names else next(
                n for n in names if n != "floor")
            order_rng.shuffle(names)
            losses = {}
            for name in names:
                start = clock()
                if name == "floor":
                    seconds: float | None = sum(floor.run().values())
                    if args.clock == "cpu":
                        seconds = None
                    loss, batches = float("nan"), -1
                else:
                    loss, batches, seconds = _step(name, insts, params, ctx, counted)
                    losses[name] = loss
                if counted:
                    stats[name].append((batches, seconds if seconds is not None
                                        else clock() - start))
            ref = losses[reference]
            bad = {k: v for k, v in losses.items() if abs(v - ref) > 1e-4 * abs(ref)}
            if bad:
                raise SystemExit(f"losses disagree with {reference} ({ref}): {bad}")
    return stats


def _report(stats: Mapping[str, list[tuple[int, float]]], auto: AutoBatching
            ) -> dict[str, dict[str, float]]:
    nan = [(0, float("nan"))]
    base = float(np.median([t for _, t in stats.get("unbatched", nan)]))
    floor = float(np.median([t for _, t in stats.get("floor", nan)]))
    out = {}
    print(f"{'contender':26s} {'batches':>8s} {'ms/minibatch':>13s} {'vs unbatched':>13s} "
          f"{'xfloor':>8s}")
    for name, rows in sorted(stats.items(), key=lambda kv: -np.median([t for _, t in kv[1]])):
        b, t = float(np.mean([r[0] for r in rows])), float(np.median([r[1] for r in rows]))
        out[name] = {"batches": b, "ms": 1e3 * t, "speedup": base / t, "floor_multiple":
                     t / floor}
        shown = f"{b:8.1f}" if b >= 0 else f"{'-':>8s}"
        print(f"{name:26s} {shown} {1e3 * t:13.1f} {base / t:12.2f}x {t / floor:8.1f}")
    print(f"auto: {auto.summary()['chosen']}; losses agree within 1e-4 on every mini-batch "
          f"(medians over {len(next(iter(stats.values())))} mini-batches; floor: the critical_path "
          f"schedule's GEMMs alone)")
    return out


if __name__ == "__main__":
    _args.run(main, sys.argv[1:])
