"""Boosted regression trees on top of the imitated afterstate score: a nonlinear student.

The imitation (:mod:`policies.afterstate_imitate`) fits a *linear* score ``w . [f_a, g_a]``
to the rollout teacher's choices. Here shallow regression trees are added to it by gradient
boosting on the same loss (per contested decision, minus the log of the softmax mass on the
teacher's choices): each round fits a tree of depth ``depth`` to the negative gradient
``q_i - p_i`` (``p``: the softmax over the decision's rows, ``q``: ``p`` restricted to the
teacher's choices and renormalised) with Newton leaves ``sum g / (sum h + lam)``, ``h =
p (1 - p)``, shrunk by ``lr``; splits only on the ``active`` columns (those the compiled loop
computes for the linear weights, so a tree adds no feature cost). The trees compile into the
afterstate loop as threshold arrays (:func:`~edbatch.schedule._compiled_afterstate.tree_score`:
node ``(column, threshold, left, right, value)``; a few comparisons per row).

Deterministic (exact split search, no sampling).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from edbatch.schedule._compiled_afterstate import run_afterstate_tree

__all__ = ["boost", "segment_grad", "tree_batches", "tree_predict"]

Tree = NDArray[np.float64]   # (nodes, 5): column (-1: leaf), threshold, left, right, value


def segment_grad(score: NDArray[np.float64], seg: NDArray[np.int64],
                 target: NDArray[np.bool_], nseg: int
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """``(g, h, loss)``: the negative gradient ``q - p`` and the Hessian bound ``p (1 - p)``
    of the choice loss at the rows' scores, and the mean loss over the decisions."""
    mx = np.full(nseg, -np.inf)
    np.maximum.at(mx, seg, score)
    e = np.exp(score - mx[seg])
    z = np.bincount(seg, e, nseg)
    zt = np.bincount(seg, e * target, nseg)
    p = e / z[seg]
    q = np.where(target, e / np.maximum(zt[seg], 1e-300), 0.0)
    loss = float(np.mean(np.log(z) - np.log(np.maximum(zt, 1e-300))))
    return q - p, p * (1.0 - p), loss


def _best_split(x: NDArray[np.float64], g: NDArray[np.float64], h: NDArray[np.float64],
                cols: NDArray[np.int64], lam: float, min_h: float
                ) -> tuple[float, int, float]:
    """``(gain, column, threshold)`` of the best split of the rows ``x`` (gain <= 0: none)."""
    gs, hs = g.sum(), h.sum()
    parent = gs * gs / (hs + lam)
    best = (0.0, -1, 0.0)
    for c in cols:
        v = x[:, c]
        o = np.argsort(v, kind="stable")
        vs = v[o]
        cg, ch = np.cumsum(g[o]), np.cumsum(h[o])
        ok = vs[:-1] < vs[1:]
        ok &= (ch[:-1] >= min_h) & (hs - ch[:-1] >= min_h)
        if not ok.any():
            continue
        gl, hl = cg[:-1], ch[:-1]
        gain = gl * gl / (hl + lam) + (gs - gl) ** 2 / (hs - hl + lam) - parent
        gain = np.where(ok, gain, -np.inf)
        i = int(np.argmax(gain))
        if gain[i] > best[0]:
            best = (float(gain[i]), int(c), float((vs[i] + vs[i + 1]) / 2.0))
    return best


def _grow(x: NDArray[np.float64], g: NDArray[np.float64], h: NDArray[np.float64],
          cols: NDArray[np.int64], depth: int, lam: float, lr: float, min_h: float,
          offset: int, rows: NDArray[np.int64]) -> list[list[float]]:
    """One tree's nodes (absolute indices from ``offset``), depth first."""
    nodes: list[list[float]] = []

    def node(idx: NDArray[np.int64], d: int) -> int:
        me = offset + len(nodes)
        nodes.append([-1.0, 0.0, -1.0, -1.0, 0.0])
        _, c, thr = (_best_split(x[idx], g[idx], h[idx], cols, lam, min_h) if d < depth
                        else (0.0, -1, 0.0))
        if c < 0:
            nodes[me - offset][4] = lr * float(g[idx].sum()) / (float(h[idx].sum()) + lam)
            return me
        left = idx[x[idx, c] <= thr]
        right = idx[x[idx, c] > thr]
        nodes[me - offset][:2] = [float(c), thr]
        nodes[me - offset][2] = float(node(left, d + 1))
        nodes[me - offset][3] = float(node(right, d + 1))
        return me

    node(rows, 0)
    return nodes


