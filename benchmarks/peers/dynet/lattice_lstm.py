"""The DyNet peer of ``lattice_lstm`` (:mod:`benchmarks.dynet_peer`): the Lattice-LSTM.

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
LOOKUPS = ("lattice_lstm.char_emb", "lattice_lstm.word_emb")


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the Lattice-LSTM graph of ``batch`` (``LatticeInstance``\\ s); return the loss."""
    dy.renew_cg()
    embs = (p["lattice_lstm.char_emb"], p["lattice_lstm.word_emb"])
    cells = ((p["lattice_lstm.char_cell"], p["lattice_lstm.char_cell.b"]),
             (p["lattice_lstm.word_cell"], p["lattice_lstm.word_cell.b"]))
    w_out, b_out = p["lattice_lstm.out"], p["lattice_lstm.out.b"]
    zero = dy.zeros(hid)
    losses = []
    for inst in batch:
        ptr, src, kind, token, tags = (inst.arc_ptr, inst.arc_src, inst.arc_kind,
                                       inst.arc_token, inst.tags)
        hs, cs = [zero], [zero]
        for node in range(1, inst.num_states):
            arcs = []
            for a in range(ptr[node], ptr[node + 1]):
                k, j = kind[a], src[a]
                arcs.append(lstm_step(dy, *cells[k], dy.lookup(embs[k], token[a]), hs[j], cs[j],
                                  hid))
            if len(arcs) == 1:
                h, c = arcs[0]
            else:
                h, c = dy.esum([a[0] for a in arcs]), dy.esum([a[1] for a in arcs])
            hs.append(h)
            cs.append(c)
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_out, w_out, h]),
                                               tags[node]))
    return dy.esum(losses)
