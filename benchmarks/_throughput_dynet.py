"""The throughput benchmark's DyNet peers: one ``benchmarks/dynet_peer.py`` worker per
autobatch mode, either serving passes interleaved with edbatch's (:func:`start_peers`) or
run as one block (:func:`dynet_worker_rows`), on edbatch's seed-0 parameters."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._dynet_server import DynetServer, PeerServerError
from benchmarks._throughput_passes import log
from benchmarks._throughput_report import dynet_rows
from edbatch.executor import init_params
from edbatch.workloads import Workload

__all__ = ["BATCH_SIZE", "DYNET_CONTENDERS", "ROOT", "best_of", "dims", "dynet_available",
           "dynet_worker_rows", "peer_cmd", "peer_env", "save_peer_params",
           "start_peers"]

ROOT = Path(__file__).resolve().parents[1]
DYNET_CONTENDERS = ("dynet_autobatch0", "dynet_autobatch1", "dynet_autobatch2")
BATCH_SIZE = 64


def dims(size: str) -> tuple[int, int]:
    """``"300x150"`` -> ``(300, 150)``."""
    embed, hidden = size.split("x")
    return int(embed), int(hidden)


def dynet_available() -> bool:
    """Whether ``import dynet`` would work in a subprocess."""
    return importlib.util.find_spec("dynet") is not None


def save_peer_params(folder: Path, name: str, size: str, wl: Workload) -> Path:
    """edbatch's initial parameters (seed 0) as the ``.npz`` the DyNet worker loads."""
    path = folder / f"{name}_{size}.npz"
    params = init_params(wl, torch.Generator().manual_seed(0))
    np.savez(path, **{k: t.detach().numpy() for k, t in params.items()})  # type: ignore
    return path


def peer_cmd(name: str, size: str, contender: str, num_minibatches: int,
              args: argparse.Namespace, path: Path, *, serve: bool = False) -> list[str]:
    """The DyNet worker's command line for one autobatch mode."""
    embed, hidden = dims(size)
    return [sys.executable, str(args.dynet_peer), "--workload", name, "--embed", str(embed),
            "--hidden", str(hidden), "--autobatch", contender[-1], "--batch-size",
            str(BATCH_SIZE), "--minibatches", str(num_minibatches), "--repeats",
            str(args.repeats), "--warmup", str(args.warmup), "--params", str(path),
            "--modes", *args.modes, *(["--serve"] if serve else [])]


def peer_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def start_peers(stack: ExitStack, name: str, size: str, wl: Workload, num_minibatches: int,
                 args: argparse.Namespace, errors: list[str]) -> dict[str, DynetServer]:
    """One serving DyNet worker per requested autobatch mode (closed with ``stack``); a
    worker that fails to start is recorded in ``errors`` and left out."""
    peers: dict[str, DynetServer] = {}
    # kept while the workers live: the memory probe starts more workers from these parameters
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="throughput-"))
    path = save_peer_params(Path(tmp), name, size, wl)
    for contender in (c for c in args.contenders if c in DYNET_CONTENDERS):
        cmd = peer_cmd(name, size, contender, num_minibatches, args, path, serve=True)
        log(f"  {name} {size} {contender} (interleaved): {' '.join(cmd[1:])}")
        try:
            peers[contender] = stack.enter_context(DynetServer(cmd, peer_env(), ROOT))
        except PeerServerError as e:
            errors.append(f"{name} {size} {contender}: {e}")
            log(errors[-1])
    return peers


def dynet_worker_rows(name: str, size: str, wl: Workload, num_minibatches: int,
                args: argparse.Namespace, errors: list[str]) -> list[dict[str, Any]]:
    """One worker subprocess per autobatch mode; rows for every requested mode."""
    embed, hidden = dims(size)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        path = save_peer_params(Path(tmp), name, size, wl)
        for contender in (c for c in args.contenders if c in DYNET_CONTENDERS):
            cmd = peer_cmd(name, size, contender, num_minibatches, args, path)
            log(f"  {name} {size} {contender}: {' '.join(cmd[1:])}")
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                  env=peer_env(), check=False)
            try:
                report = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                errors.append(f"{name} {size} {contender}: worker exited {proc.returncode}: "
                              f"{proc.stderr.strip()[-600:]}")
                log(errors[-1])
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
