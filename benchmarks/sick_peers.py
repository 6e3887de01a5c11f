"""PyTorch peers of the SICK child-sum Tree-LSTM (``tree_lstm_sick``), on the workload's
own parameters (the dict of :func:`edbatch.executor.init_params`), computing the same loss:
the sum over pairs of ``KL(t || p)`` (equations in :mod:`edbatch.workloads.tree_lstm_sick`).

* :func:`unbatched_loss`: **unbatched per-instance PyTorch**, node by node: every tree node
  is its own small matmuls, every pair its own head (the baseline MXNet's and DyNet's
  headlines divide by).
* :func:`level_batched_loss`: **hand-batched** as a practitioner writes a child-sum
  Tree-LSTM: all trees of the mini-batch (both sides of every pair) advance together level
  by level (a node's level is one more than its highest child's), one set of matmuls per
  level over all its nodes, the children reduced per node with ``index_add``; one head call
  for the whole mini-batch.

Neither uses edbatch's graphs, schedulers or kernels; ``tests/benchmarks/test_sick_peers.py``
checks both against the workload's reference executor (fp64). No timing here (the
throughput harness interleaves peers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.data.sick import similarity_target
from edbatch.workloads.tree_lstm_sick import Rows, SickInstance

__all__ = ["level_batched_loss", "level_batched_roots", "unbatched_loss"]

_P = "tree_lstm_sick"


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
        torch.tanh(g[2 * hidden:])
    c = i * u
    wf = w_f @ x + b_f
    for h_k, c_k in kids:
        c = c + torch.sigmoid(wf + u_f @ h_k) * c_k
    return o * torch.tanh(c), c


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


# ---------------------------------------------------------------------- level-batched
def _levels(trees: Sequence[Rows]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                              np.ndarray, int]:
    """Flatten trees: per node its word, level; per child edge (parent, child); roots."""
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
    return (np.array(words), np.array(levels), np.array(parents, dtype=np.int64),
            np.array(children, dtype=np.int64), np.array(roots), max(levels))


def level_batched_roots(trees: Sequence[Rows], params: Mapping[str, Tensor]) -> Tensor:
    """Root ``h`` of every tree, ``[T, H]``, computing each level's nodes in one batch."""
    emb, w_iou, b_iou, u_iou, w_f, b_f, u_f = _p(
        params, "E", "W_iou", "W_iou.b", "U_iou", "W_f", "W_f.b", "U_f")
    hidden = u_f.shape[0]
    words, levels, parents, children, roots, top = _levels(trees)
    dev = emb.device
    x_all = emb[torch.from_numpy(words).to(dev)]
    iou_x = F.linear(x_all, w_iou, b_iou)  # the input halves for all nodes at once
    f_x = F.linear(x_all, w_f, b_f)
    h = x_all.new_zeros(len(words), hidden)
    c = x_all.new_zeros(len(words), hidden)
    for level in range(top + 1):
        nodes = np.flatnonzero(levels == level)
        local = np.full(len(words), -1, dtype=np.int64)
        local[nodes] = np.arange(len(nodes))
        edges = np.flatnonzero(levels[parents] == level) if len(parents) else parents
        seg = torch.from_numpy(local[parents[edges]]).to(dev)
        kid = torch.from_numpy(children[edges]).to(dev)
        idx = torch.from_numpy(nodes).to(dev)
        h_k, c_k = h.index_select(0, kid), c.index_select(0, kid)
        h_sum = h.new_zeros(len(nodes), hidden).index_add(0, seg, h_k)
        g = iou_x.index_select(0, idx) + F.linear(h_sum, u_iou)
        i, o = torch.sigmoid(g[:, :hidden]), torch.sigmoid(g[:, hidden:2 * hidden])
        u = torch.tanh(g[:, 2 * hidden:])
        f = torch.sigmoid(f_x.index_select(0, kid.new_tensor(nodes[local[parents[edges]]]))
                          + F.linear(h_k, u_f))
        c_new = i * u + h.new_zeros(len(nodes), hidden).index_add(0, seg, f * c_k)
        h_new = o * torch.tanh(c_new)
        h = h.index_copy(0, idx, h_new)  # out of place: autograd keeps every level
        c = c.index_copy(0, idx, c_new)
    return h.index_select(0, torch.from_numpy(roots).to(dev))


def level_batched_loss(instances: Sequence[SickInstance], params: Mapping[str, Tensor]
                       ) -> Tensor:
    """The mini-batch loss, hand-batched level by level across all trees."""
    trees = [t for inst in instances for t in (inst.a, inst.b)]
    roots = level_batched_roots(trees, params)
    return _head_loss(roots[0::2], roots[1::2], _targets(instances, roots), params)
