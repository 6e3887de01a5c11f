"""The priority policy on the main job's lattice graphs, seed by seed (issue 31's table).

The graphs of ``python -m experiments.compare`` for ``lattice_lstm`` (batch 64): per seed 16
``train`` mini-batches shuffled by the seed, the 2 unshuffled validation mini-batches and the
5 ``test`` mini-batches; trains :class:`policies.priority_train.PriorityTrainer` (the
guarded CEM) and prints test batches / LB per seed, the mean, and critical path's ratio::

    python -m benchmarks.priority_lattice --seeds 0 1 2 3 4   # 60 x 49 candidates, elite 8
    python -m benchmarks.priority_lattice --seeds 0 1 2 3 4 --iterations 70 --population 56 \
        --num-train-graphs 24   # 2026-11-26: mean 1.190 x LB, about 3 min CPU per seed

``--dumps`` runs the held-out dump protocol of ``benchmarks/dump_protocol.py --priority``
in one process instead (the same graphs and trainer: G0 plus ``--num-train-graphs``
exported ``test,dev`` mini-batches with ``--train-shuffles`` reshuffles, validation = the
training graphs, tested on the unseen dumps G1-G17) without the FSM rows::

    python -m benchmarks.priority_lattice --dumps --seeds 0 1 2 --iterations 70 \
        --population 56 --num-train-graphs 24 --far

``--afterstate`` trains the afterstate priority policy (:mod:`policies.afterstate_train`:
the priority features plus a one-step afterstate value on the remaining lower bound, a
lookahead) with the same CEM budget; ``--imitate`` starts it from the imitation of the
critical-path rollout teacher (:mod:`policies.afterstate_imitate`; ``--iterations 0``: the
imitation alone, the same for every seed)::

    python -m benchmarks.priority_lattice --dumps --seeds 0 1 2 --iterations 70 \
        --population 56 --num-train-graphs 24 --context --afterstate [--imitate]

``--lean`` (with ``--imitate``): the imitation fits only the first 15 priority features and
the afterstate ones, so the compiled loop skips the release-dependent context rows (the
cheaper variant; ``--iterations 0``: it alone). ``--extra miss2 ...`` (or ``all``) also
fits / searches the extra afterstate columns (:data:`policies.afterstate.EXTRA_FEATURES`:
two-step lookahead, margins; else their weights stay 0). ``--teacher-rounds N`` (with
``--imitate``) adds approximate policy iteration (:mod:`policies.afterstate_api`: the
student's states labelled by rollouts over it, ``--rollout-base both``: over the better of
it and critical path; ``--aggregate``, ``--warm``). ``--values`` (with ``--imitate``): fit
the teacher's rollout *values* by ridge regression instead of its choices
(:mod:`policies.afterstate_values`; the best held-out variant: ``--extra all``, no ``--lean``).

``--dagger-rounds N`` adds DAgger imitation of a rollout teacher after the CEM
(:mod:`policies.priority_dagger`; ``--teacher``, ``--weighting``, ``--dagger-first``; with
``--hidden-units H`` the CEM searches the linear weights and DAgger fits the MLP)::

    python -m benchmarks.priority_lattice --dumps --seeds 0 --iterations 70 --population 56 \
        --num-train-graphs 24 --hidden-units 16 --dagger-rounds 2 --teacher both \
        --weighting spread
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import _args
from edbatch.schedule import lower_bound, make_scheduler
from edbatch.workloads import make_workload
from experiments._common import graph_set
from policies.afterstate import EXTRA_FEATURES
from policies.afterstate_train import AfterstateTrainer
from policies.priority_train import PriorityTrainer


def main(argv: Sequence[str] | None = None) -> dict[int, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="lattice_lstm")
    ap.add_argument("--seeds", type=_args.seed, nargs="+", default=[0])
    ap.add_argument("--num-train-graphs", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--population", type=int, default=48)
    ap.add_argument("--elite", type=int, default=8)
    ap.add_argument("--hidden-units", type=int, default=0)
    ap.add_argument("--api-rounds", type=int, default=0,
                    help="rollout policy-iteration rounds after the CEM (trainer.api_rounds)")
    ap.add_argument("--far", action="store_true",
                    help="also search feature far's weights (trainer.far=true)")
    ap.add_argument("--dagger-rounds", type=int, default=0,
                    help="DAgger rounds imitating a rollout teacher (trainer.dagger_rounds)")
    ap.add_argument("--teacher", default="critical_path",
                    help="the DAgger teacher's rollout base: critical_path, student, both")
    ap.add_argument("--weighting", default="uniform", help="DAgger loss: uniform, spread")
    ap.add_argument("--context", action="store_true",
                    help="also search / fit the context features' weights (trainer.context)")
    ap.add_argument("--dagger-first", action="store_true",
                    help="DAgger from critical path before the CEM (default: after it)")
    ap.add_argument("--afterstate", action="store_true",
                    help="train the afterstate priority policy instead (policies.afterstate_"
                    "train; one-step lookahead on the remaining bound; with --context, --far)")
    ap.add_argument("--imitate", action="store_true",
                    help="with --afterstate: start from the imitation of the critical-path "
                    "rollout teacher (policies.afterstate_imitate; --iterations 0: it alone)")
    ap.add_argument("--lean", action="store_true",
                    help="with --imitate: fit only the first 15 priority features and the "
                    "afterstate ones (no context rows: the cheaper per-decision variant)")
    ap.add_argument("--extra", nargs="+", default=[], choices=[*EXTRA_FEATURES, "all"],
                    help="with --afterstate: also fit / search these extra afterstate columns "
                    "(policies.afterstate.EXTRA_FEATURES: owns miss2 n_tight2 margin "
                    "tight_wait, or all)")
    ap.add_argument("--teacher-rounds", type=int, default=0,
                    help="with --imitate: approximate policy-iteration rounds after it "
                    "(policies.afterstate_api: rollouts over the student label its states)")
    ap.add_argument("--rollout-base", default="student", choices=["student", "both"],
                    help="with --teacher-rounds: the rollouts' base (both: the better of "
                    "the student's and critical path's)")
    ap.add_argument("--aggregate", action="store_true",
                    help="with --teacher-rounds: fit every round's labels so far")
    ap.add_argument("--warm", action="store_true",
                    help="with --teacher-rounds: each fit starts from the current student")
    ap.add_argument("--values", action="store_true",
                    help="with --imitate: regress the rollout values instead of imitating "
                    "the choices (policies.afterstate_values)")
    ap.add_argument("--dumps", action="store_true",
                    help="the held-out dump protocol (train G0 + extra, test G1-G17)")
    ap.add_argument("--train-shuffles", type=int, default=3, help="with --dumps")
    ap.add_argument("--save", type=Path, default=None,
                    help="write each seed's artifact to SAVE/priority_seed<seed>.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the DAgger fits, like every RL run here (2 cores)
    if args.dumps:
        with tempfile.TemporaryDirectory(prefix="edbatch-prio-dumps-") as tmp:
            return _run(args, *_dump_graphs(args, Path(tmp)))
    wl = make_workload(args.workload)
    test = graph_set(wl, "test", 64, 8)
    val = graph_set(wl, "train", 64, 2)
    return _run(args, test, val, lambda seed: graph_set(wl, "train", 64, args.num_train_graphs,
                                                        shuffle_seed=seed))


def _dump_graphs(args: argparse.Namespace, tmp: Path) -> tuple:  # type: ignore[type-arg]
    """The dump protocol's graphs: (test G1-G17, validation = training, training by seed)."""
    from benchmarks._dump_export import export, export_training
    from edbatch.workloads.dumps import DumpWorkload

    merge = "lattice" in args.workload
    export(args.workload, 20, 64, merge, tmp / "eval")
    ns = argparse.Namespace(workload=args.workload, train_split="test,dev", batch_size=64,
                            graphs=20, split="train", train_shuffles=args.train_shuffles,
                            train_graphs=args.num_train_graphs, k=1)
    export_training(ns, merge, tmp / "eval", tmp / "train")
    nt = max(DumpWorkload(f).num_types for f in (tmp / "eval", tmp / "train"))

    def load(folder: Path, split: str) -> list:  # type: ignore[type-arg]
        wl = DumpWorkload(folder, num_types=nt)
        return [wl.instance_graph(split, i) for i in range(len(wl.load(split)))]

    train = load(tmp / "train", f"first:{args.num_train_graphs + 1}")
    return load(tmp / "eval", "rest:1"), train, lambda seed: train


