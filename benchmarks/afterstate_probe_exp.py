"""Experiment (issue 31): would a new afterstate column or a nonlinear value model help?

An offline probe before anything goes into the compiled loop. Critical path's schedules on
the held-out protocol's training graphs (the cache of :mod:`benchmarks.afterstate_values_exp`,
its ``qlab``: every contested decision's afterstate rows and rollout values) are replayed in
Python; at each contested decision every ready type ``a`` gets candidate columns the current
ones do not hold (:data:`CANDIDATES`). Each candidate is appended to the rows and the ridge
value fit of ``afterstate_values_exp --mask full`` is cross-validated (5 folds of
consecutive decisions): the *regret* is the sum over held-out decisions of the rollout value
of the type the fit picks (0 = the teacher's choice). Also scored: pairwise products of the
ten columns of largest standardised weight, and (``--mlp H``) a tanh MLP of ``H`` units plus
a linear part, both fitted on the per-decision-centred values. Lower regret than the plain
fit's is the signal to deploy a column.

    python -m benchmarks.afterstate_probe_exp [--mlp 8 16]
    python -m benchmarks.afterstate_probe_exp --errors

2026-11-28 16:20-16:45 UTC (load 0-1): 7358 decisions; critical path's regret 2018, the
linear fit 2000 (lam 1e-2) / 1966 (lam 0.1), in-sample 1876. Every candidate column changes
the CV regret by -12..+11 (noise; all 16 together +7 at lam 0.1): none is telling, so none
went into the compiled loop. Pairwise products of the top 10: +32 / +91 (worse); MLP
(8/16/32 units): 2184-2278 (worse). Error
analysis on the value student's own states (rollouts over cp): 863 of 7265 contested
decisions cost batches (rollout regret 1765 against cp's row 1858); at the costly ones the
student mostly keeps cp's (tight) type where the teacher runs a non-tight one (mean
teacher - student row: ``is_cp`` -1.6 sd, ``gap0`` -1.5, ``tight`` -1.0, ``lag`` +0.8,
``tight_wait`` +0.8), 91% of them at score margins 0.05-1: a decision the columns see but
whose value the rollout alone knows.
"""

from __future__ import annotations

import argparse
import pickle
import warnings
from pathlib import Path

import numpy as np
import torch

from edbatch.schedule._compiled_afterstate import AFTER_FEATURES, run_afterstate
from edbatch.schedule._compiled_afterstate_q import afterstate_q
from policies.afterstate import afterstate_start
from policies.afterstate_imitate import lean_mask
from policies.afterstate_values import value_ridge
from policies.priority import FEATURES

#: The columns of a label row (every column), and the one saying "critical path's choice".
NAMES = (*FEATURES, *AFTER_FEATURES)
IS_CP = NAMES.index("is_cp")

CANDIDATES = ("rel_n", "rel_batchable", "new_types", "crit_share", "crit_n", "h2", "h12_gap",
              "h_vs_other", "next_max_ready", "next_sum_ready", "n_big_next", "log_ready",
              "fed_sum", "fed_max", "near", "fed_top")


def _released(r_a, uids, uptr, pending):  # type: ignore[no-untyped-def]
    dec: dict[int, int] = {}
    for v in r_a:
        for u in uids[uptr[v]:uptr[v + 1]]:
            dec[int(u)] = dec.get(int(u), 0) + 1
    return [u for u, c in dec.items() if c == pending[u]]


