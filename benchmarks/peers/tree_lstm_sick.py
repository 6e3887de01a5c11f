"""The benchmark peers of ``tree_lstm_sick``: the child-sum Tree-LSTM relatedness model of Tai
et al. (2015) on SICK, on the workload's own parameters (the dict of
:func:`edbatch.executor.init_params`), computing the same loss: the sum over pairs of
``KL(t || p)`` (equations in :mod:`edbatch.workloads.tree_lstm_sick`).

* ``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`): one
  variadic ``node`` call per token on its word and its children's states, one ``sim`` loss
  per pair.
* ``Unbatched`` (:func:`unbatched_loss`): **unbatched per-instance PyTorch**, node by node:
  every tree node is its own small matmuls, every pair its own head (the baseline MXNet's
  and DyNet's headlines divide by).
* ``HandBatched`` (:func:`level_batched_loss`): **hand-batched** as a practitioner writes a
  child-sum Tree-LSTM: all trees of the mini-batch (both sides of every pair) advance
  together level by level (a node's level is one more than its highest child's), the input
  projections of every node in one GEMM, then per level one ``U_iou`` GEMM over its nodes and
  one ``U_f`` GEMM over their children, children summed per node with ``index_add``, states
  written into level-sorted buffers; one head call for the whole mini-batch.

Neither PyTorch peer uses edbatch's graphs, schedulers or kernels (only its element-wise
:func:`~edbatch.executor.kernels.fast_tanh`, as every hand-batched peer and edbatch's
kernels: the rows compare batching, not a ``tanh`` implementation);
``tests/benchmarks/test_sick_peers.py`` checks both against the workload's reference executor
(fp64). The DyNet peer is ``benchmarks/peers/dynet/tree_lstm_sick.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks import hand_batched
from edbatch.api import DynamicBatch
from edbatch.data.sick import similarity_target
from edbatch.executor.kernels import fast_tanh
from edbatch.workloads.tree_lstm_sick import Rows, SickInstance

__all__ = ["HandBatched", "SickLevels", "SickUnbatched", "Unbatched", "level_batched_loss",
           "record", "unbatched_loss"]

_P = "tree_lstm_sick"


def record(batch: DynamicBatch, wl: Any, instances: Sequence[SickInstance]) -> None:
    """Both trees of every pair bottom-up (post-order rows), then the pair's KL loss."""
    embed, node, sim = (batch.op(f"{_P}.{n}") for n in ("embed", "node", "sim"))
    add_loss = batch.add_loss
    for inst in instances:
        with batch.instance():
            roots = []
            for rows in (inst.a, inst.b):
                state: list[Any] = []
                for word, kids in rows:  # children first
                    state.append(node(embed(attr=word), *[state[k] for k in kids],
                                      attr=len(kids)))
                roots.append(state[-1])
            add_loss(sim(roots[0], roots[1], attr=inst.score_attr))


def _p(params: Mapping[str, Tensor], *names: str) -> list[Tensor]:
    return [params[f"{_P}.{n}"] for n in names]


def _targets(instances: Sequence[SickInstance], like: Tensor) -> Tensor:
    return torch.tensor([similarity_target(i.score) for i in instances], dtype=like.dtype,
                        device=like.device)


def _head_loss(h_a: Tensor, h_b: Tensor, target: Tensor, params: Mapping[str, Tensor]
               ) -> Tensor:
    """Sum over rows of ``KL(target || softmax(W_p sigmoid(...) + b_p))``."""
    w_x, w_abs, b_s, w_p, b_p = _p(params, "W_x", "W_abs", "W_x.b", "W_p", "W_p.b")
    h_s = torch.sigmoid(h_a * h_b @ w_x.T + (h_a - h_b).abs() @ w_abs.T + b_s)
    logp = F.log_softmax(h_s @ w_p.T + b_p, dim=-1)
    return F.kl_div(logp, target, reduction="sum")


# ---------------------------------------------------------------------- unbatched
def _node(word: int, kids: list[tuple[Tensor, Tensor]], params: Mapping[str, Tensor]
          ) -> tuple[Tensor, Tensor]:
    emb, w_iou, b_iou, u_iou, w_f, b_f, u_f = _p(
        params, "E", "W_iou", "W_iou.b", "U_iou", "W_f", "W_f.b", "U_f")
    hidden = u_f.shape[0]
    x = emb[word]
    h_sum = sum((h for h, _ in kids), start=x.new_zeros(hidden))
    g = w_iou @ x + b_iou + u_iou @ h_sum
    i, o, u = torch.sigmoid(g[:hidden]), torch.sigmoid(g[hidden:2 * hidden]), \
        fast_tanh(g[2 * hidden:])
    c = i * u
    wf = w_f @ x + b_f
    for h_k, c_k in kids:
        c = c + torch.sigmoid(wf + u_f @ h_k) * c_k
    return o * fast_tanh(c), c


def _encode(rows: Rows, params: Mapping[str, Tensor]) -> Tensor:
    states: list[tuple[Tensor, Tensor]] = []
    for word, kids in rows:  # post-order: children first
        states.append(_node(word, [states[k] for k in kids], params))
    return states[-1][0]


