"""The DyNet peer of ``bilstm_char_tagger`` (:mod:`benchmarks.dynet_peer`): the BiLSTM tagger
whose rare words are composed by a character BiLSTM, written as DyNet's own
``bilstm-tagger-withchar`` benchmark writes it (a ``word_rep`` that looks a frequent word up
and runs two character LSTMs over a rare one, ``concatenate([fw[-1], bw[-1]])``).

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
LOOKUPS = ("char_tagger.cemb", "char_tagger.emb")
_P = "char_tagger"


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """Build the char-tagger graph of ``batch`` (``CharTaggedInstance``\\ s); return the loss."""
    dy.renew_cg()
    cemb, wemb = p[f"{_P}.cemb"], p[f"{_P}.emb"]
    char_fwd, char_bwd, fwd, bwd = ((p[f"{_P}.{d}"], p[f"{_P}.{d}.b"])
                                    for d in ("char_fwd", "char_bwd", "fwd", "bwd"))
    w_hid, b_hid, w_out, b_out = (p[f"{_P}.hidden"], p[f"{_P}.hidden.b"], p[f"{_P}.out"],
                                  p[f"{_P}.out.b"])
    chid = p[f"{_P}.char_fwd"].shape()[0] // 4
    zero, char_zero = dy.zeros(hid), dy.zeros(chid)

    def run(cell: tuple[Any, Any], xs: Sequence[Any], width: int, start: Any) -> list[Any]:
        h, c, out = start, start, []
        for x in xs:
            h, c = lstm_step(dy, *cell, x, h, c, width)
            out.append(h)
        return out

    def word_rep(word_id: int, chars: Sequence[int] | None) -> Any:
        if chars is None:
            return dy.lookup(wemb, word_id)
        char_embs = [dy.lookup(cemb, c) for c in chars]
        fw = run(char_fwd, char_embs, chid, char_zero)
        bw = run(char_bwd, char_embs[::-1], chid, char_zero)
        return dy.concatenate([fw[-1], bw[-1]])

    losses = []
    for inst in batch:
        xs = [word_rep(w, cs) for w, cs in zip(inst.word_ids, inst.char_ids)]
        fs, bs = run(fwd, xs, hid, zero), run(bwd, xs[::-1], hid, zero)[::-1]
        for f, b, tag in zip(fs, bs, inst.tag_ids):
            hidden = dy.tanh(dy.affine_transform([b_hid, w_hid, dy.concatenate([f, b])]))
            losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_out, w_out, hidden]),
                                               tag))
    return dy.esum(losses)