def _rows(ready, op, uptr, uids, batchable, height, down, pending):  # type: ignore[no-untyped-def]
    """The :data:`CANDIDATES` of every ready batchable type (ascending) of one state."""
    R: dict[int, list[int]] = {}
    for v in ready:
        if batchable[op[v]]:
            R.setdefault(int(op[v]), []).append(v)
    types = sorted(R)
    if len(types) < 2:
        return None
    hmax = max(1, int(height.max()))
    D = {t: down[R[t]].max(0) for t in types}
    rel = {t: _released(R[t], uids, uptr, pending) for t in types}
    fed_sum = dict.fromkeys(types, 0)
    fed_max = dict.fromkeys(types, 0)
    fed_top = dict.fromkeys(types, 0)
    for b in types:  # type-t nodes running another ready type b makes ready
        cnt: dict[int, int] = {}
        for u in rel[b]:
            t = int(op[u])
            if t in fed_sum and t != b:
                cnt[t] = cnt.get(t, 0) + 1
                fed_top[t] = max(fed_top[t], int(down[u, t]))
        for t, c in cnt.items():
            fed_sum[t] += c
            fed_max[t] = max(fed_max[t], c)
    near = dict.fromkeys(types, 0)
    for u in np.flatnonzero(pending == 1):
        if int(op[u]) in near:
            near[int(op[u])] += 1
    out = []
    for a in types:
        relb = [u for u in rel[a] if batchable[op[u]]]
        new = {int(op[u]) for u in relb} - set(types)
        cnts = {t: len(R[t]) for t in types if t != a}
        for u in relb:
            cnts[int(op[u])] = cnts.get(int(op[u]), 0) + 1
        hs = np.sort(height[R[a]])[::-1]
        h2 = hs[1] if len(hs) > 1 else 0
        crit = int((down[R[a], a] == D[a][a]).sum())
        other_h = max(height[R[t]].max() for t in types if t != a)
        out.append([len(rel[a]) / 64, len(relb) / 64, len(new) / 4, crit / len(R[a]),
                    crit / 64, h2 / hmax, (hs[0] - h2) / hmax, (hs[0] - other_h) / hmax,
                    max(cnts.values()) / 64 if cnts else 0.0, sum(cnts.values()) / 64,
                    sum(c >= 8 for c in cnts.values()) / 4, np.log1p(len(R[a])) / 5,
                    fed_sum[a] / 64, fed_max[a] / 64, near[a] / 64,
                    float(fed_top[a] >= D[a][a])])
    return out


def candidate_columns(inputs) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The :data:`CANDIDATES` of the rows of ``label_values``' contested decisions (the
    same order: critical path's states, ties dropped)."""
    cp = afterstate_start()
    cols = []
    for gi in inputs:
        op, uptr, uids, batchable, height, down = gi[0], gi[3], gi[4], gi[5], gi[6], gi[11]
        _, _, ptr, q, _ = afterstate_q(*gi, cp, cp, len(op) * 8 + 64)
        keep = [q[ptr[t]:ptr[t + 1]].min() != q[ptr[t]:ptr[t + 1]].max()
                for t in range(len(ptr) - 1) if ptr[t + 1] - ptr[t] >= 2]
        bop, bforced, bptr, nodes = run_afterstate(*gi, cp)[:4]
        pending = np.zeros(len(op), np.int64)
        np.add.at(pending, uids, 1)
        ready = set(np.flatnonzero(pending == 0).tolist())
        k = 0
        for b in range(len(bop)):
            if not bforced[b]:
                rows = _rows(ready, op, uptr, uids, batchable, height, down, pending)
                if rows is not None:
                    if keep[k]:
                        cols.extend(rows)
                    k += 1
            for v in nodes[bptr[b]:bptr[b + 1]]:
                ready.discard(int(v))
                for u in uids[uptr[v]:uptr[v + 1]]:
                    pending[u] -= 1
                    if pending[u] == 0:
                        ready.add(int(u))
    return np.array(cols, dtype=np.float64)


def _decisions(seg: np.ndarray) -> zip:  # type: ignore[type-arg]
    """``(first, end)`` rows of each decision (``seg``: a row's decision, in runs)."""
    starts = np.flatnonzero(np.r_[1, np.diff(seg)])
    return zip(starts, np.r_[starts[1:], len(seg)], strict=True)


