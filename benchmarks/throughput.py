"""Throughput benchmark: edbatch vs DyNet, inference and training items/s, side by side.

For every workload (cell granularity) x model size x mode (``infer``, ``train``) it runs, on
the first ``--minibatches`` mini-batches of 64 consecutive instances of the evaluation split,
with one CPU thread and the same parameter values (``init_params`` seeded with 0):

* edbatch ``unbatched``: node by node (:func:`~edbatch.executor.run_reference`); slow, so
  timed on the first ``--unbatched-minibatches`` mini-batches only and scaled to items/s;
* edbatch ``depth`` and ``dynet_agenda`` (the heuristics, naive memory), ``fsm`` (a learned
  FSM policy, naive memory), ``fsm+aligned`` (the same FSM, the one-pass ``aligned`` memory
  plan) and ``fsm+planned`` (the chain planner's ``planned`` memory), all cold: every
  mini-batch scheduled and planned from scratch;
* edbatch ``fsm+planned+memo``: the same, with schedules (:class:`MemoScheduler`) and plans
  (``plan_memory``'s memo) reused by graph structure, so after the warm-up pass a repeated
  mini-batch costs a hash (what a second epoch over the same mini-batches costs, not a
  shuffled one);
* on ``--device cuda`` also edbatch ``fsm+memo+cugraph``: ``fsm+planned+memo`` with one
  executor kept across passes that replays a CUDA graph captured for each mini-batch's shape
  (``TorchExecutor(cuda_graphs=True)``; in training, forward and backward graphs, with dense
  gradients, as sparse ones cannot be captured). On CUDA every
  timed phase ends with a device synchronisation, and DyNet (a CPU build) is skipped;
* DyNet with autobatch 0, 1 (agenda) and 2 (depth), one ``benchmarks/dynet_peer.py``
  subprocess per (workload, size, autobatch), if ``dynet`` is installed. By default each
  worker stays up (``--serve``, :mod:`benchmarks._dynet_server`) and its mini-batch passes
  are interleaved with edbatch's, in the same repeat loop and order, so every contender is
  timed in the same minutes (this VM's speed drifts by tens of percent over minutes, which
  moved DyNet-relative ratios by up to 0.7 when DyNet ran as a block). With
  ``--no-dynet-interleave`` each worker runs all its passes as one block, before and after
  the edbatch passes (``--dynet-runs 2``, the faster of the two runs counts) or after only.

Every edbatch pass constructs each mini-batch graph (``construction``: by default merging
the per-instance graphs that :meth:`Workload.minibatch` builds on first sight and caches,
the warm-up pass builds them; ``--construction fresh`` builds from the instances every pass,
the analogue of DyNet's expression construction; both include merging repeated leaves with
:func:`~edbatch.graph.dedupe_leaves` unless ``--no-cse``), schedules it, plans its memory
(no memo, except ``+memo``) and runs it with a fresh :class:`TorchExecutor` (``execution``;
plus ``backward`` and an SGD ``update`` with learning rate 0 in training, as the DyNet
worker's ``SimpleSGDTrainer``; training uses the cells' hand-written backwards where every
kernel has one and sparse embedding gradients, as DyNet updates only the lookup rows
read). Phases are medians over ``--repeats`` passes per mini-batch, summed over mini-batches.
The FSM is loaded from ``--policy-dir/<workload> .json`` or trained there first (edbatch's
learner with ``conf/trainer/q_learning.yaml`` and ``conf/policy/fsm.yaml``, seed 0), before
any timing. DyNet's per-mini-batch losses are
checked against edbatch's (``loss_match``). It asserts nothing about speed; it prints a
table per workload x size x mode, writes JSON and a PNG bar chart.

    python benchmarks/throughput.py [--workloads tree_lstm] [--sizes 300x150] \\
        [--modes infer train] [--minibatches 4] [--repeats 3] [--no-dynet] \\
        [--no-dynet-interleave] [--dynet-runs 1] \\
        [--out results/throughput.json] [--plot results/throughput.png]

Sizes are ``EMBEDxHIDDEN`` strings (any positive pair, e.g. ``8x6`` for a quick check).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks._dynet_server import DynetServer, PeerServerError
from edbatch.executor import init_params, reference_loss
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, dedupe_leaves
from edbatch.memory import Strategy, plan_memory
from edbatch.schedule import MemoScheduler, Schedule, make_scheduler, run_policy
from edbatch.tracking import machine_info
from edbatch.workloads import Workload, make_workload

__all__ = ["CONTENDERS", "DYNET_CONTENDERS", "EDBATCH_CONTENDERS", "build_parser",
           "fsm_hparams", "load_or_train_policy", "main", "parse_size", "run"]

ROOT = Path(__file__).resolve().parents[1]
DYNET_PEER = ROOT / "benchmarks" / "dynet_peer.py"
GRAPHED = "fsm+memo+cugraph"  # CUDA only
EDBATCH_CONTENDERS = ("unbatched", "depth", "dynet_agenda", "fsm", "fsm+aligned",
                      "fsm+planned", "fsm+planned+memo", GRAPHED)
DYNET_CONTENDERS = ("dynet_autobatch0", "dynet_autobatch1", "dynet_autobatch2")
CONTENDERS = EDBATCH_CONTENDERS + DYNET_CONTENDERS
WORKLOADS = ("tree_lstm", "lattice_lstm", "bilstm_tagger")
SIZES = ("300x150", "128x128")
MODES = ("infer", "train")
BATCH_SIZE = 64
PHASES = ("construction", "scheduling", "planning", "execution", "backward", "update")
PROFILE_KEYS = {"gather_ms": "exec/gather_seconds", "read_ms": "exec/read_seconds",
                "kernel_ms": "exec/kernel_seconds", "compile_ms": "exec/compile_seconds"}
LOSS_RTOL = 1e-3
STRATEGY: dict[str, Strategy] = {"fsm+aligned": "aligned",  # the others: "naive"
                                 "fsm+planned": "planned",
                                 "fsm+planned+memo": "planned", GRAPHED: "planned"}
MEMO = ("fsm+planned+memo", GRAPHED)  # schedules and plans reused across passes (by structure)
LR = 0.0  # the DyNet worker's default: every pass sees the same parameters
_CAN_PROFILE = "profile" in inspect.signature(TorchExecutor).parameters


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_size(text: str) -> str:
    """Check an ``EMBEDxHIDDEN`` size string (argparse ``type``); return it unchanged.

    Raises:
        argparse.ArgumentTypeError: not two positive integers joined by ``x``.
    """
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if m is None or min(int(m[1]), int(m[2])) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: expected EMBEDxHIDDEN with positive integers, e.g. "
            f"300x150 or 128x128")
    return text


def _dims(size: str) -> tuple[int, int]:
    embed, hidden = size.split("x")
    return int(embed), int(hidden)


# ---------------------------------------------------------------------- the FSM policy
def fsm_hparams(max_episodes: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The main job's learner settings: ``conf/trainer/q_learning.yaml`` + ``policy/fsm``."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"seed": seed,
                            "policy": OmegaConf.load(ROOT / "conf/policy/fsm.yaml"),
                            "trainer": OmegaConf.load(ROOT / "conf/trainer/q_learning.yaml")})
    hp = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(hp, dict)
    hp.pop("_target_", None)
    if max_episodes:
        hp["max_episodes"] = max_episodes
    return {str(k): v for k, v in hp.items()}


def load_or_train_policy(name: str, wl: Workload, policy_dir: str | Path,
                         max_episodes: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Load ``policy_dir/<name>.json``, or train it (4 train graphs, 2 validation) and save.

    Returns:
        The :class:`~policies.fsm.FSMPolicy` and a record of where it lives and its training.
    """
    from experiments._common import graph_set
    from policies import FSMPolicy, QLearningTrainer

    path = Path(policy_dir) / f"{name}.json"
    if path.is_file():
        policy = FSMPolicy.load(path, wl.vocab)
        info: dict[str, Any] = {"path": str(path), "trained": False}
        print(f"{name}: loaded FSM policy {path}")
    else:
        hp = fsm_hparams(max_episodes)
        _log(f"{name}: training the FSM policy ({hp['max_episodes']} episodes max) ...")
        train = graph_set(wl, "train", BATCH_SIZE, 4, shuffle_seed=0)
        val = graph_set(wl, "train", BATCH_SIZE, 2)
        t0 = time.perf_counter()
        result = QLearningTrainer(**hp).fit(train, val, metadata={"workload": name, "seed": 0})
        seconds = time.perf_counter() - t0
        policy = result.policy
        policy.save(path)
        info = {"path": str(path), "trained": True, "train_seconds": seconds,
                "episodes": result.episodes, "hparams": hp}
        print(f"{name}: trained FSM policy in {seconds:.1f}s ({result.episodes} episodes), "
              f"saved to {path}")
    info.update(states=policy.num_states, fallback=policy.fallback_name)
    return policy, info


