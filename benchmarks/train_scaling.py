"""Trainers on graph shapes the workloads do not have: seconds, peak memory, what they report.

``python benchmarks/train_scaling.py``: ``experiments.train`` with every trainer config (or
``--trainers``) on the shapes of :mod:`benchmarks.schedule_scaling` (``--scale``, default
0.05: a 10,000-node chain and star, a chain of 250 op types, a 1,000-node DAG of 100 op
types), each shape written as ED-Batch dumps (four copies: ``train_split=first:1
val_split=first:1 batch_size=1``, the other three unseen), each run a fresh process under a
wall-clock limit (``--timeout``), so that a trainer that blows up is reported, not waited for.

Printed per shape and trainer: the exit status, seconds, the process's peak RSS and its last
line (what it learned over its fallback on the unseen graphs, why it learned nothing, or the
one-line error). ``--out`` writes the rows as JSON. Timings depend on the machine and load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch, not an installed one
    sys.path.insert(0, str(ROOT))

from benchmarks import _args  # noqa: E402
from benchmarks.schedule_scaling import build, check_scale, shape_parser, write_rows  # noqa: E402

__all__ = ["TRAINERS", "main", "measure", "write_shape"]

#: every trainer config of ``experiments.train`` (``conf/trainer/*.yaml``)
TRAINERS = tuple(sorted(p.stem for p in (ROOT / "conf" / "trainer").glob("*.yaml")))

#: the child's peak RSS (KB) is written here at exit (see :func:`_child`)
_RSS_ENV = "EDBATCH_TRAIN_SCALING_RSS"


def write_shape(shape: str, scale: float, folder: Path) -> tuple[int, int]:
    """Four copies of ``shape`` at ``scale`` as dumps ``folder/G0..G3``; (nodes, op types)."""
    from edbatch.workloads.dumps import export_dumps

    graph = build(shape, scale)
    export_dumps([graph] * 4, folder)
    return graph.num_nodes, len(graph.vocab)


def _child(argv: list[str]) -> None:
    """``experiments.train`` with ``argv``, the peak RSS written at exit (even on an error)."""
    import atexit
    import resource
    import runpy

    def rss() -> None:
        Path(os.environ[_RSS_ENV]).write_text(
            str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    atexit.register(rss)
    sys.argv = ["experiments.train", *argv]
    runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


def measure(folder: Path, trainer: str, timeout: float, work: Path) -> dict[str, Any]:
    """One ``experiments.train`` run on the dumps in ``folder``: ``rc``, ``seconds``,
    ``rss_mb``, ``line`` (its last line), or ``error`` (``TIMEOUT ...``)."""
    run_dir = work / f"run_{folder.name}_{trainer}"  # (a folder is bound to its config)
    rss = work / f"rss_{folder.name}_{trainer}"
    argv = ["workload=dumps", f"workload.dumps.folder={folder}", "train_split=first:1",
            "val_split=first:1", "batch_size=1", f"trainer={trainer}", f"run_dir={run_dir}",
            "progress=false"]
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
           _RSS_ENV: str(rss)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *argv]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"trainer": trainer, "error": f"TIMEOUT after {timeout:.0f} s"}
    seconds = time.perf_counter() - t0
    lines = [x for x in (proc.stdout + "\n" + proc.stderr).splitlines()
             if x.strip() and not x.startswith(("[", "(set "))]  # (log records, the hint)
    row: dict[str, Any] = {"trainer": trainer, "rc": proc.returncode, "seconds": seconds,
                           "line": (lines[-1] if lines else "(no output)")[:300]}
    if rss.is_file():
        row["rss_mb"] = int(rss.read_text()) / 1024
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = shape_parser(__doc__.splitlines()[0], 0.05, 300, "trainer")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS),
                   metavar="TRAINER", help=f"trainer configs (default: all of {TRAINERS})")
    args = p.parse_args(argv)
    check_scale(p, args.scale)
    rows = []
    with tempfile.TemporaryDirectory(prefix="train_scaling_") as tmp:
        for shape in args.shapes:
            folder = Path(tmp) / shape
            nodes, types = write_shape(shape, args.scale, folder)
            for trainer in args.trainers:
                row = {"shape": shape, "nodes": nodes, "types": types,
                       **measure(folder, trainer, args.timeout, Path(tmp))}
                rows.append(row)
                got = row.get("error") or (f"rc {row['rc']} {row['seconds']:7.1f} s "
                                           f"{row.get('rss_mb', 0):6.0f} MB  {row['line']}")
                print(f"{shape:6s} {trainer:16s} {got}", flush=True)
    write_rows(args.out, rows)
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
    else:
        _args.run(main)
