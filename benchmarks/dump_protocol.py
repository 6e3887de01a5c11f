"""ED-Batch's evaluation protocol on dumped graphs, end to end through the user commands.

Exports the first ``--graphs`` mini-batch graphs of a workload's train split (batch 64, in file
order, as ED-Batch's data loader takes them) as ED-Batch graph dumps, then for every seed runs
``experiments.train`` on the first ``--k`` dumps and ``experiments.evaluate`` on the rest, the
commands a user would type. Prints mean batches per test graph and the ratio to LB for the
learned FSM (mean +- std over seeds) and the heuristics, and writes the JSON summary.

Per seed it also reports the FSM's number of states, its table hit rate on the test graphs
(its own decisions, lookahead off), its training time, and the ablation row
``fsm_fallback_only``: the same fallback (and lookahead) with an empty table, i.e. what the
learned table adds. The JSON ``rows`` carry ``states``, ``hit_rate`` and ``ratio_to_lb``;
``graphs`` holds one row per (scheduler, seed, test graph), graphs named by file (``G1.txt``).

``--policy ed_batch_fsm`` trains with ED-Batch's learner (``--trainer ed_batch``) by default;
``--trainer`` picks any ``conf/trainer`` option (``expert``: expert iteration). ``--lookahead``
overrides how the trained FSM schedules graphs (``none``: table lookups only).

``--priority`` also trains the priority policy per seed (``experiments.train
trainer=priority`` on the same training dumps; ``--priority-extra`` passes its overrides) and
scores it beside the FSM and the heuristics (row ``priority``; states = learned weights, hit
rate = share of decisions overriding critical path, ``priority_fallback_only`` = critical
path); ``--trainer priority`` alone is refused (the FSM rows need an FSM).

Every scheduler is also reported against the **path bound** of each test graph (``x bound``,
JSON ``ratio_to_path_bound``, ``mean_path_bound``, per graph ``path_bound``):
:func:`edbatch.schedule.path_lower_bound`, a proven lower bound on the batches of any
schedule that is at least LB (shortest common supersequences of long paths' op-type
sequences), so ``x bound`` is an upper bound on how far a schedule is from the optimum.
``--no-path-bound`` skips it (a few seconds per graph).

The test graphs are ``split=rest:K`` (every dump after the first K). To score a policy on every
dump of a folder, G0 included, run ``python -m experiments.evaluate workload=[dumps]
workload.dumps.folder=PATH split=all ...``: ``split=all`` means all dumps in file order.

The dumps this repository cannot ship (ED-Batch's ``B64`` folders) are condensed graphs: one
node per cell or loss. For lattices their statistics match edbatch's Lattice-LSTM cell graphs
once the state sums of every arity share one type (``--merge-sums``, the default for lattice
workloads): LB, DyNet agenda, depth and type-wise ratios then agree with
docs/architecture.md 3.11 to within a few percent. Pass ``--folder`` to run the protocol on
real dumps instead.

``--train-graphs N`` trains on more distinct graphs: the first ``--k`` dumps plus ``N``
mini-batches of ``--workload`` exported (same batch size and sum merging) from
``--train-split`` (default ``test,dev``: lattices the evaluation dumps do not hold; the
evaluation dumps' own ``--split`` starts after the ``--graphs`` exported ones). The test
graphs stay ``rest:K`` of the evaluation folder, so every variant is scored on the same
unseen graphs; ``--k 0`` trains on the extra graphs alone and tests on every exported dump.
Pair it with ``--extra trainer.augment=0`` (distinct graphs instead of resampled ones).
``--train-shuffles S`` adds S reshuffles of those instances cut into other mini-batches.

The summary goes to ``--out`` (default: under the system temp folder, never the checkout);
``--keep`` keeps each seed's trained policy and evaluation records beside it.

    python benchmarks/dump_protocol.py --workload lattice_lstm --seeds 0 1 2 3 4
    python benchmarks/dump_protocol.py --trainer expert --lookahead none --keep
    python benchmarks/dump_protocol.py --trainer expert --lookahead none --split test \\
        --graphs 5 --k 0 --train-split train --train-graphs 16 --extra trainer.augment=0
    python benchmarks/dump_protocol.py --trainer q_learning --lookahead none --priority \
        --priority-extra trainer.iterations=60 trainer.population=48 trainer.elite=8
    python benchmarks/dump_protocol.py --compose bilstm_B1 --graphs 8 --seeds 0 1
    python benchmarks/dump_protocol.py --folder PATH/lattice/B64 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _args
from benchmarks._dump_export import compose, export, export_training, read_records, run_module
from benchmarks._dump_stats import (
    add_priority,
    graph_names,
    path_bounds,
    summary_rows,
    table_stats,
)

HEURISTICS = ["dynet_agenda", "typewise_greedy", "typewise_greedy_backward", "critical_path"]
#: The trainer each policy option trains with unless ``--trainer`` says otherwise.
DEFAULT_TRAINER = {"fsm": "q_learning", "ed_batch_fsm": "ed_batch"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="test graphs are split=rest:K; split=all (G0 included) "
                                 "is every dump of the folder, for experiments.evaluate")
    ap.add_argument("--workload", default="lattice_lstm")
    ap.add_argument("--folder", type=Path, default=None,
                    help="existing dumps to evaluate on (skips the export)")
    ap.add_argument("--compose", default=None, metavar="B1_FOLDER",
                    help="build each graph from --batch-size dumps of this folder (e.g. "
                    "bilstm_B1), drawn with replacement, instead of exporting a workload")
    ap.add_argument("--graphs", type=int, default=20, help="graphs to export (G0..)")
    ap.add_argument("--split", default="train",
                    help="the workload split the dumps are exported from (its first mini-batches)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--merge-sums", action=argparse.BooleanOptionalAction, default=None,
                    help="one type for the sums of every arity (default: on for lattices)")
    ap.add_argument("--k", type=int, default=1, help="train (and select) on the first k dumps")
    ap.add_argument("--train-graphs", type=int, default=0, metavar="N",
                    help="train on the first k dumps plus N distinct mini-batches exported "
                    "from --train-split (not the test graphs); needs --workload, not --folder")
    ap.add_argument("--train-split", default="test,dev",
                    help="workload splits the --train-graphs come from, in order (--split "
                    "itself: after the --graphs exported ones)")
    ap.add_argument("--train-shuffles", type=int, default=0, metavar="S",
                    help="after the consecutive --train-split mini-batches, S reshuffles of "
                    "the same instances (seeds 1..S) cut into other mini-batches")
    ap.add_argument("--seeds", type=_args.seed, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--policy", default="fsm", help="policy config group option (fsm | "
                    "ed_batch_fsm)")
    ap.add_argument("--trainer", default=None, help="trainer config group option (q_learning "
                    "| ed_batch | expert | maskable_ppo | dqn); default: q_learning for fsm, "
                    "ed_batch (ED-Batch's learner) for ed_batch_fsm")
    ap.add_argument("--lookahead", choices=("none", "rollout", "rollout2", "search"),
                    default=None,
                    help="how the FSM schedules graphs (default: the policy option's)")
    ap.add_argument("--out", type=_args.out_file, default=None,
                    help="summary JSON (default: <tmp>/edbatch-dump-protocol/<label>.json)")
    ap.add_argument("--path-bound", action=argparse.BooleanOptionalAction, default=True,
                    help="also report every scheduler against the path lower bound "
                    "(edbatch.schedule.path_bound; a few seconds per test graph)")
    ap.add_argument("--keep", action="store_true",
                    help="keep each seed's policy.json and eval records in <out stem>_runs/")
    ap.add_argument("--extra", nargs="*", default=[], metavar="OVERRIDE",
                    help="more experiments.train overrides (e.g. trainer.rounds=3)")
    ap.add_argument("--priority", action="store_true",
                    help="also train and score the priority policy (trainer=priority)")
    ap.add_argument("--priority-extra", nargs="*", default=[], metavar="OVERRIDE",
                    help="experiments.train overrides of the priority run "
                    "(e.g. trainer.iterations=60)")
    args = ap.parse_args(argv)
    if args.trainer == "priority":
        ap.error("--trainer priority: the FSM rows need an FSM trainer; pass --priority to "
                 "score the priority policy beside it")
    if args.train_graphs < 0:
        ap.error(f"--train-graphs must be >= 0, got {args.train_graphs}")
    if args.train_shuffles < 0:
        ap.error(f"--train-shuffles must be >= 0, got {args.train_shuffles}")
    if args.k < 0 or (args.k == 0 and not args.train_graphs):
        ap.error(f"--k must be >= 1 (or 0 with --train-graphs: train on those only), "
                 f"got {args.k}")
    if args.train_graphs and (args.folder is not None or args.compose):
        ap.error("--train-graphs exports more training graphs from --workload, so it cannot "
                 "be used with --folder or --compose (there, train on more dumps with --k)")
    return args


def workload_label(args: argparse.Namespace) -> str:
    """The name results carry: the exported workload, the composed folder, or the dump
    folder's own name (its parent's for ED-Batch's ``B64``-style batch folders)."""
    if args.folder is not None:
        folder = Path(args.folder)
        if re.fullmatch(r"B\d+", folder.name) and folder.parent.name:
            return f"{folder.parent.name}_{folder.name}"
        return folder.name
    if args.compose:
        return f"{Path(args.compose).name}_x{args.batch_size}"
    return args.workload