# ---------------------------------------------------------------------- edbatch passes
@dataclass
class _Job:
    """One workload x size x mode: data, parameters and the edbatch schedulers."""

    wl: Workload
    chunks: list[range]  # instance indices of each mini-batch in the evaluation split
    params: dict[str, Tensor]
    train: bool
    schedulers: dict[str, Callable[[Graph], Schedule]]
    base: dict[str, Any]
    cse: bool = True
    fresh: bool = False  # build from the instances every pass instead of merging cached ones
    device: str = "cpu"
    graphed: TorchExecutor | None = None  # the GRAPHED contender's executor (kept)
    peers: dict[str, DynetServer] = field(default_factory=dict)  # interleaved DyNet workers
    errors: list[str] = field(default_factory=list)  # failures of those workers
    dead: set[str] = field(default_factory=set)  # the workers that failed (no more passes)

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


def _pass(job: _Job, contender: str, chunk: range, *, profile: bool = False
          ) -> tuple[dict[str, float], dict[str, float]]:
    """One mini-batch: phase seconds and info (loss, batches, executor stats)."""
    with torch.set_grad_enabled(job.train):
        clock = _Clock()
        split = job.wl.default_eval_split
        if job.fresh:
            instances = job.wl.load(split)
            graph = job.wl.build_graph([instances[i] for i in chunk])
        else:
            graph = job.wl.minibatch(split, chunk)
        if job.cse and contender != "unbatched":
            graph = dedupe_leaves(graph)[0]
        clock.lap("construction")
        if contender == "unbatched":
            loss = reference_loss(graph, job.params)
            job.sync()
            clock.lap("execution")
            info = {"batches": float(graph.num_nodes)}
        else:
            schedule = job.schedulers[contender](graph)
            clock.lap("scheduling")
            plan = plan_memory(graph, schedule, STRATEGY.get(contender, "naive"),
                               cache=contender in MEMO)
            clock.lap("planning")
            ex = job.graphed if contender == GRAPHED and not profile and job.graphed else \
                TorchExecutor(job.device, profile=profile, sparse_grads=job.train)
            res = ex.run(graph, schedule, plan, job.params, grad=job.train)
            clock.lap("execution")
            assert res.loss is not None
            loss = res.loss
            info = {"batches": float(schedule.num_batches), **res.stats}
        if job.train:
            loss.backward()
            job.sync()
            clock.lap("backward")
            _sgd_update(job.params.values(), LR)
            job.sync()
            clock.lap("update")
    info["loss"] = float(loss.detach())
    return clock.times, info


