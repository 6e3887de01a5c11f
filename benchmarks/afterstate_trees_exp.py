"""Experiment (issue 31): boosted trees over the imitated afterstate score, DAgger from the
student. Not a deployed policy: nothing here reached the 1.095 x LB goal.

Held-out dumps (the protocol of ``benchmarks.priority_lattice --dumps``: train G0 + 24
``test``/``dev`` mini-batches, test the unseen G1-G17). The linear base is the ``--lean
--extra miss2`` afterstate imitation (:mod:`policies.afterstate_imitate`, 1.0991 x LB); the
graphs' inputs, that fit and its labels are cached in ``--cache`` (a pickle; delete it to
rebuild, about 2 min). Then:

* trees (:mod:`policies.afterstate_trees`): ``--depth``, ``--lr``, ``--lam``, ``--min-h``
  boosted on the imitation's labels from the linear score (``--base zero``: from 0), split on
  the lean columns (``--mask full``: every column, the context ones too, which the compiled
  loop then computes); candidates after each of ``--checkpoints`` trees (and none), the
  fewest *training* batches kept; ``--gap-power P``: each decision weighted by
  ``min(rollout gap, --gap-cap) ** P``; ``--subsample``/``--seed``: each tree on a share of
  the decisions;
* ``--dagger N``: N rounds labelling the student's own states with the same teacher (the
  rollout over critical path, :func:`~edbatch.schedule._compiled_afterstate_q.
  afterstate_q_tree`), the labels aggregated, a linear refit (the imitation's Adam step
  candidates) and, unless ``--dagger-model linear``, trees on it; the round with the fewest
  training batches is kept (``--no-trees``: the linear student alone from the start).

Test ratios of every candidate are printed, for the record only::

    python -m benchmarks.afterstate_trees_exp --depth 3 --lr 0.1 --mask full
    python -m benchmarks.afterstate_trees_exp --no-trees --dagger 4 --dagger-model linear

2026-11-28 (load 3-9), G1-G17 x LB of the selected candidate (linear base 1.0991): lean
trees depth 1/2/3/4 1.0986/1.0991/1.1000/1.0991; full-mask depth 1/2/3 1.0978/1.0978/1.0986;
gap-weighted 1.1008-1.1067; DAgger, linear 1.0988, with trees 1.0993-1.1040. Best candidate
of any run, by test (not a legal selection): 1.0958.
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from edbatch.schedule import lower_bound
from edbatch.schedule._compiled_afterstate_q import afterstate_q_tree
from policies.afterstate import afterstate_inputs, afterstate_start, population_afterstate
from policies.afterstate_imitate import IMITATE_STEPS, contested, imitate, lean_mask
from policies.afterstate_trees import boost, tree_batches
from policies.priority_dagger import _fit


def build(cache: Path, extra: list[str]) -> dict:  # type: ignore[type-arg]
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    from benchmarks.priority_lattice import _dump_graphs
    ns = argparse.Namespace(workload="lattice_lstm", train_shuffles=3, num_train_graphs=24)
    with tempfile.TemporaryDirectory() as tmp:
        test, train, _ = _dump_graphs(ns, Path(tmp))
        labels: list = []  # type: ignore[type-arg]
        w, b, _ = imitate(train, priority_features=15, extra=extra, labels=labels)
        d = {"test": [afterstate_inputs(g) for g in test],
             "train": [afterstate_inputs(g) for g in train],
             "lb": sum(lower_bound(g) for g in test),
             "train_lb": sum(lower_bound(g) for g in train),
             "w": w, "w_batches": b, "labels": labels[0], "extra": extra}
    cache.write_bytes(pickle.dumps(d))
    return d


def dagger_labels(inputs, w, tree, roots):  # type: ignore[no-untyped-def]
    """The rollout-over-cp teacher's labels on the student's own states."""
    cp = afterstate_start()

    def traced():  # type: ignore[no-untyped-def]
        for gi in inputs:
            cap = len(gi[0]) * 8 + 64
            rows, _, ptr, q, _ = afterstate_q_tree(*gi, w, tree, roots, cp, cap)
            yield rows, ptr, q
    return contested(traced())


def gaps(inputs, w, tree, roots):  # type: ignore[no-untyped-def]
    """Per contested row: its decision's rollout gap (max q - min q), on the student's states
    (critical path's for w = cp: the imitation's labels, in the same order)."""
    cp = afterstate_start()
    out = []
    for gi in inputs:
        cap = len(gi[0]) * 8 + 64
        _, _, ptr, q, _ = afterstate_q_tree(*gi, w, tree, roots, cp, cap)
        for t in range(len(ptr) - 1):
            lo, hi = int(ptr[t]), int(ptr[t + 1])
            if hi - lo >= 2 and q[lo:hi].min() != q[lo:hi].max():
                out.append(np.full(hi - lo, float(q[lo:hi].max() - q[lo:hi].min())))
    return np.concatenate(out)


def merge(a, b):  # type: ignore[no-untyped-def]
    return (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1] + a[3]]),
            np.concatenate([a[2], b[2]]), a[3] + b[3])


def fit_trees(d, lab, w, args, active):  # type: ignore[no-untyped-def]
    """Boost from the linear score ``w``; candidates at checkpoints; best on training."""
    x, seg, tg, n = lab
    base = x @ w if args.base == "lin" else np.zeros(len(x))
    weight = None
    if args.gap_power:
        gp = d["gap"] if len(d["gap"]) == len(x) else None
        if gp is None:
            raise SystemExit("gap weights only without DAgger")
        weight = np.minimum(gp, args.gap_cap) ** args.gap_power
        weight *= len(weight) / weight.sum()
    tree, roots, losses = boost(x, seg, tg, n, base, active, max(args.checkpoints),
                                depth=args.depth, lr=args.lr, lam=args.lam, min_h=args.min_h,
                                weight=weight, subsample=args.subsample, seed=args.seed)
    out = []
    wb = w if args.base == "lin" else np.zeros_like(w)
    for m in [0, *args.checkpoints]:
        r = roots[:m]
        tr = int(tree_batches(d["train"], wb, tree, r).sum()) if (m or args.base == "lin") \
            else 10 ** 9
        te = int(tree_batches(d["test"], wb, tree, r).sum())
        out.append((tr, m, te))
        print(f"  trees {m:4d}: loss {losses[m - 1] if m else float('nan'):.4f} train {tr} "
              f"test {te / d['lb']:.4f}", flush=True)
    best = min(out)
    print(f"  -> selected {best[1]} trees: train {best[0]}, test {best[2] / d['lb']:.4f}",
          flush=True)
    return wb, tree, roots[:best[1]], best


def none_tree():  # type: ignore[no-untyped-def]
    return np.zeros((0, 5)), np.zeros(0, np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/tmp/held9.pkl"))
    ap.add_argument("--extra", nargs="*", default=["miss2"])
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--min-h", type=float, default=1.0)
    ap.add_argument("--base", default="lin", choices=["lin", "zero"])
    ap.add_argument("--mask", default="lean", choices=["lean", "full"])
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[5, 10, 20, 50, 100, 200])
    ap.add_argument("--dagger", type=int, default=0)
    ap.add_argument("--dagger-model", default="trees", choices=["trees", "linear"])
    ap.add_argument("--no-trees", action="store_true")
    ap.add_argument("--gap-power", type=float, default=0.0)
    ap.add_argument("--subsample", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap-cap", type=float, default=8.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = build(args.cache, args.extra)
    active = lean_mask(15, args.extra) if args.mask == "lean" else lean_mask(None, ["all"])
    w = d["w"]
    if "gap" not in d:
        cp = afterstate_start()
        d["gap"] = gaps(d["train"], cp, *none_tree())
        assert len(d["gap"]) == len(d["labels"][0]), (len(d["gap"]), len(d["labels"][0]))
        args.cache.write_bytes(pickle.dumps(d))
    lb = d["lb"]
    lin_tr = int(population_afterstate(d["train"], w[None]).sum())
    lin_te = int(population_afterstate(d["test"], w[None]).sum())
    print(f"linear: train {lin_tr}, test {lin_te / lb:.4f} x LB; labels {d['labels'][3]} "
          f"decisions, {len(d['labels'][0])} rows", flush=True)
    t0 = time.time()
    lab = d["labels"]
    none = (np.zeros((0, 5)), np.zeros(0, np.int64))
    if args.no_trees:
        cur = (w, *none, (lin_tr, 0, lin_te))
    else:
        cur = fit_trees(d, lab, w, args, active)
    print(f"fit {time.time() - t0:.0f} s", flush=True)
    best = cur
    for k in range(args.dagger):
        new = dagger_labels(d["train"], cur[0], cur[1], cur[2])
        lab = merge(lab, new)
        print(f"DAgger round {k + 1}: {new[3]} new decisions, {lab[3]} in all", flush=True)
        x, seg, tg, _ = lab
        ws = np.vstack(_fit(x * active, seg, tg, None, np.zeros(len(w)), 0, IMITATE_STEPS,
                            0.0, 0.01, active))
        sc = population_afterstate(d["train"], ws).sum(axis=1)
        te = population_afterstate(d["test"], ws).sum(axis=1)
        i = int(np.argmin(sc))
        print(f"  linear refit: train {sc.tolist()} test {(te / lb).round(4).tolist()}",
              flush=True)
        if args.dagger_model == "linear":
            cur = (ws[i], *none, (int(sc[i]), 0, int(te[i])))
        else:
            cur = fit_trees(d, lab, ws[i], args, active)
        if cur[3][0] < best[3][0]:
            best = cur
    print(f"RESULT selected: train {best[3][0]}, test {best[3][2] / lb:.4f} x LB "
          f"({len(best[2])} trees) [{time.time() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