def cv_regret(x, seg, v, n, fit, folds: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Summed rollout value of the held-out decisions' picks (argmin of ``fit(train)``'s
    prediction over all rows), folds of consecutive decisions."""
    fold = seg * folds // n
    tot = 0.0
    for f in range(folds):
        pred = fit(fold != f)
        for s0, s1 in _decisions(seg):
            if fold[s0] == f:
                tot += v[s0 + int(np.argmin(pred[s0:s1]))]
    return tot


def ridge_fit(x, seg, v, n, lam):  # type: ignore[no-untyped-def]
    def fit(tr):  # type: ignore[no-untyped-def]
        i = np.flatnonzero(tr)
        return x @ value_ridge(x[i], seg[i], v[i], n, np.ones(x.shape[1], bool), [lam])[0]
    return fit


def mlp_fit(x, seg, v, n, hidden, steps=1500):  # type: ignore[no-untyped-def]
    z = torch.tensor((x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0))
    vt, st = torch.tensor(v), torch.tensor(seg)

    def fit(tr):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(z.shape[1], hidden), torch.nn.Tanh(),
                                  torch.nn.Linear(hidden, 1)).double()
        lin = torch.nn.Linear(z.shape[1], 1, bias=False).double()
        opt = torch.optim.Adam([*net.parameters(), *lin.parameters()], lr=3e-3,
                               weight_decay=1e-4)
        m = torch.tensor(tr)
        cnt = torch.bincount(st[m], minlength=n).double().clamp(min=1)
        for _ in range(steps):
            r = (net(z) + lin(z)).squeeze(1)[m] - vt[m]
            mu = torch.zeros(n, dtype=torch.float64).index_add(0, st[m], r) / cnt
            loss = ((r - mu[st[m]]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            return (net(z) + lin(z)).squeeze(1).numpy()
    return fit


def error_analysis(d) -> None:  # type: ignore[no-untyped-def]
    """The value fit's (lam 1e-2, every column) own states, labelled by rollouts over cp:
    where its choice costs batches, and the mean row difference teacher - student there."""
    from benchmarks.afterstate_values_exp import NONE_TREE, q_data

    x, seg, v, n = d["qlab"]
    w = -value_ridge(x, seg, v, n, lean_mask(None, ["all"]), [1e-2])[0]
    xs, ss, vs, ns = q_data(d["train"], w, *NONE_TREE, afterstate_start())
    picked, margin, diffs = [], [], []
    for s0, s1 in _decisions(ss):
        sc = xs[s0:s1] @ w
        i, j = s0 + int(np.argmax(sc)), s0 + int(np.argmin(vs[s0:s1]))
        picked.append(vs[i])
        margin.append(np.diff(np.sort(sc))[-1])
        if vs[i] > 0:
            diffs.append(xs[j] - xs[i])
    pv, mg = np.array(picked), np.array(margin)
    print(f"student: {ns} contested decisions, {(pv > 0).sum()} cost batches, regret "
          f"{pv.sum():.0f} (cp's rows {vs[xs[:, IS_CP] > 0.5].sum():.0f})", flush=True)
    for lo, hi in ((0, .05), (.05, .2), (.2, .5), (.5, 1), (1, np.inf)):
        m = (mg >= lo) & (mg < hi)
        print(f"  score margin {lo}-{hi}: {m.sum()} decisions, {(pv[m] > 0).sum()} costly, "
              f"regret {pv[m].sum():.0f}", flush=True)
    md = np.mean(diffs, axis=0) / (xs.std(0) + 1e-9)
    print("  teacher - student row at the costly ones (sd): " + ", ".join(
        f"{NAMES[i]} {md[i]:+.2f}" for i in np.argsort(-np.abs(md))[:8]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/tmp/held10.pkl"))
    ap.add_argument("--mlp", type=int, nargs="*", default=[])
    ap.add_argument("--errors", action="store_true", help="the error analysis alone")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # constant columns
    d = pickle.loads(args.cache.read_bytes())
    if "qlab" not in d:
        raise SystemExit(f"{args.cache}: no labels; run benchmarks.afterstate_values_exp first")
    if args.errors:
        error_analysis(d)
        return
    x, seg, v, n = d["qlab"]
    cp_row = x[:, IS_CP] > 0.5
    print(f"{n} decisions; critical path's regret {v[cp_row].sum():.0f}", flush=True)
    base = {lam: cv_regret(x, seg, v, n, ridge_fit(x, seg, v, n, lam)) for lam in (1e-2, 0.1)}
    print(f"linear CV regret: {base}", flush=True)
    c = candidate_columns(d["train"])
    if len(c) != len(x):
        raise SystemExit(f"replay gave {len(c)} rows, the labels {len(x)}")
    for j, name in enumerate(CANDIDATES):
        xj = np.hstack([x, c[:, j:j + 1]])
        r = cv_regret(xj, seg, v, n, ridge_fit(xj, seg, v, n, 1e-2)) - base[1e-2]
        print(f"  + {name}: {r:+.0f}", flush=True)
    xa = np.hstack([x, c])
    print(f"  + all: {cv_regret(xa, seg, v, n, ridge_fit(xa, seg, v, n, 0.1)) - base[0.1]:+.0f}"
          " (lam 0.1)", flush=True)
    b = value_ridge(x, seg, v, n, np.ones(x.shape[1], bool), [1e-2])[0]
    top = np.argsort(-np.abs(b) * x.std(0))[:10]
    xp = np.hstack([x, np.stack([x[:, i] * x[:, j] for a, i in enumerate(top)
                                 for j in top[a:]], 1)])
    for lam in (1e-2, 0.1):
        print(f"  pairs of the top 10, lam {lam}: "
              f"{cv_regret(xp, seg, v, n, ridge_fit(xp, seg, v, n, lam)) - base[lam]:+.0f}",
              flush=True)
    for h in args.mlp:
        print(f"  MLP({h}): {cv_regret(x, seg, v, n, mlp_fit(x, seg, v, n, h)):.0f}", flush=True)


if __name__ == "__main__":
    main()