def _bench_job(job: _Job, contenders: Sequence[str], args: argparse.Namespace
               ) -> list[dict[str, Any]]:
    """Time every contender on ``job`` (edbatch's and the interleaved DyNet workers), passes
    interleaved; one row each. A DyNet worker that fails is recorded in ``job.errors`` and
    gets no row."""
    limit = args.unbatched_minibatches or len(job.chunks)
    counts = {c: min(limit, len(job.chunks)) if c == "unbatched" else len(job.chunks)
              for c in contenders}
    samples: dict[str, list[list[dict[str, float]]]] = {
        c: [[] for _ in range(n)] for c, n in counts.items()}
    infos: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
    failed = job.dead  # shared by both modes' jobs: a dead worker stays dead
    for r in range(args.warmup + args.repeats):
        for c in contenders:
            t0 = time.perf_counter()
            for k in range(counts[c] if c not in failed else 0):
                if c in job.peers:
                    try:
                        times, info = _peer_pass(job, c, k)
                    except PeerServerError as e:
                        failed.add(c)
                        job.errors.append(f"{job.base['workload']} {job.base['size']} {c}: {e}")
                        _log(job.errors[-1])
                        break
                else:
                    times, info = _pass(job, c, job.chunks[k])
                if r == 0:
                    infos[c].append(info)
                if r >= args.warmup:
                    samples[c][k].append(times)
            _log(f"  {job.base['workload']} {job.base['size']} {job.base['mode']} {c}: "
                 f"pass {r + 1}/{args.warmup + args.repeats} "
                 f"{'(warm-up) ' if r < args.warmup else ''}{time.perf_counter() - t0:.2f}s")
    return [_row(job, c, samples[c], infos[c]) for c in contenders if c not in failed]


