"""The timed passes of ``benchmarks/throughput.py``: one job per workload x size x mode, every
contender run on every mini-batch, interleaved (for each pass, each contender in turn, the
starting contender rotating from pass to pass), per-mini-batch medians summed into rows.

Contenders (see ``docs/benchmarks.md``):

* edbatch: ``unbatched``, ``depth``, ``dynet_agenda``, ``fsm``, ``fsm+aligned``,
  ``fsm+planned``, ``fsm+planned+memo`` (and ``fsm+memo+cugraph`` on CUDA), constructed
  through the public per-instance API (``--construction api``, default); ``fsm+fastbuild``
  builds with the workload's numpy builder instead; ``fsm+cse`` merges repeated leaves
  (:func:`~edbatch.graph.dedupe_leaves`), which no other contender does unless ``--cse``;
  every edbatch contender runs with the executor's default, input-projection hoisting
  where a cell has a hoisted form; ``fsm+unhoisted`` runs ``fsm``'s schedule without it
  (``TorchExecutor(hoist=False)``: the per-batch cells, the ablation); ``fsm+unfused`` runs
  it with the cells' element-wise parts as separate torch kernels (``TorchExecutor(fused=
  False)``; every other edbatch contender has the fused cell bodies, the default);
  ``fsm+unchained`` runs each hoisted LSTM batch of an inference run as its own call instead
  of one compiled call per run of them (:mod:`~edbatch.executor._fast_chain`, the default);
* ``pytorch_hand``: :mod:`benchmarks.hand_batched` (level by level / packed ``nn.LSTM``);
* ``pytorch_unbatched``: a workload's per-instance PyTorch model (``Unbatched`` of
  ``benchmarks/peers/<name>.py``), node by node, on the first ``--unbatched-minibatches``
  only, as edbatch's ``unbatched``;
* ``floor``: the GEMMs of the ``fsm`` schedule's program (hoisted, as ``fsm`` runs it) alone
  (:class:`~benchmarks._throughput_data.GemmFloor`);
* DyNet workers (``dynet_autobatch{0,1,2}``), interleaved through :class:`DynetServer`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from benchmarks._dynet_memory import dynet_peak_mb
from benchmarks._dynet_server import DynetServer, PeerServerError
from benchmarks._throughput_data import GemmFloor, peak_rss_mb
from benchmarks.hand_batched import HandBatched
from benchmarks.models_api import RECORDERS
from edbatch.api import AutoScheduler, DynamicBatch, memory_strategy, take_graph
from edbatch.executor import _fast_chain, reference_loss
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, dedupe_leaves
from edbatch.memory import Strategy, plan_memory
from edbatch.schedule import Schedule
from edbatch.workloads import Workload

__all__ = ["FLOOR", "GRAPHED", "HAND", "PHASES", "PT_UNBATCHED", "UNCHAINED", "UNFUSED",
           "UNHOISTED", "Job", "bench_job", "log"]

GRAPHED = "fsm+memo+cugraph"  # CUDA only
UNHOISTED = "fsm+unhoisted"  # fsm without the executor's input-projection hoisting
UNFUSED = "fsm+unfused"  # fsm with the cells' element-wise parts unfused (torch kernels)
UNCHAINED = "fsm+unchained"  # fsm with each hoisted LSTM batch its own call (no chains)
HAND = "pytorch_hand"
PT_UNBATCHED = "pytorch_unbatched"  # per-instance PyTorch (a workload's ``Unbatched`` peer)
SLOW = ("unbatched", PT_UNBATCHED)  # run on the first --unbatched-minibatches only
FLOOR = "floor"
PHASES = ("construction", "scheduling", "planning", "execution", "backward", "update")
PROFILE_KEYS = {"gather_ms": "exec/gather_seconds", "read_ms": "exec/read_seconds",
                "kernel_ms": "exec/kernel_seconds", "compile_ms": "exec/compile_seconds"}
STRATEGY: dict[str, Strategy] = {"fsm+aligned": "aligned",  # the others: "naive"
                                 "fsm+planned": "planned",
                                 "fsm+planned+memo": "planned", GRAPHED: "planned"}
MEMO = ("fsm+planned+memo", GRAPHED)  # schedules and plans reused across passes (by structure)
LR = 0.0  # the DyNet worker's default: every pass sees the same parameters


def log(msg: str) -> None:
    """A progress line on standard error (the tables go to standard output)."""
    import sys

    print(msg, file=sys.stderr, flush=True)


@dataclass
class Job:
    """One workload x size x mode: the mini-batch plan, parameters and every contender's
    machinery."""

    wl: Workload
    split: str
    plan: list[list[list[int]]]  # plan[r][k]: instance indices of mini-batch k of pass r
    params: dict[str, Tensor]
    train: bool
    schedulers: dict[str, Callable[[Graph], Schedule]]
    base: dict[str, Any]
    construction: str = "api"  # api | fastbuild | cached
    cse: bool = False
    device: str = "cpu"
    graphed: TorchExecutor | None = None
    peers: dict[str, DynetServer] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    dead: set[str] = field(default_factory=set)
    hand: HandBatched | None = None
    unbatched: HandBatched | None = None  # the pytorch_unbatched model
    floors: list[list[GemmFloor]] = field(default_factory=list)  # floors[r][k]
    api: DynamicBatch | None = None

    def instances(self, r: int, k: int) -> list[Any]:
        data = self.wl.load(self.split)
        return [data[i] for i in self.plan[r][k]]

    def sync(self) -> None:
        """Wait for the device (CUDA work is asynchronous; a phase ends when it is done)."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)


