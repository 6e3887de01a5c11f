"""Throughput benchmark: edbatch vs DyNet vs hand-batched PyTorch, items/s, side by side.

For every workload (cell granularity) x model size x mode (``infer``, ``train``), with one
CPU thread and the same parameter values (``init_params`` seeded with 0) everywhere, every
contender runs every mini-batch of 64 instances, interleaved: for each mini-batch all
contenders run it in turn, the first one rotating, so all are timed in the same seconds.

Data (``--data``): ``reshuffled`` (default) draws each pass's mini-batches anew from a
seeded permutation of the *training* split (SST train for the trees, lattice train, the
tagger's train part), so no mini-batch structure repeats within a run and memoisation
by structure finds nothing; ``repeated`` runs the same first ``--minibatches`` mini-batches
of the evaluation split every pass (the old mode; what a memo profits from). Every table
and file says which.

Construction (``--construction``): ``api`` (default) records each mini-batch with the
public per-instance API (:mod:`benchmarks.models_api` on ``DynamicBatch.from_workload``,
the workload's fused cells and parameters), as a user writes a model; ``fastbuild`` uses the
workload's numpy builder (also the ``fsm+fastbuild`` contender); ``cached`` merges cached
per-instance graphs. Leaf merging (:func:`~edbatch.graph.dedupe_leaves`) is off unless
``--cse``; ``fsm+cse`` is the labelled contender with it.

Contenders: edbatch ``unbatched`` (node by node, first ``--unbatched-minibatches`` only),
``depth``, ``dynet_agenda``, ``fsm`` (learned FSM, naive memory), ``fsm+aligned``,
``fsm+planned``, ``fsm+fastbuild``, ``fsm+cse``, ``fsm+planned+memo`` (schedules and plans
reused by structure), on CUDA ``fsm+memo+cugraph``, ``fsm+unhoisted`` (``fsm`` without the
executor's input-projection hoisting, which every other edbatch contender has where a cell
has a hoisted form: the default), ``fsm+unfused`` (``fsm`` with the cells' element-wise parts
as separate torch kernels instead of one compiled kernel per batch, the default);
``pytorch_hand``
(:mod:`benchmarks.hand_batched`); ``pytorch_unbatched`` (per-instance PyTorch, node by
node, where ``benchmarks/peers/<name>.py`` has an ``Unbatched``; first
``--unbatched-minibatches`` only); ``floor`` (the GEMMs of the ``fsm`` schedule's hoisted
program alone); DyNet
``dynet_autobatch{0,1,2}`` (one ``benchmarks/dynet_peer.py --serve`` worker each, if
``dynet`` is installed; ``--no-dynet-interleave`` times each worker as one block instead,
``--data repeated`` only). TorchFold cannot run on this torch (the reason is in the JSON's
``torchfold`` entry and in docs/benchmarks.md).

Phases are medians over ``--repeats`` passes per mini-batch slot, summed over slots.
Losses of every contender are checked against the edbatch reference row on the same
mini-batches (``loss_match``). The JSON's ``rows`` hold ``items_per_s``,
``ratio_to_dynet_agenda``, ``overhead_share``, ``floor_multiple``, ``peak_rss_mb`` and the
per-phase ms (see docs/benchmarks.md). It asserts nothing about speed.

    python benchmarks/throughput.py [--workloads tree_lstm] [--sizes 300x150] \\
        [--modes infer train] [--minibatches 4] [--repeats 3] [--data reshuffled] \\
        [--no-dynet] [--out results/throughput.json] [--plot results/throughput.png]

Without arguments it runs the default set (a few minutes on 2 cores, FSM policies trained
on first use included): ED-Batch's workloads (Tree-LSTM, lattice, BiLSTM tagger), every mode
at 300x150, 2 mini-batches a pass, the contenders ``depth dynet_agenda fsm pytorch_hand floor
dynet_autobatch1``. ``--full`` is the full set: every workload and contender, sizes
``300x150 128x128``, the whole training split per pass (``--minibatches 0``; hours); flags
given explicitly still apply.

Sizes are ``EMBEDxHIDDEN`` strings (any positive pair, e.g. ``8x6`` for a quick check).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks._dynet_server import DynetServer, PeerServerError
from benchmarks._throughput_data import DATA_MODES, GemmFloor, gemm_shapes, minibatch_plan
from benchmarks._throughput_passes import (
    FLOOR,
    GRAPHED,
    HAND,
    PHASES,
    PT_UNBATCHED,
    UNFUSED,
    UNHOISTED,
    Job,
    bench_job,
)
from benchmarks._throughput_report import add_ratios
from benchmarks.hand_batched import (
    hand_batched_models,
    make_hand_batched,
    make_unbatched,
    torchfold_status,
    unbatched_models,
)
from benchmarks.models_api import RECORDERS
from benchmarks.peers import sized_workload
from edbatch.api import AutoScheduler, DynamicBatch
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.schedule import MemoScheduler, Schedule, make_scheduler
from edbatch.tracking import machine_info
from edbatch.workloads import Workload, make_workload  # noqa: F401  (tests: tp.make_workload)

__all__ = ["CONTENDERS", "DEFAULT_CONTENDERS", "DEFAULT_SIZES", "DEFAULT_WORKLOADS",
           "DYNET_CONTENDERS",
           "EDBATCH_CONTENDERS", "PHASES", "build_parser", "fsm_hparams", "load_or_train_policy",
           "main", "parse_size", "run"]

ROOT = Path(__file__).resolve().parents[1]
DYNET_PEER = ROOT / "benchmarks" / "dynet_peer.py"
EDBATCH_CONTENDERS = ("unbatched", "depth", "dynet_agenda", "fsm", "fsm+aligned",
                      "fsm+planned", "fsm+fastbuild", "fsm+cse", "fsm+planned+memo", GRAPHED,
                      "auto", UNHOISTED, UNFUSED)
OTHER_CONTENDERS = (HAND, FLOOR, PT_UNBATCHED)
DYNET_CONTENDERS = ("dynet_autobatch0", "dynet_autobatch1", "dynet_autobatch2")
CONTENDERS = EDBATCH_CONTENDERS + OTHER_CONTENDERS + DYNET_CONTENDERS
#: The registered workloads with a per-instance API model (``benchmarks/peers/<name>.py``).
WORKLOADS = tuple(RECORDERS)
SIZES = ("300x150", "128x128")
MODES = ("infer", "train")
#: What a run without arguments measures (about 3 minutes on 2 idle cores, FSM policies
#: trained on first use included): ED-Batch's three workloads, every mode at the paper's
#: size, 2 mini-batches a pass, the contenders that state the result (the learned FSM
#: against edbatch's own agenda baselines, the hand-batched PyTorch peer, the GEMM floor and
#: DyNet's agenda autobatching). ``--full`` is every workload and contender at both sizes
#: (hours: see --help).
DEFAULT_SIZES = ("300x150",)
#: ED-Batch's three rows; the seeds' workloads (SICK, GGNN, parser, char tagger) with
#: ``--workloads`` or ``--full``
DEFAULT_WORKLOADS = ("tree_lstm", "lattice_lstm", "bilstm_tagger")
DEFAULT_MINIBATCHES = 2
DEFAULT_CONTENDERS = ("depth", "dynet_agenda", "fsm", HAND, FLOOR, "dynet_autobatch1")
BATCH_SIZE = 64
LOSS_RTOL = 1e-3
Plan = list[list[list[int]]]  # plan[r][k]: instance indices of mini-batch k of pass r


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
def fsm_hparams(max_episodes: int | None = None, seed: int = 0,
                trainer: str = "q_learning") -> dict[str, Any]:
    """The learner's settings: ``conf/trainer/<trainer>.yaml`` + ``policy/fsm``, no
    lookahead (the run-time path is timed)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"seed": seed,
                            "policy": OmegaConf.load(ROOT / "conf/policy/fsm.yaml"),
                            "trainer": OmegaConf.load(ROOT / f"conf/trainer/{trainer}.yaml")})
    cfg.policy.lookahead = "none"
    hp = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(hp, dict)
    hp.pop("_target_", None)
    if max_episodes and trainer == "q_learning":
        hp["max_episodes"] = max_episodes
    if trainer == "expert":  # 8 resampled mini-batches, not 32: minutes, not a quarter hour
        hp["augment"] = 8
    return {str(k): v for k, v in hp.items()}