def _peer_pass(job: _Job, contender: str, k: int
               ) -> tuple[dict[str, float], dict[str, float]]:
    """One mini-batch pass of an interleaved DyNet worker; its ``forward`` (autobatch
    scheduling, gathers and kernels) is the execution phase."""
    phases, loss = job.peers[contender].run(job.base["mode"], k)
    phases["execution"] = phases.pop("forward")
    return phases, {"loss": loss}


def _profile(job: _Job, contender: str, count: int) -> dict[str, float]:
    """Gather / kernel / compile ms from one extra profiled pass (if the executor can)."""
    if not _CAN_PROFILE or contender == "unbatched":
        return {}
    out = dict.fromkeys(PROFILE_KEYS, 0.0)
    for chunk in job.chunks[:count]:
        _, info = _pass(job, contender, chunk, profile=True)
        for col, key in PROFILE_KEYS.items():
            out[col] += 1e3 * info.get(key, 0.0)
    return out


def _row(job: _Job, contender: str, samples: list[list[dict[str, float]]],
         infos: list[dict[str, float]]) -> dict[str, Any]:
    """Sum over mini-batches of the per-mini-batch median of each phase."""
    n = len(samples)
    ms = {f"{p}_ms": 1e3 * sum(statistics.median(s.get(p, 0.0) for s in mb) for mb in samples)
          for p in PHASES}
    total = sum(ms.values())
    items = sum(len(c) for c in job.chunks[:n])
    overhead = ms["construction_ms"] + ms["scheduling_ms"] + ms["planning_ms"]
    row = {**job.base, "contender": contender,
           "framework": "dynet" if contender in job.peers else "edbatch", "minibatches": n,
           "items": items, "scale": sum(len(c) for c in job.chunks) / items,
           **ms, "total_ms": total,
           "items_per_s": items / (total / 1e3), "overhead_share": overhead / total,
           "loss": infos[0]["loss"], "losses": [i["loss"] for i in infos]}
    if contender in job.peers:
        return row
    row["batches"] = statistics.mean(i["batches"] for i in infos)
    if contender != "unbatched":
        row["gathers"] = int(sum(i.get("exec/num_gathers", 0.0) for i in infos))
        row.update(_profile(job, contender, n))
    return row