def _run(args: argparse.Namespace, test: list, val: list, train_of) -> dict[int, float]:  # type: ignore[no-untyped-def,type-arg]
    lb = sum(lower_bound(g) for g in test)
    cp = make_scheduler("critical_path")
    print(f"{len(test)} test graphs, LB {lb}, critical path "
          f"{sum(cp(g).num_batches for g in test) / lb:.4f} x LB")
    out = {}
    for seed in args.seeds:
        train = train_of(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        trainer = AfterstateTrainer(args.iterations, args.population, args.elite, seed=seed,
                                    far=args.far, context=args.context,
                                    imitate=args.imitate,
                                    imitate_priority_features=15 if args.lean else None,
                                    extra_features=args.extra,
                                    imitate_rounds=args.teacher_rounds,
                                    imitate_base=args.rollout_base,
                                    imitate_aggregate=args.aggregate,
                                    imitate_warm=args.warm,
                                    imitate_target="values" if args.values else "choices"
                                    ) if args.afterstate \
            else PriorityTrainer(args.iterations, args.population, args.elite, seed=seed,
                                 hidden_units=args.hidden_units,
                                 api_rounds=args.api_rounds, far=args.far,
                                 dagger_rounds=args.dagger_rounds, dagger_teacher=args.teacher,
                                 weighting=args.weighting, dagger_first=args.dagger_first,
                                 context=args.context)
        p = trainer.fit(train, val).policy
        out[seed] = sum(p(g).num_batches for g in test) / lb
        if args.save is not None:
            p.save(args.save / f"priority_seed{seed}.json")
        m = p.metadata
        dag = [r["best_candidate"] for r in m["dagger"]["rounds"]] if "dagger" in m else []
        print(f"seed {seed}: {out[seed]:.4f} x LB (learned {p.learned}; train "
              f"{m['train_batches']} vs {m['train_fallback_batches']}, validation "
              f"{m['val_batches']} vs {m['val_fallback_batches']}; DAgger {dag}; "
              f"{time.process_time() - c0:.0f} s CPU, {time.perf_counter() - t0:.0f} s wall)",
              flush=True)
    print(f"mean {statistics.fmean(out.values()):.4f} x LB over seeds {args.seeds}")
    return out


if __name__ == "__main__":
    _args.run(main)