def tree_predict(x: NDArray[np.float64], tree: Tree, roots: NDArray[np.int64]
                 ) -> NDArray[np.float64]:
    """The trees' sum per row of ``x`` (the compiled ``tree_score``, vectorised)."""
    out = np.zeros(len(x))
    for r in roots:
        nd = np.full(len(x), int(r))
        while True:
            c = tree[nd, 0].astype(np.int64)
            inner = c >= 0
            if not inner.any():
                break
            v = x[np.arange(len(x)), np.where(inner, c, 0)]
            nxt = np.where(v <= tree[nd, 1], tree[nd, 2], tree[nd, 3]).astype(np.int64)
            nd = np.where(inner, nxt, nd)
        out += tree[nd, 4]
    return out


def boost(x: NDArray[np.float64], seg: NDArray[np.int64], target: NDArray[np.bool_],
          nseg: int, base: NDArray[np.float64], active: NDArray[np.bool_],
          rounds: int, depth: int = 2, lr: float = 0.1, lam: float = 1.0,
          min_h: float = 1.0, weight: NDArray[np.float64] | None = None,
          subsample: float = 1.0, seed: int = 0,
          ) -> tuple[Tree, NDArray[np.int64], list[float]]:
    """``rounds`` boosting rounds from the scores ``base`` (module doc): ``(tree, roots,
    loss before each round)``; the first ``m`` roots are the model after ``m`` rounds.
    ``weight``: per row, its decision's weight in the loss (default 1); ``subsample``
    below 1: each tree is grown on that share of the decisions, drawn with ``seed``."""
    if rounds < 0 or depth < 1 or lr <= 0 or lam < 0 or not 0 < subsample <= 1:
        raise ValueError(f"need rounds >= 0, depth >= 1, lr > 0, lam >= 0; got rounds="
                         f"{rounds!r}, depth={depth!r}, lr={lr!r}, lam={lam!r}, "
                         f"subsample={subsample!r}")
    rng = np.random.default_rng(seed)
    every = np.arange(len(x))
    cols = np.flatnonzero(active)
    score = np.array(base, dtype=np.float64)
    nodes: list[list[float]] = []
    roots: list[int] = []
    losses = []
    for _ in range(rounds):
        g, h, loss = segment_grad(score, seg, target, nseg)
        if weight is not None:
            g, h = g * weight, h * weight
        losses.append(loss)
        rows = every if subsample == 1 else every[rng.random(nseg)[seg] < subsample]
        t = _grow(x, g, h, cols, depth, lam, lr, min_h, len(nodes), rows)
        roots.append(len(nodes))
        nodes.extend(t)
        score += tree_predict(x, np.array(nodes), np.array([roots[-1]]))
    tree = np.array(nodes, dtype=np.float64).reshape(-1, 5)
    return tree, np.array(roots, dtype=np.int64), losses


def tree_batches(inputs: Sequence[tuple], w: NDArray[np.float64], tree: Tree,  # type: ignore[type-arg]
                 roots: NDArray[np.int64]) -> NDArray[np.int64]:
    """Batches of each graph (:func:`~policies.afterstate.afterstate_inputs`) under the
    linear weights ``w`` plus the trees."""
    w = np.ascontiguousarray(w, dtype=np.float64)
    tree = np.ascontiguousarray(tree, dtype=np.float64).reshape(-1, 5)
    roots = np.ascontiguousarray(roots, dtype=np.int64)
    return np.array([len(run_afterstate_tree(*gi, w, tree, roots)[0])  # type: ignore[call-arg]
                     for gi in inputs], dtype=np.int64)