def load_or_train_policy(name: str, wl: Workload, policy_dir: str | Path,
                         max_episodes: int | None = None, trainer: str = "expert"
                         ) -> tuple[Any, dict[str, Any]]:
    """Load ``policy_dir/<name>[_expert].json``, or train it with ``trainer`` (``expert``:
    table search, ``q_learning``: ``max_episodes``) on 4 train graphs, 2 validation, and save.

    Returns:
        The :class:`~policies.fsm.FSMPolicy` and a record of where it lives and its training.
    """
    from experiments._common import graph_set
    from policies import FSMPolicy, QLearningTrainer
    from policies.expert import ExpertTrainer

    trainers = {"expert": ExpertTrainer, "q_learning": QLearningTrainer}
    path = Path(policy_dir) / (f"{name}.json" if trainer == "q_learning"
                               else f"{name}_{trainer}.json")
    if path.is_file():
        policy = FSMPolicy.load(path, wl.vocab)
        info: dict[str, Any] = {"path": str(path), "trained": False}
        print(f"{name}: loaded FSM policy {path}")
    else:
        hp = fsm_hparams(max_episodes, trainer=trainer)
        _log(f"{name}: training the FSM policy ({trainer}) ...")
        train = graph_set(wl, "train", BATCH_SIZE, 4, shuffle_seed=0)
        val = graph_set(wl, "train", BATCH_SIZE, 2)
        t0 = time.perf_counter()
        result = trainers[trainer](**hp).fit(train, val, metadata={"workload": name, "seed": 0})
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
def _schedulers(policy: Any, contenders: Sequence[str]) -> dict[str, Callable[[Graph], Schedule]]:
    schedulers: dict[str, Callable[[Graph], Schedule]] = {
        c: make_scheduler(c) for c in ("depth", "dynet_agenda") if c in contenders}
    if "auto" in contenders:  # the candidates (the FSM's run-time path first) timed in turn
        schedulers["auto"] = AutoScheduler(policy)
    if policy is not None:  # the FSM's run-time path: a lookup per decision, no rollout
        fsm = policy.runtime_scheduler("fsm")
        schedulers.update({"fsm": fsm, "fsm+aligned": fsm, "fsm+planned": fsm,
                           "fsm+fastbuild": fsm, "fsm+cse": fsm, UNHOISTED: fsm, UNFUSED: fsm,
                           "fsm+planned+memo": MemoScheduler(fsm), GRAPHED: MemoScheduler(fsm)})
    return schedulers


