"""Experiment (issue 31): fitted action values instead of imitation, on the afterstate rows.

The rollout teacher evaluates every ready type of a contested decision (batches of the whole
schedule when the decision takes that type and critical path -- or ``--rollout student``:
the current linear student -- makes every later one). Here those values are *regressed*
(least squares, per decision centred: only differences between a decision's actions count)
on the afterstate rows, and the deployed policy takes the argmin of the predicted value (its
score is minus the prediction: a linear weight vector, plus boosted regression trees in the
compiled loop, :mod:`policies.afterstate_trees`). Then ``--rounds`` fitted-Q / policy
iteration rounds: the student's own states are labelled by rollouts and aggregated.

Protocol of ``benchmarks.priority_lattice --dumps`` (train G0 + 24 ``test``/``dev``
mini-batches, test the unseen G1-G17); the inputs are the cache of
:mod:`benchmarks.afterstate_trees_exp` (``--cache``). Selection by training batches only;
test ratios of every candidate are printed for the record.

    python -m benchmarks.afterstate_values_exp --mask full            # 1.0968
    python -m benchmarks.afterstate_values_exp --mask full --rounds 3
    python -m benchmarks.afterstate_values_exp --mask full --train-graphs 96 --rounds 4 --trees

2026-11-28 13:34-14:05 UTC (load 1-7), G1-G17 x LB of the candidate selected by training
batches (train batches in brackets; critical path 7445, the imitation ``--lean --extra
miss2`` 7364 / 1.0991, its trees 7353 / 1.0978):

* linear value fit, ``--mask full`` (every column): **1.0968 (7352)**; ``lean`` 1.1013
  (7378); ``prio`` (all priority features + ``miss2``) 1.0998 (7377); ``prio`` without
  extras 1.1070; ``lean --extra all`` 1.1015; ``prio --extra owns miss2 margin
  tight_wait`` 1.0968 (7352, the same schedules), ``miss2 n_tight2`` 1.0993, ``owns margin
  tight_wait`` 1.1010;
* targets: ``--cap 3`` 1.1015 (full) / 1.1035 (lean), ``--cap 6`` 1.0983, ``--power 0.5``
  1.1015, ``--power 1.5`` 1.1040; weights: ``--per-decision`` 1.0983, ``--gap-weight 0.5``
  1.1035, ``-0.5`` 1.1033;
* least-squares trees on the linear value fit (``--trees``): depth 2 / 3, 10-200 trees,
  1.0981-1.1042, never selected (train 7353-7390);
* fitted-Q rounds (``--rounds 3``): the student's states, cp rollouts, aggregated: train
  7351 / 7348 / 7341, test 1.0981 / 1.0978 / 1.1003; ``--rollout student`` (policy
  iteration): 1.1010 / 1.1023 / 1.0996 (train 7364 / 7352 / 7351);
* critical path's states with rollouts over a better base (one-off, not a flag): the
  imitation 1.0996 (7357), with the cp labels aggregated 1.0993; the value fit itself
  1.0998, aggregated 1.0993; the imitation's states (cp rollouts) alone 1.1028 (7367), with
  cp's 1.0998 (7352); the value student's states alone (not aggregated) 1.0993 (7362);
* regressing on the difference to the decision's best row (not per decision centred):
  1.1144 full, 1.1094 lean (worse);
* blend of the value fit and the imitation's score (both scaled to unit centred deviation),
  alpha 0-1: 1.0981-1.1020 between the two ends.

2026-11-28 16:20-17:10 UTC (helper ``held11``, load 0-7; critical path's training batches
14531 on 48 graphs, 28740 on 96):

* more training graphs (``--train-graphs 48`` / ``96``, a superset of the 24): linear
  1.1018 (14403) / 1.1005 (28417); ``--trees`` 1.0993 (14399, 10 trees) / 1.0988 (28403);
  ``--rounds 2``: 1.1005 (14350) / 1.0978 (28381); 96 with ``--rounds 4 --trees``
  (``--checkpoints 10 30``): rounds 1-4 1.0978 / 1.0998 / 1.0968 / 1.0973 (train 28355 /
  28354 / 28344 / 28337: round 4 selected, 1.0973); ``--rollout student`` on 96, round 1:
  1.1000 (28375; stopped there);
* new columns, pairwise products, an MLP: ``benchmarks/afterstate_probe_exp.py`` (its
  cross-validated regret saw no gain, so none went into the compiled loop).

Nothing reached 1.095. Per decision (``priority_cost --workload lattice_lstm --graphs 3
--afterstate --policy``, CPU, load 5.6-6.8): the full value fit 13.1 us over critical path
(it reads the context rows and every extra column) against 6.5 us for ``--lean --extra
miss2`` in the same session.
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.afterstate_trees_exp import build
from edbatch.schedule import lower_bound
from edbatch.schedule._compiled_afterstate_q import afterstate_q_tree
from policies.afterstate import afterstate_inputs, afterstate_start, population_afterstate
from policies.afterstate_imitate import contested_values, lean_mask
from policies.afterstate_trees import _grow, tree_batches, tree_predict
from policies.afterstate_values import centre, value_ridge

NONE_TREE = (np.zeros((0, 5)), np.zeros(0, np.int64))


def q_data(inputs, w, tree, roots, wb):  # type: ignore[no-untyped-def]
    """``(x, seg, v, nseg)``: rows of the contested decisions of the student ``(w, trees)``,
    ``v`` each row's rollout batches minus its decision's fewest (``wb`` rolls out)."""
    def traces():  # type: ignore[no-untyped-def]
        for gi in inputs:
            rows, _, ptr, q, _ = afterstate_q_tree(*gi, w, tree, roots, wb, len(gi[0]) * 8 + 64)
            yield rows, ptr, q
    return contested_values(traces())


def value_trees(x, seg, y, n, base, active, rounds, depth, lr, lam):  # type: ignore[no-untyped-def]
    """Least-squares boosting of the per-decision-centred ``y`` from the prediction
    ``base``: ``(tree, roots)``; the first ``m`` roots are the model after ``m`` trees."""
    cols = np.flatnonzero(active)
    yc = centre(y, seg, n)
    pred = np.array(base, dtype=np.float64)
    nodes: list[list[float]] = []
    roots: list[int] = []
    every = np.arange(len(x))
    for _ in range(rounds):
        r = yc - centre(pred, seg, n)
        t = _grow(x, r, np.ones(len(x)), cols, depth, lam, lr, 1.0, len(nodes), every)
        roots.append(len(nodes))
        nodes.extend(t)
        pred += tree_predict(x, np.array(nodes), np.array([roots[-1]]))
    return np.array(nodes, dtype=np.float64).reshape(-1, 5), np.array(roots, dtype=np.int64)


def fit(d, lab, args, active):  # type: ignore[no-untyped-def]
    """Candidates (ridge lambdas, then trees on the best); the fewest training batches."""
    x, seg, v, n = lab
    y = np.minimum(v, args.cap) ** args.power
    lb = d["lb"]
    wt = None
    if args.per_decision:
        wt = 1.0 / np.bincount(seg, minlength=n)[seg]
        wt *= len(wt) / wt.sum()
    if args.gap_weight:  # each decision weighted by its largest value ** gap_weight
        top = np.maximum.reduceat(y, np.flatnonzero(np.r_[1, np.diff(seg)]))
        wt = (top ** args.gap_weight)[seg]
        wt *= len(wt) / wt.sum()
    betas = value_ridge(x, seg, y, n, active, args.lams, wt)
    ws = np.vstack([-b for b in betas])
    tr = population_afterstate(d["train"], ws).sum(axis=1)
    te = population_afterstate(d["test"], ws).sum(axis=1)
    for lam, a, b in zip(args.lams, tr, te, strict=True):
        print(f"  ridge lam {lam:g}: train {a} test {b / lb:.4f}", flush=True)
    i = int(np.argmin(tr))
    best = (int(tr[i]), 0, int(te[i]))
    w = ws[i]
    tree, roots = NONE_TREE
    if args.trees:
        tmask = active if args.tree_mask == "same" else lean_mask(None, ["all"])
        tree, allroots = value_trees(x, seg, -y, n, x @ w, tmask, max(args.checkpoints),
                                     args.depth, args.lr, args.lam)
        for m in args.checkpoints:
            r = allroots[:m]
            a = int(tree_batches(d["train"], w, tree, r).sum())
            b = int(tree_batches(d["test"], w, tree, r).sum())
            print(f"  trees {m}: train {a} test {b / lb:.4f}", flush=True)
            if (a, m) < best[:2]:
                best, roots = (a, m, b), r
        if best[1] == 0:
            roots = NONE_TREE[1]
    print(f"  -> train {best[0]} test {best[2] / lb:.4f} ({best[1]} trees)", flush=True)
    return w, tree, roots, best


def build_values(cache: Path, n: int) -> dict:  # type: ignore[type-arg]
    """The cache for ``--train-graphs n``: the protocol's graphs with ``n`` training
    mini-batches (G0 + the first ``n`` of the ``test``/``dev`` reshuffles, a superset of
    the 24) and critical path's value labels (about 1 min for 96)."""
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    from benchmarks.priority_lattice import _dump_graphs
    ns = argparse.Namespace(workload="lattice_lstm", train_shuffles=-(-n // 7),
                            num_train_graphs=n)
    with tempfile.TemporaryDirectory() as tmp:
        test, train, _ = _dump_graphs(ns, Path(tmp))
        d = {"test": [afterstate_inputs(g) for g in test],
             "train": [afterstate_inputs(g) for g in train],
             "lb": sum(lower_bound(g) for g in test)}
    cp = afterstate_start()
    d["qlab"] = q_data(d["train"], cp, *NONE_TREE, cp)
    cache.write_bytes(pickle.dumps(d))
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/tmp/held10.pkl"))
    ap.add_argument("--mask", default="lean", choices=["lean", "full", "prio"])
    ap.add_argument("--extra", nargs="*", default=["miss2"])
    ap.add_argument("--lams", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1])
    ap.add_argument("--cap", type=float, default=1e9, help="values clipped at this")
    ap.add_argument("--power", type=float, default=1.0, help="target: value ** power")
    ap.add_argument("--per-decision", action="store_true", help="each decision weight 1")
    ap.add_argument("--gap-weight", type=float, default=0.0,
                    help="decision weight: its largest value ** this")
    ap.add_argument("--trees", action="store_true")
    ap.add_argument("--tree-mask", default="same", choices=["same", "full"])
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[10, 30, 100, 200])
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--rollout", default="cp", choices=["cp", "student"])
    ap.add_argument("--train-graphs", type=int, default=24,
                    help="training mini-batches; not 24: its own cache, /tmp/values_N.pkl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.train_graphs < 1:
        raise SystemExit(f"--train-graphs must be >= 1, got {args.train_graphs}")
    d = (build(args.cache, ["miss2"]) if args.train_graphs == 24 else
         build_values(Path(f"/tmp/values_{args.train_graphs}.pkl"), args.train_graphs))
    active = (lean_mask(15, args.extra) if args.mask == "lean" else
              lean_mask(None, args.extra) if args.mask == "prio" else lean_mask(None, ["all"]))
    cp = afterstate_start()
    t0 = time.time()
    if "qlab" not in d:
        d["qlab"] = q_data(d["train"], cp, *NONE_TREE, cp)
        args.cache.write_bytes(pickle.dumps(d))
    lab = d["qlab"]
    print(f"labels: {lab[3]} decisions, {len(lab[0])} rows, mean gap "
          f"{np.bincount(lab[1], lab[2]).mean():.2f} [{time.time() - t0:.0f} s]", flush=True)
    cur = fit(d, lab, args, active)
    best = cur
    for k in range(args.rounds):
        wb = cp if args.rollout == "cp" else cur[0]
        new = q_data(d["train"], cur[0], cur[1], cur[2], wb)
        x, seg, v, n = lab
        lab = (np.concatenate([x, new[0]]), np.concatenate([seg, new[1] + n]),
               np.concatenate([v, new[2]]), n + new[3])
        print(f"round {k + 1}: {new[3]} new decisions, {lab[3]} in all "
              f"[{time.time() - t0:.0f} s]", flush=True)
        cur = fit(d, lab, args, active)
        if cur[3][0] < best[3][0]:
            best = cur
    print(f"RESULT selected: train {best[3][0]}, test {best[3][2] / d['lb']:.4f} x LB "
          f"({best[3][1]} trees) [{time.time() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