def default_out(label: str) -> Path:
    """Where the summary goes without ``--out``: outside any checkout."""
    return Path(tempfile.gettempdir()) / "edbatch-dump-protocol" / f"{label}.json"


def train_overrides(args: argparse.Namespace, folder: Path, seed: int, run: Path,
                    num_types: int | None = None) -> list[str]:
    """The ``experiments.train`` overrides of one seed (``folder``: the training dumps, the
    first ``k + train_graphs`` of which are trained on)."""
    trainer = args.trainer or DEFAULT_TRAINER.get(args.policy, "q_learning")
    n = args.k + args.train_graphs
    out = ["workload=dumps", f"workload.dumps.folder={folder}", f"policy={args.policy}",
           f"trainer={trainer}", f"train_split=first:{n}", f"val_split=first:{n}",
           "batch_size=1", f"num_train_graphs={n}", f"num_val_graphs={n}",
           f"seed={seed}", "progress=false", f"run_dir={run}"]
    if num_types is not None:
        out.append(f"++workload.dumps.num_types={num_types}")
    if args.lookahead is not None:
        out.append(f"++trainer.lookahead={args.lookahead}")
    return out + list(args.extra)


def priority_overrides(args: argparse.Namespace, folder: Path, seed: int, run: Path,
                       num_types: int | None = None) -> list[str]:
    """The ``experiments.train trainer=priority`` overrides of one seed (same graphs; not
    ``--extra``, which is the FSM trainer's: ``--priority-extra`` instead)."""
    fsm = train_overrides(args, folder, seed, run, num_types)
    out = [o for o in fsm[:len(fsm) - len(args.extra)]  # --extra is the FSM trainer's
           if not o.startswith(("trainer=", "++trainer.lookahead="))]
    return [*out, "trainer=priority", *args.priority_extra]


