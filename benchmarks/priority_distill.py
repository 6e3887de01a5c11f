"""The priority policy distilled into an FSM table (issue 31), seed by seed, on unseen graphs.

Per seed: the priority teacher (``trainer=priority``, CEM; loaded from ``--dir`` if it was
trained before, else trained as the issue's tables train it: lattices 24 shuffled training
mini-batches, 70 x 57 candidates, elite 8; module networks 4, 30 x 33, elite 6), then
:class:`policies.priority_distill.PriorityDistiller` (DAgger, every key of
``DEFAULT_KEYS``, the best on training graphs kept) labelling the training split's
mini-batches (``--reshuffles`` shuffles of it), then on the ``test`` mini-batches: critical
path (the FSM's fallback alone), the best deterministic heuristic, the teacher and the FSM,
with the share of the teacher's gain over critical path the FSM keeps::

    python -m benchmarks.priority_distill --workload module_net --seeds 0 1 2
    python -m benchmarks.priority_distill --workload lattice_lstm --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import _args
from edbatch.schedule import lower_bound
from edbatch.schedule.named import HEURISTICS, make_heuristic
from edbatch.workloads import make_workload
from experiments._common import graph_set
from policies.priority import PriorityPolicy
from policies.priority_distill import PriorityDistiller
from policies.priority_train import PriorityTrainer

#: workload -> (training mini-batches, iterations, population, elite) of the teacher.
TEACHER = {"lattice_lstm": (24, 70, 56, 8), "module_net": (4, 30, 32, 6)}


def _val(wl, name: str) -> list:  # type: ignore[no-untyped-def]
    """The validation graphs the issue's tables use (lattices: 2 unshuffled training
    mini-batches, as ``benchmarks.priority_lattice``; else 2 of the validation split)."""
    split = "train" if name == "lattice_lstm" else wl.default_val_split
    return graph_set(wl, split, 64, 2)


def teacher_for(name: str, seed: int, folder: Path) -> PriorityPolicy:
    """The seed's priority policy: loaded from ``folder`` or trained and saved there."""
    path = folder / name / f"seed{seed}" / "priority.json"
    if path.is_file():
        return PriorityPolicy.load(path)
    wl = make_workload(name)
    n, it, pop, elite = TEACHER.get(name, (4, 30, 32, 6))
    train = graph_set(wl, "train", 64, n, shuffle_seed=seed)
    p = PriorityTrainer(it, pop, elite, seed=seed).fit(train, _val(wl, name)).policy
    p.save(path)
    return p


def main(argv: Sequence[str] | None = None) -> dict[int, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="module_net")
    ap.add_argument("--seeds", type=_args.seed, nargs="+", default=[0])
    ap.add_argument("--dir", type=Path, default=Path("runs/distill"))
    ap.add_argument("--label-graphs", type=int, default=62,
                    help="training mini-batches per shuffle to label (lattices have 18)")
    ap.add_argument("--reshuffles", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    wl = make_workload(args.workload)
    test = graph_set(wl, "test", 64, 8)
    lb = sum(lower_bound(g) for g in test)
    heur = {h: sum(make_heuristic(h)(g).num_batches for g in test) for h in HEURISTICS}
    best = min(heur, key=lambda h: heur[h])
    cp = heur["critical_path"]
    print(f"{args.workload}: {len(test)} test graphs, LB {lb}; critical path {cp / lb:.4f} "
          f"x LB, best heuristic {best} {heur[best] / lb:.4f}")
    print("| seed | teacher x LB | FSM x LB | gain kept | states | hit rate | key | "
          "distil s |\n|---|---|---|---|---|---|---|---|")
    kept = {}
    for seed in args.seeds:
        teacher = teacher_for(args.workload, seed, args.dir)
        label = [g for r in range(args.reshuffles)
                 for g in graph_set(wl, "train", 64, args.label_graphs,
                                    shuffle_seed=seed + 1000 * r)]
        t0 = time.process_time()
        fsm = PriorityDistiller(rounds=args.rounds).fit(teacher, label,
                                                         _val(wl, args.workload)).policy
        sec = time.process_time() - t0
        fsm.save(args.dir / args.workload / f"seed{seed}" / "priority_fsm.json")
        tb = sum(teacher(g).num_batches for g in test)
        fsm.reset_stats()
        fb = sum(fsm(g).num_batches for g in test)
        kept[seed] = (cp - fb) / (cp - tb) if cp != tb else float("nan")
        key = fsm.metadata.get("key", {})
        print(f"| {seed} | {tb / lb:.4f} | {fb / lb:.4f} | {100 * kept[seed]:.1f}% | "
              f"{fsm.num_states} | {fsm.hit_rate:.3f} | {key.get('kind')} "
              f"{'/'.join(key.get('features', []))} | {sec:.0f} |", flush=True)
    print(f"mean gain kept {100 * statistics.fmean(kept.values()):.1f}% over seeds "
          f"{args.seeds} ({len(label)} label graphs per seed)")
    return kept


if __name__ == "__main__":
    _args.run(main)