def _floors(wl: Workload, split: str, plan: Plan,
            scheduler: Callable[[Graph], Schedule], train: bool) -> list[list[GemmFloor]]:
    """The GEMM floor of every planned mini-batch (built before any timing)."""
    gen = torch.Generator().manual_seed(0)
    data = wl.load(split)
    shapes = wl.param_shapes()
    out = []
    for passes in plan:
        row = []
        for idx in passes:
            graph = wl.build_graph([data[i] for i in idx])
            row.append(GemmFloor(gemm_shapes(graph, scheduler(graph), shapes), train, gen))
        out.append(row)
    return out


def _edbatch_rows(name: str, size: str, wl: Workload, split: str,
                  plans: dict[str, Plan], policy: Any, args: argparse.Namespace,
                  peers: dict[str, DynetServer] | None = None,
                  errors: list[str] | None = None) -> list[dict[str, Any]]:
    """All rows of one workload x size (both modes): edbatch's, the hand-batched PyTorch
    model's, the GEMM floor's and those of the interleaved DyNet ``peers`` (failures go to
    ``errors``)."""
    cuda = torch.device(args.device).type == "cuda"
    peers, dead = peers or {}, set[str]()
    contenders = [c for c in args.contenders if c in EDBATCH_CONTENDERS
                  and (cuda or c != GRAPHED) and (policy is not None or not c.startswith(
                      "fsm"))]
    if HAND in args.contenders and name in hand_batched_models() and not cuda:
        contenders.append(HAND)
    if PT_UNBATCHED in args.contenders and name in unbatched_models() and not cuda:
        contenders.append(PT_UNBATCHED)
    contenders += list(peers)
    embed, hidden = _dims(size)
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        train, plan = mode == "train", plans[mode]
        schedulers = _schedulers(policy, contenders)  # fresh memos per mode
        floor_scheduler = schedulers.get("fsm") or make_scheduler("depth")
        params = {k: p.detach().clone().requires_grad_(train)
                  for k, p in init_params(wl, torch.Generator().manual_seed(0),
                                          device=args.device).items()}
        base = {"workload": name, "size": size, "embed": embed, "hidden": hidden,
                "mode": mode, "device": args.device, "data": args.data,
                "construction": args.construction, "split": split}
        graphed = TorchExecutor(args.device, cuda_graphs=True) if cuda else None
        job = Job(wl, split, plan, params, train, schedulers, base, args.construction,
                  args.cse, args.device, graphed, peers,
                  errors if errors is not None else [], dead,
                  api=DynamicBatch.from_workload(wl, params, device=args.device))
        use = [c for c in contenders if c not in dead]
        if HAND in use:
            job.hand = make_hand_batched(wl, params)
        if PT_UNBATCHED in use:
            job.unbatched = make_unbatched(wl, params)
        if FLOOR in args.contenders:
            job.floors = _floors(wl, split, plan, floor_scheduler, train)
            use.append(FLOOR)
        rows += bench_job(job, use, args)
    add_ratios(rows)
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
    # kept while the workers live: the memory probe starts more workers from these parameters
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="throughput-"))
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


