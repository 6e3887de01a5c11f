"""The DyNet peer of ``bilstm_tagger`` (:mod:`benchmarks.dynet_peer`): the BiLSTM tagger.

``loss(dy, params, hidden, instances)`` builds the mini-batch's graph in a fresh computation
graph and returns the summed loss; ``LOOKUPS`` names the parameters DyNet holds as lookup
tables. Torch-free (the DyNet worker does not import torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.peers.dynet import lstm_step

__all__ = ["LOOKUPS", "loss"]

#: Parameters held as DyNet lookup tables.
LOOKUPS = ("bilstm.emb",)


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the BiLSTM-tagger graph of ``batch`` (``TaggedInstance``\\ s); return the loss."""
    dy.renew_cg()
    emb = p["bilstm.emb"]
    l1f, l1b, l2f, l2b = ((p[f"bilstm.{d}"], p[f"bilstm.{d}.b"])
                          for d in ("l1_fwd", "l1_bwd", "l2_fwd", "l2_bwd"))
    w_hid, b_hid, w_out, b_out = (p["bilstm.hidden"], p["bilstm.hidden.b"], p["bilstm.out"],
                                  p["bilstm.out.b"])
    zero = dy.zeros(hid)

    def run(cell: tuple[Any, Any], xs: list[Any], backward: bool) -> list[Any]:
        out: list[Any] = [None] * len(xs)
        h, c = zero, zero
        for t in (range(len(xs) - 1, -1, -1) if backward else range(len(xs))):
            h, c = lstm_step(dy, *cell, xs[t], h, c, hid)
            out[t] = h
        return out

    losses = []
    for inst in batch:
        xs = [dy.lookup(emb, w) for w in inst.word_ids]
        f1, b1 = run(l1f, xs, False), run(l1b, xs, True)
        x2 = [dy.concatenate([f, b]) for f, b in zip(f1, b1)]
        f2, b2 = run(l2f, x2, False), run(l2b, x2, True)
        for f, b, tag in zip(f2, b2, inst.tag_ids):
            hidden = dy.tanh(dy.affine_transform([b_hid, w_hid, dy.concatenate([f, b])]))
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_out, w_out, hidden]),
                                               tag))
    return dy.esum(losses)