def _sgd_update(params: Iterable[Tensor], lr: float) -> None:
    """Plain SGD, ``p -= lr * grad`` then clear the gradient (as DyNet's SimpleSGDTrainer)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


class _Clock:
    """Lap timer: ``lap(phase)`` stores the seconds since the previous lap."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        start, self._t = self._t, time.perf_counter()
        self.times[phase] = self._t - start


def construct(job: Job, contender: str, r: int, k: int) -> Graph:
    """The mini-batch graph of pass ``r`` slot ``k`` as ``contender`` builds it."""
    how = "fastbuild" if contender.endswith("+fastbuild") else job.construction
    if how == "api":
        assert job.api is not None
        RECORDERS[job.wl.name](job.api, job.wl, job.instances(r, k))
        graph = take_graph(job.api)[0]
    elif how == "fastbuild":
        graph = job.wl.build_graph(job.instances(r, k))
    else:
        graph = job.wl.minibatch(job.split, job.plan[r][k])
    if (job.cse or contender.endswith("+cse")) and contender != "unbatched":
        graph = dedupe_leaves(graph)[0]
    return graph


def _pass(job: Job, contender: str, r: int, k: int, *, profile: bool = False
          ) -> tuple[dict[str, float], dict[str, float]]:
    """One mini-batch: phase seconds and info (loss, batches, executor stats)."""
    if contender == FLOOR:
        return job.floors[r][k].run(), {"loss": float("nan"),
                                        "gemms": float(job.floors[r][k].num_gemms)}
    with torch.set_grad_enabled(job.train):
        clock = _Clock()
        update: Iterable[Tensor] = job.params.values()
        if contender in (HAND, PT_UNBATCHED):
            model = job.hand if contender == HAND else job.unbatched
            assert model is not None
            prepared = model.prepare(job.instances(r, k))
            clock.lap("construction")
            loss = model.forward(prepared)
            job.sync()
            clock.lap("execution")
            info: dict[str, float] = {}
            update = model.parameters()
        else:
            graph = construct(job, contender, r, k)
            clock.lap("construction")
            if contender == "unbatched":
                loss = reference_loss(graph, job.params)
                job.sync()
                clock.lap("execution")
                info = {"batches": float(graph.num_nodes)}
            else:
                schedule = job.schedulers[contender](graph)
                clock.lap("scheduling")
                plan = plan_memory(graph, schedule, memory_strategy(  # auto: its candidate's
                    job.schedulers[contender], STRATEGY.get(contender, "naive")),
                    cache=contender in MEMO)
                clock.lap("planning")
                ex = job.graphed if contender == GRAPHED and not profile and job.graphed else \
                    TorchExecutor(job.device, profile=profile, sparse_grads=job.train,
                                  hoist=False if contender == UNHOISTED else None,
                                  fused=False if contender == UNFUSED else None)
                chained, _fast_chain.ENABLED[0] = _fast_chain.ENABLED[0], \
                    _fast_chain.ENABLED[0] and contender != UNCHAINED
                try:
                    res = ex.run(graph, schedule, plan, job.params, grad=job.train)
                finally:
                    _fast_chain.ENABLED[0] = chained
                clock.lap("execution")
                assert res.loss is not None
                loss = res.loss
                info = {"batches": float(schedule.num_batches), **res.stats}
        if job.train:
            loss.backward()
            job.sync()
            clock.lap("backward")
            _sgd_update(update, LR)
            job.sync()
            clock.lap("update")
        if isinstance(job.schedulers.get(contender), AutoScheduler):
            job.schedulers[contender].stop()  # type: ignore[attr-defined]  # its trial ends
    info["loss"] = float(loss.detach())
    return clock.times, info