def _rows_dynet_in_blocks(name: str, size: str, wl: Workload, split: str,
                          plans: dict[str, Plan], policy: Any, args: argparse.Namespace,
                          use_dynet: bool, errors: list[str]) -> list[dict[str, Any]]:
    """edbatch's rows, then (``use_dynet``) DyNet's, each worker timed as one block before
    and after the edbatch passes (``--dynet-runs 2``, the faster run counts) or after only."""
    runs: list[list[dict[str, Any]]] = []
    count = len(next(iter(plans.values()))[0])
    if use_dynet and args.dynet_runs > 1:  # bracket the edbatch passes
        runs.append(_dynet_rows(name, size, wl, count, args, errors))
    rows = _edbatch_rows(name, size, wl, split, plans, policy, args)
    if use_dynet:
        runs.append(_dynet_rows(name, size, wl, count, args, errors))
        rows += [{**r, "data": args.data} for r in best_of(runs)]
        add_ratios(rows)
    return rows


# ---------------------------------------------------------------------- driver
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by parsed ``args``; return the JSON-ready results."""
    from benchmarks._throughput_report import check_losses, print_table

    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": machine_info(), "loadavg_before": os.getloadavg(),
                               "args": {k: str(v) if isinstance(v, Path) else v
                                        for k, v in vars(args).items()},
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "git_sha": _git_sha(), "data": args.data,
                               "policies": {}, "dynet": _dynet_note(args), "dynet_errors": [],
                               "torchfold": torchfold_status() or "runs", "rows": []}
    print(f"machine: {results['machine']}")
    print(results["dynet"]["note"])
    use_dynet = results["dynet"]["used"]
    want_fsm = any(c.startswith("fsm") or c == "auto" for c in args.contenders)
    for name in args.workloads:
        policy = None
        for size in args.sizes:
            embed, hidden = _dims(size)
            wl = sized_workload(name, embed, hidden)  # (a GGNN has no embed_dim)
            if want_fsm and policy is None:  # once per workload, before any timing
                policy, results["policies"][name] = load_or_train_policy(
                    name, wl, args.policy_dir, args.fsm_episodes, args.trainer)
            split = "train" if args.data == "reshuffled" else wl.default_eval_split
            plans = {mode: minibatch_plan(  # a permutation per mode: nothing repeats in a run
                args.data, len(wl.load("train")), len(wl.load(wl.default_eval_split)),
                BATCH_SIZE, args.minibatches, args.warmup + args.repeats, args.seed + m)
                for m, mode in enumerate(args.modes)}
            count = len(plans[args.modes[0]][0])
            _log(f"{name} {size}: {count} mini-batches per pass of split {split!r} "
                 f"({args.data})")
            if use_dynet and args.dynet_interleave:  # DyNet passes between edbatch's
                with ExitStack() as stack:
                    peers = _start_peers(stack, name, size, wl, count, args,
                                         results["dynet_errors"])
                    rows = _edbatch_rows(name, size, wl, split, plans, policy, args, peers,
                                         results["dynet_errors"])
            else:
                rows = _rows_dynet_in_blocks(name, size, wl, split, plans, policy, args,
                                             use_dynet, results["dynet_errors"])
            for mode in args.modes:
                check_losses([r for r in rows if r["mode"] == mode], LOSS_RTOL)
            results["rows"] += rows
            for mode in args.modes:
                print_table([r for r in rows if r["mode"] == mode])
    results["loadavg_after"] = os.getloadavg()
    return results


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=ROOT, check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


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
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], epilog=(
        f"The default run (no arguments): the workloads {' '.join(DEFAULT_WORKLOADS)}, "
        f"every mode at "
        f"{' '.join(DEFAULT_SIZES)}, {DEFAULT_MINIBATCHES} mini-batches a pass, contenders "
        f"{' '.join(DEFAULT_CONTENDERS)}: a few minutes on 2 cores, FSM policies trained on "
        f"first use included. --full: every workload and contender at {' '.join(SIZES)} "
        f"over the whole training split (hours)."))
    p.add_argument("--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), choices=WORKLOADS,
                   help=f"default {' '.join(DEFAULT_WORKLOADS)}; all: {' '.join(WORKLOADS)}")
    p.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), type=parse_size,
                   help=f"EMBEDxHIDDEN (default {' '.join(DEFAULT_SIZES)}; the full set: "
                        f"{' '.join(SIZES)})")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--data", choices=DATA_MODES, default="reshuffled",
                   help="reshuffled: every pass draws new mini-batches from a seeded "
                        "permutation of the training split (default); repeated: the same "
                        "first mini-batches of the eval split every pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the reshuffled permutation")
    p.add_argument("--minibatches", type=int, default=DEFAULT_MINIBATCHES,
                   help=f"mini-batches of 64 per pass (default {DEFAULT_MINIBATCHES}; 0: all "
                        f"of the eval split when repeated, the training split spread over "
                        f"the passes when reshuffled)")
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
    p.add_argument("--construction", choices=("api", "fastbuild", "cached"), default="api",
                   help="api: per-instance code on edbatch.api (benchmarks/models_api.py); "
                        "fastbuild: the workload's numpy builder; cached: merge per-instance "
                        "graphs built on first sight (Workload.minibatch)")
    p.add_argument("--cse", action="store_true",
                   help="merge repeated operand-free nodes (edbatch.graph.dedupe_leaves) for "
                        "every edbatch contender (default: only fsm+cse does)")
    p.add_argument("--contenders", nargs="+", default=list(DEFAULT_CONTENDERS),
                   choices=CONTENDERS, metavar="CONTENDER",
                   help=f"default: {' '.join(DEFAULT_CONTENDERS)}; any of {', '.join(CONTENDERS)}"
                        f" (auto: the FSM and the heuristics x aligned/naive timed on the "
                        f"first mini-batches, round-robin, the fastest kept)")
    p.add_argument("--full", action="store_true",
                   help=f"the full set: every contender, sizes {' '.join(SIZES)}, all of the "
                        f"training split per pass (--minibatches 0); hours on 2 cores. "
                        f"Explicit --sizes/--contenders/--minibatches still apply")
    p.add_argument("--policy-dir", default="results/throughput_policies",
                   help="FSM policies <workload>.json (trained here when missing)")
    p.add_argument("--trainer", choices=("expert", "q_learning"), default="expert",
                   help="FSM learner of a policy not in --policy-dir (docs/learning.md)")
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
    if args.full:  # the full set, where the flag was not given explicitly
        given = argv if argv is not None else sys.argv[1:]
        for flag, value in (("--sizes", list(SIZES)), ("--contenders", list(CONTENDERS)),
                            ("--minibatches", 0), ("--workloads", list(WORKLOADS))):
            if not any(a == flag or a.startswith(f"{flag}=") for a in given):
                setattr(args, flag[2:], value)
    for flag in ("minibatches", "unbatched_minibatches", "warmup"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if not args.dynet_interleave and args.data != "repeated":
        parser.error("--no-dynet-interleave times DyNet over its own eval-split mini-batches; "
                     "use it with --data repeated")
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    plot_rows(results["rows"], args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return results


if __name__ == "__main__":
    main()
