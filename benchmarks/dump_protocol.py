"""ED-Batch's evaluation protocol on dumped graphs, end to end through the user commands.

Exports the first ``--graphs`` mini-batch graphs of a workload's train split (batch 64, in file
order, as ED-Batch's data loader takes them) as ED-Batch graph dumps, then for every seed runs
``experiments.train`` on the first ``--k`` dumps and ``experiments.evaluate`` on the rest, the
commands a user would type. Prints mean batches per test graph and the ratio to LB for the
learned FSM (mean +- std over seeds) and the heuristics, and writes the JSON summary.

The dumps this repository cannot ship (ED-Batch's ``B64`` folders) are condensed graphs: one
node per cell or loss. For lattices their statistics match edbatch's Lattice-LSTM cell graphs
once the state sums of every arity share one type (``--merge-sums``, the default for lattice
workloads): LB, DyNet agenda, depth and type-wise ratios then agree with
docs/architecture.md 3.11 to within a few percent. Pass ``--folder`` to run the protocol on
real dumps instead.

    python benchmarks/dump_protocol.py --workload lattice_lstm --seeds 0 1 2 3 4
    python benchmarks/dump_protocol.py --compose bilstm_B1 --graphs 8 --seeds 0 1
    python benchmarks/dump_protocol.py --folder PATH/lattice/B64 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HEURISTICS = ["dynet_agenda", "typewise_greedy", "typewise_greedy_backward", "critical_path"]
_SUM_RULE = (r".*\.sum[0-9]+", "sum")


def _run(args: list[str]) -> None:
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
    proc = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"command failed ({proc.returncode}): python -m {' '.join(args)}\n"
                         f"{proc.stderr[-3000:]}")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(workload: str, graphs: int, batch_size: int, merge_sums: bool, folder: Path) -> None:
    """Write the first ``graphs`` train mini-batches of ``workload`` as dumps."""
    from edbatch.workloads import make_workload
    from edbatch.workloads.dumps import export_dumps

    wl = make_workload(workload)
    batches = list(wl.batches("train", batch_size, limit=graphs))
    export_dumps(batches, folder, merge=[_SUM_RULE] if merge_sums else [])
    print(f"exported {len(batches)} {workload} graphs (batch {batch_size}, sums "
          f"{'merged' if merge_sums else 'by arity'}) to {folder}")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="lattice_lstm")
    ap.add_argument("--folder", type=Path, default=None,
                    help="existing dumps to evaluate on (skips the export)")
    ap.add_argument("--compose", default=None, metavar="B1_FOLDER",
                    help="build each graph from --batch-size dumps of this folder (e.g. "
                    "bilstm_B1), drawn with replacement, instead of exporting a workload")
    ap.add_argument("--graphs", type=int, default=20, help="graphs to export (G0..)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--merge-sums", action=argparse.BooleanOptionalAction, default=None,
                    help="one type for the sums of every arity (default: on for lattices)")
    ap.add_argument("--k", type=int, default=1, help="train (and select) on the first k dumps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--policy", default="fsm", help="policy config group option (fsm | "
                    "ed_batch_fsm)")
    ap.add_argument("--out", type=Path, default=Path("results/dump_protocol.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="edbatch-dumps-") as tmp:
        work = Path(tmp)
        folder = args.folder
        if folder is None and args.compose:
            folder = work / "dumps"
            compose(args.compose, args.batch_size, args.graphs, folder)
        elif folder is None:
            folder = work / "dumps"
            merge = args.merge_sums if args.merge_sums is not None else "lattice" in args.workload
            export(args.workload, args.graphs, args.batch_size, merge, folder)
        common = ["workload=dumps", f"workload.dumps.folder={folder}"]
        per_seed: dict[str, dict[int, float]] = defaultdict(dict)
        lb: dict[str, int] = {}
        for seed in args.seeds:
            run = work / f"seed{seed}"
            _run(["experiments.train", *common, f"policy={args.policy}",
                  f"train_split=first:{args.k}", f"val_split=first:{args.k}", "batch_size=1",
                  f"num_train_graphs={args.k}", f"num_val_graphs={args.k}", f"seed={seed}",
                  "progress=false", f"run_dir={run}"])
            scheds = ["fsm", *HEURISTICS] if seed == args.seeds[0] else ["fsm"]
            _run(["experiments.evaluate", "workload=[dumps]", f"workload.dumps.folder={folder}",
                  f"split=rest:{args.k}", "limit=null", f"scheduler=[{','.join(scheds)}]",
                  f"scheduler.fsm.path={run / 'policy.json'}", "progress=false",
                  f"hydra.run.dir={run / 'eval'}"])
            for r in _records(run / "eval" / "results.jsonl"):
                per_seed[r["scheduler"]].setdefault(seed, 0.0)
                per_seed[r["scheduler"]][seed] += r["num_batches"]
                lb[r["graph_id"]] = r["lower_bound"]
            print(f"seed {seed}: done", flush=True)
    n = len(lb)
    mean_lb = sum(lb.values()) / n
    rows = []
    for name, by_seed in per_seed.items():
        means = [b / n for b in by_seed.values()]
        m = statistics.fmean(means)
        sd = statistics.stdev(means) if len(means) > 1 else 0.0
        rows.append({"scheduler": name, "mean_batches": m, "std_over_seeds": sd,
                     "ratio_to_lb": m / mean_lb, "seeds": len(means)})
    print(f"\n{n} test graphs, mean LB {mean_lb:.1f}")
    print(f"{'scheduler':<26}{'batches':>18}{'x LB':>8}")
    for r in sorted(rows, key=lambda r: r["mean_batches"]):
        spread = f" +- {r['std_over_seeds']:.1f}" if r["seeds"] > 1 else ""
        print(f"{r['scheduler']:<26}{r['mean_batches']:>10.1f}{spread:>8}{r['ratio_to_lb']:>8.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"workload": args.workload, "folder": str(args.folder),
                                    "k": args.k, "seeds": args.seeds, "test_graphs": n,
                                    "mean_lb": mean_lb, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