def unbatched_loss(instances: Sequence[SickInstance], params: Mapping[str, Tensor]) -> Tensor:
    """The mini-batch loss, one pair and one tree node at a time."""
    total: Tensor | None = None
    for inst in instances:
        h_a, h_b = _encode(inst.a, params), _encode(inst.b, params)
        loss = _head_loss(h_a, h_b, _targets([inst], h_a)[0], params)
        total = loss if total is None else total + loss
    assert total is not None, "no instances"
    return total


class SickUnbatched(hand_batched.PerInstance):
    """:func:`unbatched_loss` as a benchmark contender (``prepare`` has nothing to do)."""

    def forward(self, prepared: Sequence[SickInstance]) -> Tensor:
        return unbatched_loss(prepared, self.params)


# ---------------------------------------------------------------------- level-batched
def _levels(trees: Sequence[Rows]) -> dict[str, Any]:
    """Index arrays of every tree's nodes sorted by level (stable: roots stay in order)."""
    words: list[int] = []
    levels: list[int] = []
    parents: list[int] = []
    children: list[int] = []
    roots: list[int] = []
    for rows in trees:
        base = len(words)
        for word, kids in rows:
            words.append(word)
            levels.append(1 + max((levels[base + k] for k in kids), default=-1))
            parents.extend([len(words) - 1] * len(kids))
            children.extend(base + k for k in kids)
        roots.append(len(words) - 1)
    order, pos, starts = hand_batched.levels(np.array(levels))
    parent = pos[np.array(parents, dtype=np.int64)]  # positions in the level-sorted buffers
    child = pos[np.array(children, dtype=np.int64)]
    by_parent = np.argsort(parent, kind="stable")
    parent, child = parent[by_parent], child[by_parent]
    edge_starts = np.searchsorted(parent, starts)
    steps = []
    for (lo, hi), (e0, e1) in zip(itertools.pairwise(starts[1:]),
                                  itertools.pairwise(edge_starts[1:]), strict=True):
        steps.append((lo, hi, torch.from_numpy(parent[e0:e1]), torch.from_numpy(child[e0:e1]),
                      torch.from_numpy(parent[e0:e1] - lo)))
    return {"n": len(order), "leaves": starts[1], "steps": steps,
            "words": torch.from_numpy(np.array(words)[order]),
            "roots": torch.from_numpy(pos[np.array(roots)])}


def level_batched_roots(prep: Mapping[str, Any], params: Mapping[str, Tensor]) -> Tensor:
    """Root ``h`` of every tree of :func:`_levels` ``prep``, ``[T, H]``, one batch per level."""
    emb, w_iou, b_iou, u_iou, w_f, b_f, u_f = _p(
        params, "E", "W_iou", "W_iou.b", "U_iou", "W_f", "W_f.b", "U_f")
    hidden, n, leaves = u_f.shape[0], prep["n"], prep["leaves"]
    x = F.embedding(prep["words"], emb, sparse=True)  # row gradients, as edbatch's
    iou_x = F.linear(x, w_iou, b_iou)  # the input projections of all nodes at once
    f_x = F.linear(x, w_f, b_f)
    hbuf, cbuf = x.new_zeros(n, hidden), x.new_zeros(n, hidden)
    g = iou_x[:leaves]  # leaves: no children
    c = torch.sigmoid(g[:, :hidden]) * fast_tanh(g[:, 2 * hidden:])
    hbuf[:leaves] = torch.sigmoid(g[:, hidden:2 * hidden]) * fast_tanh(c)
    cbuf[:leaves] = c
    for lo, hi, parent, child, seg in prep["steps"]:
        h_k, c_k = hbuf[child], cbuf[child]
        h_sum = x.new_zeros(hi - lo, hidden).index_add(0, seg, h_k)
        g = iou_x[lo:hi] + F.linear(h_sum, u_iou)
        f = torch.sigmoid(f_x[parent] + F.linear(h_k, u_f))
        c = torch.sigmoid(g[:, :hidden]) * fast_tanh(g[:, 2 * hidden:]) + \
            x.new_zeros(hi - lo, hidden).index_add(0, seg, f * c_k)
        hbuf[lo:hi] = torch.sigmoid(g[:, hidden:2 * hidden]) * fast_tanh(c)
        cbuf[lo:hi] = c
    return hbuf[prep["roots"]]


class SickLevels(hand_batched.HandBatched):
    """The child-sum Tree-LSTM batched level by level across the mini-batch (module doc)."""

    def prepare(self, instances: Sequence[SickInstance]) -> dict[str, Any]:
        prep = _levels([t for inst in instances for t in (inst.a, inst.b)])
        prep["target"] = torch.tensor([similarity_target(i.score) for i in instances])
        return prep

    def forward(self, prep: dict[str, Any]) -> Tensor:
        roots = level_batched_roots(prep, self.params)
        return _head_loss(roots[0::2], roots[1::2], prep["target"].to(roots.dtype),
                          self.params)


def level_batched_loss(instances: Sequence[SickInstance], params: Mapping[str, Tensor]
                       ) -> Tensor:
    """The mini-batch loss, hand-batched level by level across all trees."""
    return SickLevels(None, params).loss(instances)


#: The hand-batched model of this workload.
HandBatched = SickLevels
#: The per-instance PyTorch model of this workload.
Unbatched = SickUnbatched
