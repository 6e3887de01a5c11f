"""The DyNet peer of ``tree_lstm_sick`` (:mod:`benchmarks.dynet_peer`): the child-sum
Tree-LSTM relatedness model of Tai et al. (2015) on SICK, as a DyNet user writes it.

Each node: ``dy.lookup`` of its word, the child sum ``dy.esum`` of the children's ``h``,
one ``dy.affine_transform`` for ``[i; o; u]``, one for ``W_f x + b_f`` and one forget gate
``sig(W_f x + b_f + U_f h_k)`` per child; the head ``h_a * h_b``, ``|h_a - h_b|``,
``dy.log_softmax``; the loss ``KL(t || p) = sum_k t_k log t_k - t . log p`` with ``t`` the
sparse target of :func:`~edbatch.data.sick.similarity_target`. Equations and parameter
values are exactly edbatch's (:mod:`edbatch.workloads.tree_lstm_sick`). Torch-free (the
DyNet worker does not import torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edbatch.data.sick import similarity_target

__all__ = ["LOOKUPS", "loss"]

_P = "tree_lstm_sick"
#: Parameters held as DyNet lookup tables.
LOOKUPS = (f"{_P}.E",)


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the graph of ``batch`` (``SickInstance``\\ s); return the summed KL loss."""
    dy.renew_cg()
    emb = p[f"{_P}.E"]
    w_iou, b_iou, u_iou = p[f"{_P}.W_iou"], p[f"{_P}.W_iou.b"], p[f"{_P}.U_iou"]
    w_f, b_f, u_f = p[f"{_P}.W_f"], p[f"{_P}.W_f.b"], p[f"{_P}.U_f"]
    w_x, w_abs, b_s = p[f"{_P}.W_x"], p[f"{_P}.W_abs"], p[f"{_P}.W_x.b"]
    w_p, b_p = p[f"{_P}.W_p"], p[f"{_P}.W_p.b"]
    affine, pick, sig, tanh, cmult = (dy.affine_transform, dy.pick_range, dy.logistic,
                                      dy.tanh, dy.cmult)

    def encode(rows: Sequence[tuple[int, tuple[int, ...]]]) -> Any:
        states: list[tuple[Any, Any]] = []
        for word, kids in rows:  # post-order: children first
            x = dy.lookup(emb, word)
            if kids:
                h_sum = dy.esum([states[k][0] for k in kids])
                g = affine([b_iou, w_iou, x, u_iou, h_sum])
            else:
                g = affine([b_iou, w_iou, x])
            i, o, u = sig(pick(g, 0, hid)), sig(pick(g, hid, 2 * hid)), tanh(
                pick(g, 2 * hid, 3 * hid))
            c = cmult(i, u)
            if kids:
                wf = affine([b_f, w_f, x])
                # (affine_transform with an expression as its bias has no batched backward)
                c = dy.esum([c, *(cmult(sig(wf + u_f * states[k][0]), states[k][1])
                                  for k in kids)])
            states.append((cmult(o, tanh(c)), c))
        return states[-1][0]

    losses = []
    for inst in batch:
        h_a, h_b = encode(inst.a), encode(inst.b)
        h_s = sig(affine([b_s, w_x, cmult(h_a, h_b), w_abs, dy.abs(h_a - h_b)]))
        logp = dy.log_softmax(affine([b_p, w_p, h_s]))
        t = similarity_target(inst.score)
        entropy = sum(x * math.log(x) for x in t if x > 0)
        losses.append(-dy.dot_product(dy.inputVector(list(t)), logp) + entropy)
    return dy.esum(losses)
