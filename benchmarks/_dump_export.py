"""Export and run steps of ``benchmarks/dump_protocol.py``: graphs written as dumps
(``export``, ``export_training``, ``compose``) and ``python -m`` runs of the entry points."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["compose", "export", "export_training", "run_module", "read_records"]

#: dumps merge every ``*.sumK`` op type into ``sum`` with ``--merge-sums``
SUM_RULE = (r".*\.sum[0-9]+", "sum")


def run_module(args: list[str]) -> None:
    """``python -m *args`` with W&B off unless set; exits with its stderr if it fails."""
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
    proc = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"command failed ({proc.returncode}): python -m {' '.join(args)}\n"
                         f"{proc.stderr[-3000:]}")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(workload: str, graphs: int, batch_size: int, merge_sums: bool, folder: Path,
           split: str = "train") -> None:
    """Write the first ``graphs`` mini-batches of ``workload``'s ``split`` as dumps."""
    from edbatch.workloads import make_workload
    from edbatch.workloads.dumps import export_dumps

    wl = make_workload(workload)
    if split not in wl.splits:
        raise SystemExit(f"--split {split!r}: {workload} has the splits {', '.join(wl.splits)}")
    batches = list(wl.batches(split, batch_size, limit=graphs))
    export_dumps(batches, folder, merge=[SUM_RULE] if merge_sums else [])
    print(f"exported {len(batches)} {workload} graphs (batch {batch_size}, sums "
          f"{'merged' if merge_sums else 'by arity'}) to {folder}")


def export_training(args: argparse.Namespace, merge: bool, evaluation: Path, folder: Path
                    ) -> list[str]:
    """The training folder of ``--train-graphs``: the evaluation folder's first ``--k`` dumps,
    then ``--train-graphs`` mini-batches of ``--train-split`` (disjoint from the evaluation
    dumps); returns where each training dump came from."""
    import numpy as np

    from edbatch.data.dumps import load_dump_folder
    from edbatch.workloads import make_workload
    from edbatch.workloads.dumps import export_dumps

    wl = make_workload(args.workload)
    batches, sources = [], []
    splits = args.train_split.split(",")
    for split in splits:
        if split not in wl.splits:
            raise SystemExit(f"--train-split {split!r}: {args.workload} has the splits "
                             f"{', '.join(wl.splits)}")
    bs = args.batch_size
    for rep in range(getattr(args, "train_shuffles", 0) + 1):
        for split in splits:
            skip = args.graphs * bs if split == args.split else 0  # the evaluation dumps'
            order = np.arange(skip, len(wl.load(split)))
            if rep:  # reshuffle S: the same instances cut into other mini-batches
                np.random.default_rng(rep).shuffle(order)
            for j, start in enumerate(range(0, len(order), bs)):
                if len(batches) < args.train_graphs:
                    batches.append(wl.minibatch(split, np.sort(order[start:start + bs])))
                    i = j + skip // bs
                    sources.append(f"{split}[{i}]" if not rep else f"{split}~{rep}[{j}]")
    if len(batches) < args.train_graphs:
        raise SystemExit(f"--train-graphs {args.train_graphs}: {args.train_split} holds only "
                         f"{len(batches)} mini-batches of {args.batch_size} disjoint from the "
                         f"evaluation dumps; lower it, add a split to --train-split or "
                         f"reshuffle them (--train-shuffles)")
    folder.mkdir(parents=True)
    for d in load_dump_folder(evaluation)[:args.k]:
        shutil.copy(d.path, folder / Path(d.path).name)
    paths = export_dumps(batches, folder / "extra", merge=[SUM_RULE] if merge else [])
    for j, path in enumerate(paths):  # G<k>, G<k+1>, ... after the copied G0..G<k-1>
        path.rename(folder / f"G{args.k + j}.txt")
    (folder / "extra").rmdir()
    print(f"exported {len(batches)} more training graphs ({', '.join(sources)}) to {folder}")
    return [f"G{i}.txt" for i in range(args.k)] + sources


def compose(src: str, per_graph: int, graphs: int, folder: Path, seed: int = 0) -> None:
    """Write ``graphs`` dumps, each the disjoint union of ``per_graph`` dumps of ``src`` drawn
    with replacement (batch-1 dumps -> batch-``per_graph`` graphs)."""
    import numpy as np

    from edbatch.workloads.dumps import DumpWorkload, export_dumps

    wl = DumpWorkload(src)
    rng = np.random.default_rng(seed)
    export_dumps([wl.minibatch("all", rng.integers(len(wl.dumps), size=per_graph))
                  for _ in range(graphs)], folder)
    print(f"composed {graphs} graphs of {per_graph} dumps of {src} into {folder}")
