"""The DyNet peer of ``transition_parser`` (:mod:`benchmarks.dynet_peer`): the arc-standard
parser with BiLSTM features, written as DyNet users write it (Kiperwasser & Goldberg's
``bist-parser`` style: ``dy.lookup``, one fused ``dy.affine_transform`` per LSTM step, an
MLP over the concatenated feature vectors).

* ``loss(dy, params, hidden, instances)``: the training graph along the oracle transitions
  in a fresh computation graph, the summed ``pickneglogsoftmax`` (what
  :mod:`benchmarks.dynet_peer` times).
* :func:`parse`: greedy inference, **one sentence at a time** with ``.npvalue()`` on every
  decision's scores (how DyNet parsers decode: the next action needs the value now, so
  every read forces evaluation of that sentence's pending graph).

Torch-free (the DyNet worker does not import torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.peers.dynet import lstm_step
from edbatch.data.transitions import SHIFT, ArcStandardState
from edbatch.workloads.transition_parser import ROOT, config_items

__all__ = ["LOOKUPS", "loss", "parse"]

#: Parameters held as DyNet lookup tables.
LOOKUPS = ("parser.E_w", "parser.E_p", "parser.E_special")


def _features(dy: Any, p: dict[str, Any], hid: int, layers: int, attrs: Sequence[int]
              ) -> list[Any]:
    """One sentence's BiLSTM feature expressions ``[h_fwd; h_bwd]`` per word."""
    tags = p["parser.E_p"].shape()[0]
    xs = [dy.concatenate([dy.lookup(p["parser.E_w"], a // tags),
                          dy.lookup(p["parser.E_p"], a % tags)]) for a in attrs]
    zero = dy.zeros(hid)
    for layer in range(1, layers + 1):
        outs: list[list[Any]] = [[] for _ in attrs]
        for d, order in (("fwd", range(len(xs))), ("bwd", range(len(xs) - 1, -1, -1))):
            w, b = p[f"parser.l{layer}_{d}"], p[f"parser.l{layer}_{d}.b"]
            h, c = zero, zero
            for t in order:
                h, c = lstm_step(dy, w, b, xs[t], h, c, hid)
                outs[t].append(h)
        xs = [dy.concatenate(o) for o in outs]
    return xs


def _scores(dy: Any, p: dict[str, Any], state: ArcStandardState, feats: list[Any]) -> Any:
    vec = [dy.lookup(p["parser.E_special"], 0 if i == ROOT else 1) if i <= 0 else feats[i - 1]
           for i in config_items(state.stack, state.next, state.n)]
    hidden = dy.tanh(dy.affine_transform([p["parser.W_h.b"], p["parser.W_h"],
                                          dy.concatenate(vec)]))
    return dy.affine_transform([p["parser.W_o.b"], p["parser.W_o"], hidden])


def _layers(p: dict[str, Any]) -> int:
    return 2 if "parser.l2_fwd" in p else 1


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any]) -> Any:
    """The oracle-transition graph of ``batch`` (``ParseInstance``\\ s); the summed loss.

    Each instance must carry ``classes`` and ``embed_attrs``; the class -> action map is
    ``0``: ``SHIFT``, ``1..L``: ``LEFT_ARC``, ``L+1..2L``: ``RIGHT_ARC``.
    """
    dy.renew_cg()
    num_labels = (p["parser.W_o"].shape()[0] - 1) // 2
    losses = []
    for inst in batch:
        feats = _features(dy, p, hid, _layers(p), inst.embed_attrs)
        state = ArcStandardState(len(inst.embed_attrs))
        for cls in inst.classes:
            losses.append(dy.pickneglogsoftmax(_scores(dy, p, state, feats), cls))
            state.apply(SHIFT if cls == 0 else 1 if cls <= num_labels else 2)
    return dy.esum(losses)


def parse(dy: Any, p: dict[str, Any], hid: int, sentences: Sequence[Sequence[int]],
          class_actions: np.ndarray) -> list[tuple[list[int], list[int], int]]:
    """Parse each sentence greedily in its own computation graph, reading every decision's
    scores with ``.npvalue()``; ``(heads, relation ids, reads)`` per sentence."""
    num_labels = (len(class_actions) - 1) // 2
    out = []
    for attrs in sentences:
        dy.renew_cg()
        feats = _features(dy, p, hid, _layers(p), attrs)
        state = ArcStandardState(len(attrs))
        labels, reads = [-1] * len(attrs), 0
        while not state.done:
            legal = state.legal()
            if legal == (True, False, False):
                state.apply(SHIFT)
                continue
            scores = _scores(dy, p, state, feats).npvalue()
            reads += 1
            scores = np.where(np.asarray(legal)[class_actions], scores, -np.inf)
            cls = int(np.argmax(scores))
            action = SHIFT if cls == 0 else 1 if cls <= num_labels else 2
            dependent = state.apply(action)
            if dependent:
                labels[dependent - 1] = (cls - 1) % num_labels
        out.append((list(state.heads), labels, reads))
    return out
