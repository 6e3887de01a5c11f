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
as separate torch kernels instead of one compiled kernel per batch, the default),
``fsm+unchained`` (``fsm`` with each hoisted LSTM batch its own call in inference, not one
compiled call per run of them, the default);
``pytorch_hand``
(:mod:`benchmarks.hand_batched`); ``pytorch_unbatched`` (per-instance PyTorch, node by
node, where ``benchmarks/peers/<name>.py`` has an ``Unbatched``; first
``--unbatched-minibatches`` only); ``floor`` (the GEMMs of the ``fsm`` schedule's hoisted
program alone, as a lower bound: on the model's own weights, shared and cache-warm operands,
the faster of two sweeps, ``x @ W^T`` as a strided view and as a contiguous copy, in training
``dY W`` per product and one ``dY^T X`` per weight block; :mod:`benchmarks._gemm_floor`); DyNet
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
at 300x150, 2 mini-batches a pass, the contenders ``depth dynet_agenda fsm pytorch_hand
pytorch_unbatched floor dynet_autobatch1`` (per-instance PyTorch on the first
``--unbatched-minibatches``, default 1; the ``xunb`` column divides by it). ``--full`` is
the full set: every workload and contender, sizes ``300x150 128x128``, the whole training
split per pass (``--minibatches 0``; hours); flags given explicitly still apply.

Sizes are ``EMBEDxHIDDEN`` strings (any positive pair, e.g. ``8x6`` for a quick check).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import _args
from benchmarks._dynet_server import DynetServer
from benchmarks._throughput_cli import (
    CONTENDERS,
    DEFAULT_CONTENDERS,
    DEFAULT_SIZES,
    DEFAULT_WORKLOADS,
    EDBATCH_CONTENDERS,
    MODES,
    OTHER_CONTENDERS,
    SIZES,
    WORKLOADS,
    make_parser,
    parse_size,
)
from benchmarks._throughput_data import GemmFloor, gemm_shapes, make_floors, minibatch_plan
from benchmarks._throughput_dynet import (
    BATCH_SIZE,
    DYNET_CONTENDERS,
    best_of,
    dims,
    dynet_available,
    dynet_worker_rows,
    start_peers,
)
from benchmarks._throughput_passes import (
    FLOOR,
    GRAPHED,
    HAND,
    PHASES,
    PT_UNBATCHED,
    UNCHAINED,
    UNFUSED,
    UNHOISTED,
    Job,
    bench_job,
    log,
)
from benchmarks._throughput_policy import fsm_hparams, load_or_train_policy
from benchmarks._throughput_report import add_ratios
from benchmarks.hand_batched import (
    hand_batched_models,
    make_hand_batched,
    make_unbatched,
    torchfold_status,
    unbatched_models,
)
from benchmarks.peers import sized_workload
from edbatch.api import AutoScheduler, DynamicBatch
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.schedule import MemoScheduler, Schedule, make_scheduler
from edbatch.tracking import git_sha, machine_info
from edbatch.workloads import Workload, make_workload  # noqa: F401  (tests: tp.make_workload)

__all__ = ["CONTENDERS", "DEFAULT_CONTENDERS", "DEFAULT_SIZES", "DEFAULT_WORKLOADS",
           "DYNET_CONTENDERS", "EDBATCH_CONTENDERS", "MODES", "OTHER_CONTENDERS", "PHASES",
           "SIZES", "WORKLOADS", "build_parser", "fsm_hparams", "load_or_train_policy", "main",
           "parse_size", "run"]

LOSS_RTOL = 1e-3
Plan = list[list[list[int]]]  # plan[r][k]: instance indices of mini-batch k of pass r


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
                           UNCHAINED: fsm,
                           "fsm+planned+memo": MemoScheduler(fsm), GRAPHED: MemoScheduler(fsm)})
    return schedulers


def _floors(wl: Workload, split: str, plan: Plan, scheduler: Callable[[Graph], Schedule],
            train: bool, params: dict[str, torch.Tensor]) -> list[list[GemmFloor]]:
    """The GEMM floor of every planned mini-batch on the model's own ``params`` (built before
    any timing; :mod:`benchmarks._gemm_floor`)."""
    data = wl.load(split)
    shapes = wl.param_shapes()
    lists = [gemm_shapes(graph, scheduler(graph), shapes)
             for passes in plan for graph in (wl.build_graph([data[i] for i in idx])
                                              for idx in passes)]
    floors = iter(make_floors(lists, train, params, torch.Generator().manual_seed(0)))
    return [[next(floors) for _ in passes] for passes in plan]


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
    embed, hidden = dims(size)
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
            job.floors = _floors(wl, split, plan, floor_scheduler, train, params)
            use.append(FLOOR)
        with _setup_frozen():
            rows += bench_job(job, use, args)
    add_ratios(rows)
    return rows


@contextmanager
def _setup_frozen() -> Iterator[None]:
    """The timed passes with everything made before them (data, policies, floors, earlier
    rows' objects) moved out of the collector's generations (``gc.freeze``), as a service
    freezes its start-up heap: a collection in a pass scans what the passes made, not the
    ~340,000 objects of the benchmark's process (a full collection of those took ~200 ms,
    one of them once inside a lattice ``fsm`` pass). The same for every contender; the
    objects are unfrozen after the job."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _rows_dynet_in_blocks(name: str, size: str, wl: Workload, split: str,
                          plans: dict[str, Plan], policy: Any, args: argparse.Namespace,
                          use_dynet: bool, errors: list[str]) -> list[dict[str, Any]]:
    """edbatch's rows, then (``use_dynet``) DyNet's, each worker timed as one block before
    and after the edbatch passes (``--dynet-runs 2``, the faster run counts) or after only."""
    runs: list[list[dict[str, Any]]] = []
    count = len(next(iter(plans.values()))[0])
    if use_dynet and args.dynet_runs > 1:  # bracket the edbatch passes
        runs.append(dynet_worker_rows(name, size, wl, count, args, errors))
    rows = _edbatch_rows(name, size, wl, split, plans, policy, args)
    if use_dynet:
        runs.append(dynet_worker_rows(name, size, wl, count, args, errors))
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
                               "git_sha": git_sha(), "data": args.data,
                               "policies": {}, "dynet": _dynet_note(args), "dynet_errors": [],
                               "torchfold": torchfold_status() or "runs", "rows": []}
    print(f"machine: {results['machine']}")
    print(results["dynet"]["note"])
    use_dynet = results["dynet"]["used"]
    want_fsm = any(c.startswith("fsm") or c == "auto" for c in args.contenders)
    for name in args.workloads:
        policy = None
        for size in args.sizes:
            embed, hidden = dims(size)
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
            log(f"{name} {size}: {count} mini-batches per pass of split {split!r} "
                 f"({args.data})")
            if use_dynet and args.dynet_interleave:  # DyNet passes between edbatch's
                with ExitStack() as stack:
                    peers = start_peers(stack, name, size, wl, count, args,
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
    """The command-line interface (described by this module's docstring)."""
    return make_parser((__doc__ or "").splitlines()[0])


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
    _args.run(main)
