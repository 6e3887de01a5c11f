"""The DyNet peer of ``tree_lstm`` (:mod:`benchmarks.dynet_peer`): the Tree-LSTM.

``loss(dy, params, hidden, instances)`` builds the mini-batch's graph in a fresh computation
graph and returns the summed loss; ``LOOKUPS`` names the parameters DyNet holds as lookup
tables. Torch-free (the DyNet worker does not import torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LOOKUPS", "loss"]

#: Parameters held as DyNet lookup tables.
LOOKUPS = ("tree_lstm.E",)


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the Tree-LSTM graph of ``batch`` (``TreeInstance``\\ s); return the summed loss."""
    dy.renew_cg()
    emb, w_iou, b_iou = p["tree_lstm.E"], p["tree_lstm.W_iou"], p["tree_lstm.W_iou.b"]
    u_iou, bu_iou = p["tree_lstm.U_iou"], p["tree_lstm.U_iou.b"]
    u_f1, u_f2, b_f = p["tree_lstm.U_f1"], p["tree_lstm.U_f2"], p["tree_lstm.b_f"]
    w_out, b_out = p["tree_lstm.W_out"], p["tree_lstm.W_out.b"]
    affine, pick, sig, tanh, cmult = (dy.affine_transform, dy.pick_range, dy.logistic,
                                      dy.tanh, dy.cmult)
    losses = []
    for inst in batch:
        states: list[tuple[Any, Any]] = []
        for word, left, right, label in inst.nodes:
            if left < 0:
                g = affine([b_iou, w_iou, dy.lookup(emb, word)])
                i, o, u = sig(pick(g, 0, hid)), sig(pick(g, hid, 2 * hid)), tanh(
                    pick(g, 2 * hid, 3 * hid))
                c = cmult(i, u)
                s = (cmult(o, tanh(c)), c)
            elif right < 0:
                s = states[left]  # a unary node passes its child's state through
            else:
                (h1, c1), (h2, c2) = states[left], states[right]
                g = affine([bu_iou, u_iou, dy.concatenate([h1, h2])])
                i, o, u = sig(pick(g, 0, hid)), sig(pick(g, hid, 2 * hid)), tanh(
                    pick(g, 2 * hid, 3 * hid))
                f1 = sig(affine([b_f, u_f1, h1]))
                f2 = sig(affine([b_f, u_f2, h2]))
                c = cmult(i, u) + cmult(f1, c1) + cmult(f2, c2)
                s = (cmult(o, tanh(c)), c)
            states.append(s)
            losses.append(dy.pickneglogsoftmax(affine([b_out, w_out, s[0]]), label))
    return dy.esum(losses)