def _edbatch_rows(name: str, size: str, wl: Workload, chunks: list[range],
                  policy: Any, args: argparse.Namespace,
                  peers: dict[str, DynetServer] | None = None,
                  errors: list[str] | None = None) -> list[dict[str, Any]]:
    """All edbatch rows of one workload x size (both modes), and those of the interleaved
    DyNet ``peers`` (their passes run between edbatch's; failures go to ``errors``)."""
    cuda = torch.device(args.device).type == "cuda"
    peers, dead = peers or {}, set[str]()
    contenders = [c for c in args.contenders if c in EDBATCH_CONTENDERS
                  and (cuda or c != GRAPHED)] + list(peers)
    schedulers: dict[str, Callable[[Graph], Schedule]] = {
        c: make_scheduler(c) for c in ("depth", "dynet_agenda") if c in contenders}
    if policy is not None:
        def fsm(graph: Graph) -> Schedule:
            return run_policy(graph, policy, name="fsm")
        schedulers.update({"fsm": fsm, "fsm+aligned": fsm, "fsm+planned": fsm,
                           "fsm+planned+memo": MemoScheduler(fsm), GRAPHED: MemoScheduler(fsm)})
    embed, hidden = _dims(size)
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        train = mode == "train"
        params = {k: p.detach().clone().requires_grad_(train)
                  for k, p in init_params(wl, torch.Generator().manual_seed(0),
                                          device=args.device).items()}
        base = {"workload": name, "size": size, "embed": embed, "hidden": hidden,
                "mode": mode, "device": args.device}
        graphed = TorchExecutor(args.device, cuda_graphs=True) if cuda else None
        job = _Job(wl, chunks, params, train, schedulers, base, not args.no_cse,
                   args.construction == "fresh", args.device, graphed, peers,
                   errors if errors is not None else [], dead)
        rows += _bench_job(job, [c for c in contenders if c not in dead], args)
    return rows


# ---------------------------------------------------------------------- DyNet
def dynet_available() -> bool:
    """Whether ``import dynet`` would work in a subprocess."""
    return importlib.util.find_spec("dynet") is not None


def _save_peer_params(folder: Path, name: str, size: str, wl: Workload) -> Path:
    """edbatch's initial parameters (seed 0) as the ``.npz`` the DyNet worker loads."""
    path = folder / f"{name}_{size}.npz"
    params = init_params(wl, torch.Generator().manual_seed(0))
    np.savez(path, **{k: t.detach().numpy() for k, t in params.items()})  # type: ignore
    return path


def _peer_cmd(name: str, size: str, contender: str, num_minibatches: int,
              args: argparse.Namespace, path: Path, *, serve: bool = False) -> list[str]:
    """The DyNet worker's command line for one autobatch mode."""
    embed, hidden = _dims(size)
    return [sys.executable, str(args.dynet_peer), "--workload", name, "--embed", str(embed),
            "--hidden", str(hidden), "--autobatch", contender[-1], "--batch-size",
            str(BATCH_SIZE), "--minibatches", str(num_minibatches), "--repeats",
            str(args.repeats), "--warmup", str(args.warmup), "--params", str(path),
            "--modes", *args.modes, *(["--serve"] if serve else [])]


def _peer_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _start_peers(stack: ExitStack, name: str, size: str, wl: Workload, num_minibatches: int,
                 args: argparse.Namespace, errors: list[str]) -> dict[str, DynetServer]:
    """One serving DyNet worker per requested autobatch mode (closed with ``stack``); a
    worker that fails to start is recorded in ``errors`` and left out."""
    peers: dict[str, DynetServer] = {}
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:  # read at start-up only
        path = _save_peer_params(Path(tmp), name, size, wl)
        for contender in (c for c in args.contenders if c in DYNET_CONTENDERS):
            cmd = _peer_cmd(name, size, contender, num_minibatches, args, path, serve=True)
            _log(f"  {name} {size} {contender} (interleaved): {' '.join(cmd[1:])}")
            try:
                peers[contender] = stack.enter_context(DynetServer(cmd, _peer_env(), ROOT))
            except PeerServerError as e:
                errors.append(f"{name} {size} {contender}: {e}")
                _log(errors[-1])
    return peers


