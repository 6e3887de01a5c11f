"""DyNet peers of three edbatch workloads, and the worker CLI that times them.

The Tree-LSTM, Lattice-LSTM and BiLSTM tagger (one module each, ``benchmarks/peers/dynet/
<name>.py``, found by the workload's name) are written the way a DyNet user writes
them (as in the dynet-benchmark repository): ``dy.lookup``, one fused ``dy.affine_transform``
per cell (``[i; o; u]`` for the Tree-LSTM, ``[i f o u]`` for the LSTM cells), ``dy.pick_range``
gate slices, ``dy.logistic`` / ``dy.tanh`` / ``dy.cmult``, ``dy.pickneglogsoftmax`` per loss
and one ``dy.esum`` per mini-batch after one ``dy.renew_cg()``. The equations and parameter
values are exactly edbatch's (see each workload's module in :mod:`edbatch.workloads`), so a
mini-batch's DyNet loss equals edbatch's reference loss up to float rounding.

DyNet fixes its autobatch mode when it is imported, so the throughput harness runs this file
once per mode as a subprocess::

    PYTHONPATH=. python benchmarks/dynet_peer.py --workload tree_lstm --embed 300 \\
        --hidden 150 --autobatch 1 --batch-size 64 --minibatches 4 --repeats 3 --warmup 1 \\
        --params /tmp/tree_lstm_300x150.npz --modes infer train

The parameters come from an ``.npz`` written by :func:`save_params` (importable without
DyNet: ``dynet`` is imported only by :func:`init_dynet`). Per mini-batch the worker times
graph construction (``renew_cg`` + every expression + ``esum``), ``forward``
(``loss.value()``: DyNet's autobatch scheduling, execution and gathers), and in ``train``
mode ``backward`` and ``update`` (``SimpleSGDTrainer``, learning rate 0 by default so every
pass sees the same parameters). After ``--warmup`` untimed passes it takes the median over
``--repeats`` passes of each phase per mini-batch and reports the sums over mini-batches.
The last stdout line is one JSON object; bad input exits with code 2.

With ``--serve`` the worker instead times one mini-batch per request, so the harness can
interleave DyNet's passes with edbatch's (``benchmarks/_dynet_server.py``): after start-up
it prints ``{"ready": ...}``, then answers each stdin line ``{"mode": "infer"|"train",
"batch": k}`` with one line of that pass's phase seconds and loss (``{"error": ...}`` for a
bad request), its RSS before the pass and its peak RSS during it (``rss_before_mb``,
``maxrss_mb``), until end of input. ``--preload-split`` loads the split the requests will
name before ``ready``, and ``--mem FOR,BACK,PARAM,SCRATCH`` sizes each pool: the memory
probe (``benchmarks/_dynet_memory.py``) starts workers with both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script: the peers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # are benchmarks.peers.*
from benchmarks.peers import find_peers, sized_workload

__all__ = ["LOOKUPS", "PEERS", "PeerError", "build_peer", "init_dynet", "load_params", "main",
           "run_benchmark", "save_params", "serve"]

MODES = ("infer", "train")
Peer = Callable[[Any, dict[str, Any], int, Sequence[Any]], Any]
_PEERS = "benchmarks.peers.dynet"  # one module per workload: loss and LOOKUPS
#: Workload name -> graph builder ``(dy, params, hidden, instances) -> loss expression``:
#: the ``loss`` of every ``benchmarks/peers/dynet/<name>.py``.
PEERS: dict[str, Peer] = find_peers("loss", _PEERS)
#: Lookup tables (``add_lookup_parameters``) of each workload; every other array is a
#: ``Parameters``.
LOOKUPS: dict[str, tuple[str, ...]] = find_peers("LOOKUPS", _PEERS)


class PeerError(Exception):
    """Bad worker input (unknown workload, missing or mismatched parameter file)."""


# ---------------------------------------------------------------------- parameters
def save_params(path: str | Path, params: Mapping[str, Any]) -> Path:
    """Write ``{name: tensor}`` (e.g. edbatch's ``init_params``) to an ``.npz`` for the worker.

    Args:
        path: the file to write (``numpy.savez`` appends ``.npz`` when it is missing).
        params: parameter name -> torch tensor or numpy array.

    Returns:
        The path written.
    """
    arrays = {name: np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t,
                               dtype=np.float32) for name, t in params.items()}
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    np.savez(path, **arrays)
    return path


def load_params(path: str | Path, shapes: Mapping[str, tuple[int, ...]], workload: str = ""
                ) -> dict[str, np.ndarray]:
    """Read an ``.npz`` of parameters and check it against ``shapes`` (``param_shapes()``).

    Raises:
        PeerError: the file is missing or unreadable, a name is missing or unexpected, or a
            shape differs; the message names the offending value and how to fix it.
    """
    fix = (f"write it with benchmarks.dynet_peer.save_params(path, edbatch.executor."
           f"init_params(make_workload({workload!r}, granularity='cell', embed_dim=E, "
           f"hidden_dim=H))) using the same --embed and --hidden")
    path = Path(path)
    if not path.is_file():
        raise PeerError(f"params file {str(path)!r} does not exist; {fix}")
    try:
        with np.load(path) as npz:
            arrays = {name: np.ascontiguousarray(npz[name], dtype=np.float32)
                      for name in npz.files}
    except (OSError, ValueError) as e:
        raise PeerError(f"cannot read params file {str(path)!r} ({e}); {fix}") from e
    missing = [n for n in shapes if n not in arrays]
    extra = [n for n in arrays if n not in shapes]
    if missing or extra:
        raise PeerError(f"params file {str(path)!r} does not match workload {workload!r}: "
                        f"missing parameters {missing}, unexpected parameters {extra}; {fix}")
    for name, shape in shapes.items():
        if arrays[name].shape != tuple(shape):
            raise PeerError(f"parameter {name!r} in {str(path)!r} has shape "
                            f"{arrays[name].shape}, but workload {workload!r} expects "
                            f"{tuple(shape)}; {fix}")
    return arrays


def init_dynet(autobatch: int, *, mem: str = "2048", seed: int = 1) -> Any:
    """Import DyNet with ``autobatch`` (the mode is fixed for the process at first import).

    Raises:
        RuntimeError: DyNet was already imported with another autobatch mode.
    """
    if "dynet" not in sys.modules:
        import dynet_config
        dynet_config.set(autobatch=autobatch, mem=mem, random_seed=seed)
    import dynet
    import dynet_config
    conf = dynet_config.get()
    actual = int(conf["autobatch"]) if conf else 0
    if actual != autobatch:
        raise RuntimeError(f"DyNet is already initialised with autobatch={actual} in this "
                           f"process, not {autobatch}; run one process per autobatch mode")
    return dynet


def build_peer(dy: Any, workload: str, arrays: Mapping[str, np.ndarray]
               ) -> tuple[Any, dict[str, Any]]:
    """A DyNet ``ParameterCollection`` holding ``arrays`` and the name -> parameter map."""
    model = dy.ParameterCollection()
    lookups = LOOKUPS[workload]
    params: dict[str, Any] = {}
    for name, value in arrays.items():
        add = model.add_lookup_parameters if name in lookups else model.add_parameters
        params[name] = add(value.shape, init=value)
    return model, params


# ---------------------------------------------------------------------- timing
def _one_pass(dy: Any, build: Callable[[Sequence[Any]], Any], batches: Sequence[Sequence[Any]],
              trainer: Any | None) -> tuple[list[dict[str, float]], list[float]]:
    """Run every mini-batch once; return per-batch phase times (s) and losses."""
    clock = time.perf_counter
    times, losses = [], []
    for batch in batches:
        t0 = clock()
        loss = build(batch)
        t1 = clock()
        value = loss.value()
        t2 = clock()
        phase = {"construction": t1 - t0, "forward": t2 - t1}
        if trainer is not None:
            loss.backward()
            t3 = clock()
            trainer.update()
            phase.update(backward=t3 - t2, update=clock() - t3)
        times.append(phase)
        losses.append(float(value))
    return times, losses


def _builder(dy: Any, workload: str, params: dict[str, Any], hidden: int
             ) -> Callable[[Sequence[Any]], Any]:
    """``batch -> loss expression`` of ``workload``'s peer (a fresh graph per call)."""
    peer = PEERS[workload]
    return lambda batch: peer(dy, params, hidden, batch)


def run_benchmark(dy: Any, workload: str, params: dict[str, Any], model: Any, hidden: int,
                  batches: Sequence[Sequence[Any]], modes: Sequence[str], *, repeats: int,
                  warmup: int, lr: float = 0.0) -> tuple[dict[str, dict[str, float]],
                                                         list[float]]:
    """Time ``modes`` over ``batches``; return ``{mode: phase sums}`` and first-pass losses.

    Each phase's value is the sum over mini-batches of the median over ``repeats`` timed
    passes (after ``warmup`` untimed ones), in milliseconds; ``total_ms`` sums the phases and
    ``items_per_s`` divides the instance count by it.
    """
    build = _builder(dy, workload, params, hidden)
    items = sum(len(b) for b in batches)
    first: list[float] | None = None
    report: dict[str, dict[str, float]] = {}
    for mode in modes:
        trainer = dy.SimpleSGDTrainer(model, learning_rate=lr) if mode == "train" else None
        timed: list[list[dict[str, float]]] = []
        for k in range(warmup + repeats):
            times, losses = _one_pass(dy, build, batches, trainer)
            first = losses if first is None else first
            if k >= warmup:
                timed.append(times)
        phases = list(timed[0][0]) if batches else []
        row = {f"{ph}_ms": 1e3 * sum(statistics.median(run[b][ph] for run in timed)
                                     for b in range(len(batches))) for ph in phases}
        row["total_ms"] = sum(row.values())
        row["items_per_s"] = items / (row["total_ms"] / 1e3) if row["total_ms"] > 0 else 0.0
        report[mode] = row
    return report, first or []


def _maxrss_mb() -> float:
    """This process's peak resident set (MB) since start or :func:`_reset_peak_rss`.

    ``VmHWM`` of ``/proc/self/status``, not ``getrusage``'s ``ru_maxrss``: on Linux the latter
    keeps the peak of the process that forked this one (the throughput harness, gigabytes),
    so a worker's peak less its ready RSS came out as that difference, not its own growth.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def _reset_peak_rss() -> None:
    """Restart ``VmHWM`` from the current RSS (Linux >= 4.0; a no-op where not allowed)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def serve(dy: Any, build: Callable[[Sequence[Any]], Any], batches: Sequence[Sequence[Any]],
          model: Any, lr: float, requests: TextIO, replies: TextIO,
          resolve: Callable[[str, Sequence[int]], Sequence[Any]] | None = None) -> None:
    """Answer timing requests (see the module docstring) until ``requests`` ends. A request
    with ``indices`` (and ``split``) times those instances (via ``resolve``) instead of
    mini-batch ``batch``."""
    trainer = None
    for line in requests:
        try:
            req = json.loads(line)
            mode, k = req["mode"], int(req.get("batch", 0))
            if "indices" in req:
                if resolve is None:
                    raise ValueError("this worker cannot resolve instance indices")
                batch = resolve(str(req.get("split")), [int(i) for i in req["indices"]])
            elif 0 <= k < len(batches):
                batch = batches[k]
            if mode not in MODES or ("indices" not in req and not 0 <= k < len(batches)):
                raise ValueError(f"mode {mode!r} / batch {k} out of range: modes {list(MODES)}"
                                 f", batches 0..{len(batches) - 1}")
        except (ValueError, KeyError, TypeError, IndexError) as e:
            replies.write(json.dumps({"error": f"bad request {line.strip()!r}: {e}"}) + "\n")
            replies.flush()
            continue
        if mode == "train" and trainer is None:
            trainer = dy.SimpleSGDTrainer(model, learning_rate=lr)
        _reset_peak_rss()  # then the RSS: the peak read after the pass is at least this
        before = _rss_now_mb()
        times, losses = _one_pass(dy, build, [batch], trainer if mode == "train" else None)
        replies.write(json.dumps({**times[0], "loss": losses[0], "maxrss_mb": _maxrss_mb(),
                                  "rss_before_mb": before}) + "\n")
        replies.flush()


def _rss_now_mb() -> float:
    """This process's resident set now (MB; ``nan`` without ``/proc``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True, help=f"one of {sorted(PEERS)}")
    ap.add_argument("--embed", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--autobatch", type=int, choices=(0, 1, 2), required=True,
                    help="DyNet autobatch mode: 0 off, 1 agenda (depth+type), 2 by depth")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--minibatches", type=int, default=0, help="first N mini-batches (0: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--params", required=True, help=".npz written by save_params")
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--lr", type=float, default=0.0, help="SimpleSGD learning rate (train)")
    ap.add_argument("--serve", action="store_true",
                    help="time one mini-batch per stdin request instead (see the docstring)")
    ap.add_argument("--mem", default="2048",
                    help="DyNet memory pools in MB (dynet_config mem; allocating them is "
                         "part of the start-up, not of the timings); FOR,BACK,PARAM,SCRATCH "
                         "sizes each pool")
    ap.add_argument("--preload-split", default=None,
                    help="with --serve: load this split before reporting ready, so the "
                         "ready RSS includes the data the requests name")
    return ap


def _check_args(args: argparse.Namespace) -> None:
    if args.workload not in PEERS:
        raise PeerError(f"unknown workload {args.workload!r}; --workload must be one of "
                        f"{sorted(PEERS)}")
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        raise PeerError(f"unknown mode(s) {bad}; --modes takes one or more of {list(MODES)}")
    if args.preload_split is not None and not args.serve:
        raise PeerError("--preload-split needs --serve")
    for flag, value, low in (("--embed", args.embed, 1), ("--hidden", args.hidden, 1),
                             ("--batch-size", args.batch_size, 1),
                             ("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                             ("--minibatches", args.minibatches, 0)):
        if value < low:
            raise PeerError(f"{flag} {value} is invalid; pass an integer >= {low}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker; print the JSON report as the last stdout line. Return the exit code."""
    args = _parser().parse_args(argv)
    try:
        _check_args(args)
        wl: Any = sized_workload(args.workload, args.embed, args.hidden)
        arrays = load_params(args.params, wl.param_shapes(), args.workload)
        if args.preload_split is not None and args.preload_split not in wl.splits:
            raise PeerError(f"--preload-split {args.preload_split!r}: {args.workload} has the "
                            f"splits {', '.join(wl.splits)}")
    except (PeerError, ValueError) as e:
        print(f"dynet_peer: error: {e}", file=sys.stderr)
        return 2
    instances = wl.load(wl.default_eval_split)
    size = args.batch_size
    batches = [instances[s:s + size] for s in range(0, len(instances), size)]
    if args.minibatches:
        batches = batches[:args.minibatches]
    dy = init_dynet(args.autobatch, mem=args.mem)
    model, params = build_peer(dy, args.workload, arrays)
    if args.serve:
        if args.preload_split is not None:
            wl.load(args.preload_split)
        print(json.dumps({"ready": True, "contender": f"dynet_autobatch{args.autobatch}",
                          "sizes": [len(b) for b in batches], "rss_mb": _rss_now_mb()}),
              flush=True)
        serve(dy, _builder(dy, args.workload, params, args.hidden), batches, model, args.lr,
              sys.stdin, sys.stdout, lambda split, idx: [wl.load(split)[i] for i in idx])
        return 0
    report, losses = run_benchmark(dy, args.workload, params, model, args.hidden, batches,
                                   args.modes, repeats=args.repeats, warmup=args.warmup,
                                   lr=args.lr)
    out = {"contender": f"dynet_autobatch{args.autobatch}", "autobatch": args.autobatch,
           "workload": args.workload, "embed": args.embed, "hidden": args.hidden,
           "batch_size": size, "num_minibatches": len(batches),
           "items": sum(len(b) for b in batches), "losses": losses, **report}
    sys.stderr.flush()
    sys.stdout.flush()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
    raise SystemExit(main())