def _peer_pass(job: Job, contender: str, r: int, k: int
               ) -> tuple[dict[str, float], dict[str, float]]:
    """One mini-batch pass of an interleaved DyNet worker; its ``forward`` (autobatch
    scheduling, gathers and kernels) is the execution phase."""
    phases, loss = job.peers[contender].run(job.base["mode"], k, job.plan[r][k], job.split)
    phases["execution"] = phases.pop("forward")
    info = {"loss": loss}
    for key in ("maxrss_mb", "rss_before_mb"):  # memory: see _peak_rss
        phases.pop(key, None)
    return phases, info


def _run_one(job: Job, c: str, r: int, k: int) -> tuple[dict[str, float], dict[str, float]]:
    return _peer_pass(job, c, r, k) if c in job.peers else _pass(job, c, r, k)


def bench_job(job: Job, contenders: Sequence[str], args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    """Time every contender on ``job``, passes interleaved (the first contender of each pass
    rotates); one row each. A DyNet worker that fails is recorded in ``job.errors`` and gets
    no row."""
    slots = len(job.plan[0])
    limit = args.unbatched_minibatches or slots
    counts = {c: min(limit, slots) if c in SLOW else slots for c in contenders}
    samples: dict[str, list[list[dict[str, float]]]] = {
        c: [[] for _ in range(n)] for c, n in counts.items()}
    infos: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
    failed = job.dead  # shared by both modes' jobs: a dead worker stays dead
    order = list(contenders)
    for r in range(args.warmup + args.repeats):
        t0 = dict.fromkeys(order, 0.0)
        for k in range(slots):
            turn = (r + k) % len(order)
            for c in order[turn:] + order[:turn]:  # every contender runs mini-batch k now
                if c in failed or k >= counts[c]:
                    continue
                start = time.perf_counter()
                try:
                    times, info = _run_one(job, c, r, k)
                except PeerServerError as e:
                    failed.add(c)
                    job.errors.append(f"{job.base['workload']} {job.base['size']} {c}: {e}")
                    log(job.errors[-1])
                    continue
                t0[c] += time.perf_counter() - start
                if r == 0:
                    infos[c].append(info)
                if r >= args.warmup:
                    samples[c][k].append(times)
        log(f"  {job.base['workload']} {job.base['size']} {job.base['mode']} pass "
             f"{r + 1}/{args.warmup + args.repeats}{' (warm-up)' if r < args.warmup else ''}: "
             + ", ".join(f"{c} {t:.2f}s" for c, t in t0.items() if c not in failed))
    kept = [c for c in contenders if c not in failed]
    # every profiled pass before any peak-RSS pass: the latter hands the heap back to the
    # OS (malloc_trim), and a pass right after it page-faults (read_ms up to 3x)
    profiles = {c: _profile(job, c, len(samples[c])) for c in kept if c not in job.peers}
    return [_row(job, c, samples[c], infos[c], profiles.get(c, {})) for c in kept]


def _profile(job: Job, contender: str, count: int) -> dict[str, float]:
    """Gather / kernel / compile ms from one extra profiled pass (if the executor can)."""
    if contender in (*SLOW, HAND, FLOOR):
        return {}
    out = dict.fromkeys(PROFILE_KEYS, 0.0)
    for k in range(count):
        _, info = _pass(job, contender, 0, k, profile=True)
        for col, key in PROFILE_KEYS.items():
            out[col] += 1e3 * info.get(key, 0.0)
    return out


def _peak_rss(job: Job, contender: str) -> float | None:
    """MB: one extra pass on the first mini-batch under :func:`peak_rss_mb`; for a DyNet
    worker, the same mini-batch in fresh workers whose pools show what they hold
    (:func:`benchmarks._dynet_memory.dynet_peak_mb`). ``None`` if unknown."""
    if contender in job.peers:
        try:
            mem = dynet_peak_mb(job.peers[contender], job.base["mode"], 0, job.plan[0][0],
                                job.split)
        except PeerServerError as e:
            job.errors.append(f"{job.base['workload']} {job.base['size']} {contender} "
                              f"memory probe: {e}")
            log(job.errors[-1])
            return None
        log(f"  {job.base['workload']} {job.base['size']} {job.base['mode']} {contender} "
             f"memory: {mem.peak_mb:.0f} MB (RSS growth {mem.grown_mb:.0f} MB, backward pool "
             f"{mem.backward_pool_mb} MB, {mem.trials} workers)")
        return mem.peak_mb
    grown = peak_rss_mb(lambda: _pass(job, contender, 0, 0))
    return None if math.isnan(grown) else grown


def _row(job: Job, contender: str, samples: list[list[dict[str, float]]],
         infos: list[dict[str, float]], profile: dict[str, float]) -> dict[str, Any]:
    """Sum over mini-batch slots of the per-slot median of each phase; ``profile``: the
    contender's :func:`_profile` columns."""
    n = len(samples)
    ms = {f"{p}_ms": 1e3 * sum(statistics.median(s.get(p, 0.0) for s in mb) for mb in samples)
          for p in PHASES}
    total = sum(ms.values())
    items = sum(len(b) for b in job.plan[-1][:n])
    all_items = sum(len(b) for b in job.plan[-1])
    overhead = ms["construction_ms"] + ms["scheduling_ms"] + ms["planning_ms"]
    framework = ("dynet" if contender in job.peers else "pytorch" if contender in (
        HAND, PT_UNBATCHED) else "floor" if contender == FLOOR else "edbatch")
    row = {**job.base, "contender": contender, "framework": framework, "minibatches": n,
           "items": items, "scale": all_items / items, **ms, "total_ms": total,
           "items_per_s": items / (total / 1e3), "overhead_share": overhead / total,
           "loss": infos[0]["loss"], "losses": [i["loss"] for i in infos],
           "peak_rss_mb": _peak_rss(job, contender)}
    if framework == "floor":
        row["gemms"] = int(sum(i["gemms"] for i in infos))
    if framework != "edbatch":
        return row
    row["batches"] = statistics.mean(i["batches"] for i in infos)
    if contender != "unbatched":
        row["gathers"] = int(sum(i.get("exec/num_gathers", 0.0) for i in infos))
        row.update(profile)
    return row