def _dynet_rows(name: str, size: str, wl: Workload, num_minibatches: int,
                args: argparse.Namespace, errors: list[str]) -> list[dict[str, Any]]:
    """One worker subprocess per autobatch mode; rows for every requested mode."""
    from benchmarks._throughput_report import dynet_rows

    embed, hidden = _dims(size)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        path = _save_peer_params(Path(tmp), name, size, wl)
        for contender in (c for c in args.contenders if c in DYNET_CONTENDERS):
            cmd = _peer_cmd(name, size, contender, num_minibatches, args, path)
            _log(f"  {name} {size} {contender}: {' '.join(cmd[1:])}")
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                  env=_peer_env(), check=False)
            try:
                report = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                errors.append(f"{name} {size} {contender}: worker exited {proc.returncode}: "
                              f"{proc.stderr.strip()[-600:]}")
                _log(errors[-1])
                continue
            rows += dynet_rows(report, args.modes, workload=name, size=size, embed=embed,
                               hidden=hidden)
    return rows


def best_of(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per (contender, mode), the DyNet row with the most items/s over ``runs`` (conservative
    for edbatch's ratios on a machine whose speed drifts); every run's items/s is kept in
    ``items_per_s_runs``."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    seen: dict[tuple[str, str], list[float]] = {}
    for run_rows in runs:
        for row in run_rows:
            key = (row["contender"], row["mode"])
            seen.setdefault(key, []).append(row["items_per_s"])
            if key not in best or row["items_per_s"] > best[key]["items_per_s"]:
                best[key] = row
    return [{**row, "items_per_s_runs": seen[key]} for key, row in best.items()]


def _rows_dynet_in_blocks(name: str, size: str, wl: Workload, chunks: list[range],
                          policy: Any, args: argparse.Namespace, use_dynet: bool,
                          errors: list[str]) -> list[dict[str, Any]]:
    """edbatch's rows, then (``use_dynet``) DyNet's, each worker timed as one block before
    and after the edbatch passes (``--dynet-runs 2``, the faster run counts) or after only."""
    runs: list[list[dict[str, Any]]] = []
    if use_dynet and args.dynet_runs > 1:  # bracket the edbatch passes
        runs.append(_dynet_rows(name, size, wl, len(chunks), args, errors))
    rows = _edbatch_rows(name, size, wl, chunks, policy, args)
    if use_dynet:
        runs.append(_dynet_rows(name, size, wl, len(chunks), args, errors))
        rows += best_of(runs)
    return rows


# ---------------------------------------------------------------------- driver
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by parsed ``args``; return the JSON-ready results."""
    from benchmarks._throughput_report import check_losses, print_table

    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": machine_info(), "loadavg_before": os.getloadavg(),
                               "args": {k: str(v) if isinstance(v, Path) else v
                                        for k, v in vars(args).items()},
                               "policies": {}, "dynet": _dynet_note(args), "dynet_errors": [],
                               "rows": []}
    print(f"machine: {results['machine']}")
    print(results["dynet"]["note"])
    use_dynet = results["dynet"]["used"]
    want_fsm = any(c.startswith("fsm") for c in args.contenders)
    for name in args.workloads:
        policy = None
        for size in args.sizes:
            embed, hidden = _dims(size)
            wl = make_workload(name, granularity="cell", embed_dim=embed, hidden_dim=hidden)
            if want_fsm and policy is None:  # once per workload, before any timing
                policy, results["policies"][name] = load_or_train_policy(
                    name, wl, args.policy_dir, args.fsm_episodes)
            instances = wl.load(wl.default_eval_split)
            chunks = [range(i, min(i + BATCH_SIZE, len(instances)))
                      for i in range(0, len(instances), BATCH_SIZE)]
            chunks = chunks[:args.minibatches or len(chunks)]
            _log(f"{name} {size}: {len(chunks)} mini-batches of split "
                 f"{wl.default_eval_split!r}")
            if use_dynet and args.dynet_interleave:  # DyNet passes between edbatch's
                with ExitStack() as stack:
                    peers = _start_peers(stack, name, size, wl, len(chunks), args,
                                         results["dynet_errors"])
                    rows = _edbatch_rows(name, size, wl, chunks, policy, args, peers,
                                         results["dynet_errors"])
            else:
                rows = _rows_dynet_in_blocks(name, size, wl, chunks, policy, args, use_dynet,
                                             results["dynet_errors"])
            check_losses(rows, LOSS_RTOL)
            results["rows"] += rows
            for mode in args.modes:
                print_table([r for r in rows if r["mode"] == mode])
    results["loadavg_after"] = os.getloadavg()
    return results


def _dynet_note(args: argparse.Namespace) -> dict[str, Any]:
    wanted = any(c in DYNET_CONTENDERS for c in args.contenders)
    if wanted and not args.no_dynet and torch.device(args.device).type != "cpu":
        return {"used": False, "note": f"DyNet rows skipped: the DyNet peer is a CPU build and "
                                       f"this run is on {args.device}."}
    if not wanted or args.no_dynet:
        why = "--no-dynet" if args.no_dynet else "no DyNet contender requested"
        return {"used": False, "note": f"DyNet rows skipped ({why})."}
    if not dynet_available():
        return {"used": False, "note": "DyNet rows skipped: `import dynet` is not available "
                                       "(install it with: pip install -e \".[peers]\")."}
    if args.dynet_interleave:
        return {"used": True, "note": f"DyNet rows from {args.dynet_peer} (one serving process "
                                      f"per autobatch mode, its passes interleaved with "
                                      f"edbatch's)."}
    return {"used": True, "note": f"DyNet rows from {args.dynet_peer} (one process per "
                                  f"autobatch mode; the faster of {args.dynet_runs} run(s), "
                                  f"{'before and after' if args.dynet_runs > 1 else 'after'}"
                                  f" the edbatch passes)."}


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--sizes", nargs="+", default=list(SIZES), type=parse_size,
                   help="EMBEDxHIDDEN, e.g. 300x150 128x128")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--minibatches", type=int, default=0,
                   help="first N mini-batches of 64 of the eval split (0: all)")
    p.add_argument("--unbatched-minibatches", type=int, default=1,
                   help="mini-batches the slow node-by-node contender runs (0: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-dynet", action="store_true", help="skip the DyNet rows")
    p.add_argument("--dynet-interleave", action=argparse.BooleanOptionalAction, default=True,
                   help="keep one DyNet worker per autobatch mode running and interleave its "
                        "passes with edbatch's (default); --no-dynet-interleave runs each "
                        "worker's passes as one block (see --dynet-runs)")
    p.add_argument("--dynet-runs", type=int, choices=(1, 2), default=2,
                   help="2: DyNet runs before and after the edbatch passes, the faster run "
                        "counts (conservative under drift); 1: after only")
    p.add_argument("--construction", choices=("cached", "fresh"), default="cached",
                   help="cached: merge per-instance graphs built on first sight "
                        "(Workload.minibatch); fresh: build every pass from the instances")
    p.add_argument("--no-cse", action="store_true",
                   help="do not merge repeated operand-free nodes (edbatch.graph.dedupe_leaves)")
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--policy-dir", default="results/throughput_policies",
                   help="FSM policies <workload>.json (trained here when missing)")
    p.add_argument("--fsm-episodes", type=int, default=None,
                   help="override max_episodes when training a missing FSM (testing)")
    p.add_argument("--dynet-peer", type=Path, default=DYNET_PEER,
                   help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda[:N]: where edbatch runs (cuda adds fsm+memo+cugraph)")
    p.add_argument("--out", type=Path, default=Path("results/throughput.json"))
    p.add_argument("--plot", type=Path, default=Path("results/throughput.png"))
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run, print the tables, write the JSON and the plot; return results."""
    from benchmarks._throughput_report import plot_rows

    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("minibatches", "unbatched_minibatches", "warmup"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    plot_rows(results["rows"], args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: make `benchmarks` importable
    main()
