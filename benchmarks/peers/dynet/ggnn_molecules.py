"""The DyNet peer of ``ggnn_molecules`` (:mod:`benchmarks.dynet_peer`): the gated graph
neural network (Li et al.) regressing ESOL log solubility, as a DyNet user writes it.

Per molecule: an atom's state is the ``dy.esum`` of its six feature rows (``dy.lookup``);
per round one message ``A_b h_u + c_b`` (``dy.affine_transform``) per (source atom, bond
type) present, summed into each atom (``dy.esum``; ``dy.zeros`` for an isolated atom), the
GRU update on ``[a; h]`` (``dy.concatenate``, ``dy.pick_range`` gate slices); the gated sum
readout and the squared error of the standardised target. Equations and parameter values
are exactly edbatch's (:mod:`edbatch.workloads.ggnn_molecules`); the rounds are the
workload's default, as the throughput harness builds it. Torch-free (the DyNet worker does
not import torch).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from edbatch.data.molecules import BOND_TYPES
from edbatch.workloads.ggnn_molecules import TARGET_SCALE, GGNNMolecules, unpack_atom

__all__ = ["LOOKUPS", "ROUNDS", "loss"]

_P = "ggnn"
#: Parameters held as DyNet lookup tables.
LOOKUPS = (f"{_P}.atom_emb",)
#: Message-passing rounds: ``GGNNMolecules``' default (what the benchmark runs).
ROUNDS: int = inspect.signature(GGNNMolecules.__init__).parameters["rounds"].default


def loss(dy: Any, p: dict[str, Any], hid: int, batch: Sequence[Any], rounds: int = ROUNDS
         ) -> Any:
    """Build the GGNN graph of ``batch`` (``MoleculeInstance``\\ s); return the summed
    squared error."""
    dy.renew_cg()
    emb = p[f"{_P}.atom_emb"]
    msg = [(p[f"{_P}.msg.{b}"], p[f"{_P}.msg.{b}.b"]) for b in BOND_TYPES]
    w_rz, b_rz, w_c, b_c = (p[f"{_P}.gru.{n}"] for n in ("rz", "rz.b", "c", "c.b"))
    w_g, b_g, w_j, b_j = (p[f"{_P}.{n}"] for n in ("gate", "gate.b", "proj", "proj.b"))
    w_h, b_h, w_o, b_o = (p[f"{_P}.{n}"] for n in ("hid", "hid.b", "pred", "pred.b"))
    affine, pick, sig, tanh, cmult, cat = (dy.affine_transform, dy.pick_range, dy.logistic,
                                           dy.tanh, dy.cmult, dy.concatenate)

    def gru(a: Any, h: Any) -> Any:
        rz = sig(affine([b_rz, w_rz, cat([a, h])]))
        r, z = pick(rz, 0, hid), pick(rz, hid, 2 * hid)
        c = tanh(affine([b_c, w_c, cat([a, cmult(r, h)])]))
        return cmult(z, h) + cmult(-z + 1.0, c)  # (DyNet has no float - Expression)

    losses = []
    for inst in batch:
        h = [dy.esum([dy.lookup(emb, r) for r in unpack_atom(code)])
             for code in inst.atom_codes]
        keys = list(dict.fromkeys(pair for srcs in inst.sources for pair in srcs))
        for _ in range(rounds):
            m = {(u, t): affine([msg[t][1], msg[t][0], h[u]]) for u, t in keys}
            h = [gru(dy.esum([m[k] for k in srcs]) if srcs else dy.zeros(hid), h[v])
                 for v, srcs in enumerate(inst.sources)]
        g = dy.esum([cmult(sig(affine([b_g, w_g, x])), tanh(affine([b_j, w_j, x])))
                     for x in h])
        pred = affine([b_o, w_o, tanh(affine([b_h, w_h, g]))])
        losses.append(dy.square(pred - inst.target_code / TARGET_SCALE))
    return dy.esum(losses)