def train_priority(args: argparse.Namespace, folder: Path, seed: int, run: Path,
                   num_types: int | None) -> list[str]:
    """With ``--priority``: train the priority policy into ``run``; return the evaluation's
    override naming it (else nothing)."""
    if not args.priority:
        return []
    run_module(["experiments.train", *priority_overrides(args, folder, seed, run, num_types)])
    return [f"scheduler.priority.path={run / 'policy.json'}"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    label = workload_label(args)
    out = args.out or default_out(label)
    with tempfile.TemporaryDirectory(prefix="edbatch-dumps-") as tmp:
        work = Path(tmp)
        folder = args.folder
        if folder is None and args.compose:
            folder = work / "dumps"
            compose(args.compose, args.batch_size, args.graphs, folder)
        elif folder is None:
            folder = work / "dumps"
            merge = args.merge_sums if args.merge_sums is not None else "lattice" in args.workload
            export(args.workload, args.graphs, args.batch_size, merge, folder, args.split)
        train_folder, num_types, trained_on = folder, None, None
        if args.train_graphs:
            from edbatch.workloads.dumps import DumpWorkload

            train_folder = work / "train_dumps"
            trained_on = export_training(args, merge, folder, train_folder)
            num_types = max(DumpWorkload(f).num_types for f in (folder, train_folder))
        names = graph_names(folder, args.k)
        per_seed: dict[str, dict[int, float]] = defaultdict(dict)
        per_graph: list[dict[str, Any]] = []
        seed_stats: list[dict[str, Any]] = []
        lb: dict[str, int] = {}
        for seed in args.seeds:
            run = work / f"seed{seed}"
            run_module(["experiments.train",
                        *train_overrides(args, train_folder, seed, run, num_types)])
            scheds = ["fsm", *(["priority"] if args.priority else []),
                      *(HEURISTICS if seed == args.seeds[0] else [])]
            prio = run / "priority"
            prio_eval = train_priority(args, train_folder, seed, prio, num_types)
            run_module(["experiments.evaluate", "workload=[dumps]",
                        f"workload.dumps.folder={folder}", f"split=rest:{args.k}", "limit=null",
                        f"scheduler=[{','.join(scheds)}]",
                        f"scheduler.fsm.path={run / 'policy.json'}", "progress=false",
                        *prio_eval, f"hydra.run.dir={run / 'eval'}",
                        *([f"++workload.dumps.num_types={num_types}"] if num_types else [])])
            for r in read_records(run / "eval" / "results.jsonl"):
                graph = names[int(r["graph_id"].rsplit("/", 1)[1])]
                per_seed[r["scheduler"]].setdefault(seed, 0.0)
                per_seed[r["scheduler"]][seed] += r["num_batches"]
                lb[graph] = r["lower_bound"]
                per_graph.append({"scheduler": r["scheduler"], "seed": seed, "graph": graph,
                                  "num_batches": r["num_batches"],
                                  "lower_bound": r["lower_bound"]})
            stats = table_stats(run / "policy.json", folder, args.k, num_types)
            for graph, b in stats.pop("fallback_only").items():
                per_seed["fsm_fallback_only"][seed] = per_seed["fsm_fallback_only"].get(
                    seed, 0.0) + b
                per_graph.append({"scheduler": "fsm_fallback_only", "seed": seed,
                                  "graph": graph, "num_batches": b, "lower_bound": lb[graph]})
            seed_stats.append({"seed": seed, **stats})
            if args.priority:
                seed_stats[-1]["priority"] = add_priority(prio / "policy.json", folder, args.k,
                                                          num_types, seed, per_seed)
            print(f"seed {seed}: {stats['states']} states, hit rate {stats['hit_rate']:.3f}, "
                  f"trained in {stats['train_seconds'] or 0:.1f}s (fallback "
                  f"{stats['fallback']}, lookahead {stats['lookahead']})", flush=True)
            if args.keep:
                kept = out.parent / f"{out.stem}_runs" / f"seed{seed}"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(run, kept)
        bounds = path_bounds(folder, args.k, names) if args.path_bound else {}
    for row in per_graph:
        if row["graph"] in bounds:
            row["path_bound"] = bounds[row["graph"]]
    rows = summary_rows(per_seed, lb, seed_stats, bounds)
    n, mean_lb = len(lb), sum(lb.values()) / len(lb)
    mean_pb = sum(bounds.values()) / len(bounds) if bounds else None
    print(f"\n{label}: {n} test graphs, mean LB {mean_lb:.1f}"
          + (f", mean path bound {mean_pb:.1f} ({mean_pb / mean_lb:.4f} x LB: no schedule "
             f"needs fewer)" if mean_pb else ""))
    print(f"{'scheduler':<26}{'batches':>18}{'x LB':>8}{'x bound' if bounds else '':>8}"
          f"{'states':>8}{'hit rate':>10}")
    for r in sorted(rows, key=lambda r: r["mean_batches"]):
        spread = f" +- {r['std_over_seeds']:.1f}" if r["seeds"] > 1 else ""
        to_pb = f"{r['ratio_to_path_bound']:>8.3f}" if bounds else f"{'':>8}"
        extra = (f"{r['states']:>8.1f}{r['hit_rate']:>10.3f}" if "states" in r else "")
        print(f"{r['scheduler']:<26}{r['mean_batches']:>10.1f}{spread:>8}"
              f"{r['ratio_to_lb']:>8.3f}{to_pb}{extra}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": label, "folder": str(args.folder), "k": args.k,
                               "policy": args.policy, "trainer": args.trainer
                               or DEFAULT_TRAINER.get(args.policy, "q_learning"),
                               "lookahead": args.lookahead, "seeds": args.seeds,
                               "priority": args.priority,
                               "train_graphs": args.train_graphs, "trained_on": trained_on,
                               "test_graphs": n, "mean_lb": mean_lb,
                               "mean_path_bound": mean_pb, "rows": rows,
                               "per_seed": seed_stats, "graphs": per_graph}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    _args.run(main)
