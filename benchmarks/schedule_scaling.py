"""Schedulers on graph shapes the workloads do not have: seconds, batches and peak memory.

``python benchmarks/schedule_scaling.py``: every registered scheduler (or ``--schedulers``)
on four synthetic shapes, each run in a fresh subprocess under a wall-clock limit
(``--timeout``), so that a scheduler that blows up is reported, not waited for:

* ``chain``: one chain of 200,000 nodes alternating two op types (every heuristic is at LB);
* ``star``: one source read by 200,000 nodes of one type (2 batches);
* ``types``: a chain of 5,000 nodes, each of its own op type (5,000 types, at LB);
* ``wide``: 20,000 nodes of 2,000 op types, each reading a random earlier node (where the
  heuristics differ: critical path ~5,100 batches, depth ~12,700).

``--scale`` shrinks every size (``0.1``: a tenth). Printed per shape and scheduler: batches,
seconds (the scheduler's call, graph built before), the subprocess's peak RSS, or
``TIMEOUT`` / the error's last line. ``--out`` writes the rows as JSON. Timings depend on
the machine and its load: report them with both.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch, not an installed one
    sys.path.insert(0, str(ROOT))

from benchmarks import _args  # noqa: E402

__all__ = ["SHAPES", "build", "check_scale", "main", "shape_parser", "write_rows"]

#: shape -> (nodes, op types) at scale 1.
SHAPES = {"chain": (200_000, 2), "star": (200_000, 1), "types": (5_000, 5_000),
          "wide": (20_000, 2_000)}


def build(shape: str, scale: float) -> Any:
    """The graph of ``shape`` at ``scale`` (seeded: the same graph every run)."""
    import numpy as np

    from edbatch.graph import GraphBuilder, OpType, Vocab

    n, k = SHAPES[shape]
    n, k = max(2, int(n * scale)), max(1, min(int(k * scale) or 1, k))
    if shape == "types":
        k = n
    vocab = Vocab([OpType(f"t{i}", "affine", ((4,),), (4,)) for i in range(k)]
                  + [OpType("src", "input", (), (4,))])
    b = GraphBuilder(vocab)
    if shape == "wide":
        rng = np.random.default_rng(0)
        nodes = [b.add("src") for _ in range(10)]
        for _ in range(n):
            nodes.append(b.add(f"t{int(rng.integers(0, k))}",
                               nodes[int(rng.integers(0, len(nodes)))]))
        return b.build()
    x = b.add("src")
    for v in range(n):
        if shape == "star":
            b.add("t0", x)
        else:
            x = b.add(f"t{v % k}", x)
    return b.build()


def _child(shape: str, scale: float, name: str) -> None:
    """One measurement (in the subprocess): prints a JSON row."""
    from edbatch.schedule import make_scheduler

    graph = build(shape, scale)
    scheduler = make_scheduler(name)
    t0 = time.perf_counter()
    schedule = scheduler(graph)
    seconds = time.perf_counter() - t0
    schedule.validate(graph)
    print(json.dumps({"batches": schedule.num_batches, "seconds": seconds,
                      "nodes": graph.num_nodes, "types": len(graph.vocab),
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _measure(shape: str, scale: float, name: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", shape, str(scale), name]
    row: dict[str, Any] = {"shape": shape, "scheduler": name}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"TIMEOUT after {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        return {**row, "error": lines[-1][:160]}
    return {**row, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = shape_parser(__doc__.splitlines()[0], 1.0, 180, "scheduler")
    p.add_argument("--schedulers", nargs="+", default=None,
                   help="registry names (default: every registered scheduler)")
    args = p.parse_args(argv)
    check_scale(p, args.scale)
    from edbatch.schedule import SCHEDULERS
    names = args.schedulers or sorted(SCHEDULERS)
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown:
        p.error(f"argument --schedulers: unknown {unknown[0]!r}; choose from {sorted(SCHEDULERS)}")
    rows = []
    for shape in args.shapes:
        for name in names:
            row = _measure(shape, args.scale, name, args.timeout)
            rows.append(row)
            got = row.get("error") or (f"{row['batches']:8d} batches {row['seconds']:8.2f} s "
                                       f"{row['rss_mb']:7.0f} MB  ({row['nodes']} nodes, "
                                       f"{row['types']} types)")
            print(f"{shape:6s} {name:26s} {got}", flush=True)
    write_rows(args.out, rows)
    return rows


def shape_parser(description: str, scale: float, timeout: int, what: str
                 ) -> argparse.ArgumentParser:
    """The options of a run over the shapes: ``--shapes``, ``--scale``, ``--timeout`` (per
    ``what`` and shape), ``--out``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    p.add_argument("--scale", type=float, default=scale, help="size factor (0 < scale <= 1)")
    p.add_argument("--timeout", type=_args.positive, default=timeout,
                   help=f"seconds per {what} and shape")
    p.add_argument("--out", type=_args.out_file, default=None, help="JSON file for the rows")
    return p


def check_scale(p: argparse.ArgumentParser, scale: float) -> None:
    """One usage line unless ``0 < scale <= 1``."""
    if not 0 < scale <= 1:
        p.error(f"argument --scale: {scale} is not in (0, 1]")


def write_rows(out: Path | None, rows: list[dict[str, Any]]) -> None:
    """The rows as JSON into ``out`` (``None``: nowhere)."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        _args.run(main)
