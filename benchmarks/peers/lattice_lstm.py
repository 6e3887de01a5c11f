"""The benchmark peers of ``lattice_lstm``: Lattice-LSTM over character lattices.

``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`);
``HandBatched``: the hand-batched PyTorch model (:mod:`benchmarks.hand_batched`);
``Unbatched``: per-instance PyTorch, one lattice and one arc at a time (the
``pytorch_unbatched`` contender, the seeds' baseline). Found by
the workload's name (:func:`benchmarks.peers.find_peers`); the DyNet peer is
``benchmarks/peers/dynet/lattice_lstm.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks import hand_batched
from edbatch.api import DynamicBatch
from edbatch.executor.kernels import fast_tanh

__all__ = ["HandBatched", "LatticeLSTMLevels", "LatticeLSTMUnbatched", "Unbatched", "record"]


def record(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """Lattice-LSTM: one arc cell per arc, a ``k``-ary sum per state with ``k`` incoming
    arcs, a loss per state (states in topological order)."""
    start = batch.op("lattice_lstm.start")
    arcs = (batch.op("lattice_lstm.char_arc"), batch.op("lattice_lstm.word_arc"))
    loss = batch.op("lattice_lstm.loss")
    sums: dict[int, Any] = {}
    add_loss = batch.add_loss
    for inst in instances:
        ptr, src, kind, token, tags = (inst.arc_ptr, inst.arc_src, inst.arc_kind,
                                       inst.arc_token, inst.tags)
        with batch.instance():
            states = [start()]
            for i in range(1, inst.num_states):
                incoming = [arcs[kind[a]](states[src[a]], attr=token[a])
                            for a in range(ptr[i], ptr[i + 1])]
                if len(incoming) == 1:
                    state = incoming[0]
                else:
                    k = len(incoming)
                    op = sums.get(k) or sums.setdefault(k, batch.op(f"lattice_lstm.sum{k}"))
                    state = op(*incoming)
                states.append(state)
                add_loss(loss(state, attr=tags[i]))


class LatticeLSTMLevels(hand_batched.HandBatched):
    """Lattice-LSTM batched level by level (states by longest path from the start)."""

    def prepare(self, instances: Sequence[Any]) -> dict[str, Any]:
        src, dst, kind, token, tags, level, offset = [], [], [], [], [], [], 0
        for inst in instances:
            ptr = np.asarray(inst.arc_ptr)
            s = np.asarray(inst.arc_src, dtype=np.int64)
            d = np.repeat(np.arange(inst.num_states), np.diff(ptr))
            lv = [0] * inst.num_states
            for i in range(1, inst.num_states):  # arcs into i come from states j < i
                lv[i] = 1 + max(lv[j] for j in inst.arc_src[ptr[i]:ptr[i + 1]])
            src.append(s + offset)
            dst.append(d + offset)
            kind.append(np.asarray(inst.arc_kind))
            token.append(np.asarray(inst.arc_token))
            tags.append(np.asarray(inst.tags))
            level.append(np.asarray(lv))
            offset += inst.num_states
        lv_all = np.concatenate(level)
        order, pos, starts = hand_batched.levels(lv_all)
        src_p, dst_p = pos[np.concatenate(src)], pos[np.concatenate(dst)]
        kind_a, token_a = np.concatenate(kind), np.concatenate(token)
        arc_level = lv_all[order][dst_p]
        levels = []
        for lvl, (lo, hi) in enumerate(itertools.pairwise(starts[1:]), start=1):
            parts = []
            for k in (0, 1):
                sel = np.flatnonzero((arc_level == lvl) & (kind_a == k))
                if len(sel):
                    parts.append((k, torch.from_numpy(src_p[sel]),
                                  torch.from_numpy(dst_p[sel] - lo),
                                  torch.from_numpy(token_a[sel])))
            levels.append((lo, hi, parts))
        tags_sorted = np.concatenate(tags)[order]
        return {"n": len(order), "starts": starts[1], "levels": levels,
                "labels": torch.from_numpy(tags_sorted[starts[1]:])}

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p = self.params
        hidden = p["lattice_lstm.out"].shape[1]
        cells = [(p[f"lattice_lstm.{k}_emb"], p[f"lattice_lstm.{k}_cell"],
                  p[f"lattice_lstm.{k}_cell.b"]) for k in ("char", "word")]
        dtype = p["lattice_lstm.out"].dtype
        hbuf = torch.zeros(prep["n"], hidden, dtype=dtype)
        cbuf = torch.zeros(prep["n"], hidden, dtype=dtype)
        for lo, hi, parts in prep["levels"]:
            h_sum = torch.zeros(hi - lo, hidden, dtype=dtype)
            c_sum = torch.zeros(hi - lo, hidden, dtype=dtype)
            for k, src, dst, token in parts:
                emb, weight, bias = cells[k]
                c_in = cbuf[src]
                x = F.embedding(token, emb, sparse=True)
                g = F.linear(torch.cat([x, hbuf[src]], 1), weight, bias)
                gates = torch.sigmoid(g[:, :3 * hidden])
                i, f, o = gates[:, :hidden], gates[:, hidden:2 * hidden], gates[:, 2 * hidden:]
                c = f * c_in + i * fast_tanh(g[:, 3 * hidden:])
                h_sum = h_sum.index_add(0, dst, o * fast_tanh(c))
                c_sum = c_sum.index_add(0, dst, c)
            hbuf[lo:hi] = h_sum
            cbuf[lo:hi] = c_sum
        logits = F.linear(hbuf[prep["starts"]:], p["lattice_lstm.out"], p["lattice_lstm.out.b"])
        return F.cross_entropy(logits, prep["labels"], reduction="sum")


class LatticeLSTMUnbatched(hand_batched.PerInstance):
    """Lattice-LSTM in plain per-instance PyTorch: states in topological order, every arc's
    LSTM step on its source state's vectors alone, a state the sum of its arcs' outputs, a
    loss per state (``prepare`` has nothing to do)."""

    def forward(self, instances: Sequence[Any]) -> Tensor:
        p = self.params
        out, out_b = p["lattice_lstm.out"], p["lattice_lstm.out.b"]
        hidden = out.shape[1]
        cells = [(p[f"lattice_lstm.{k}_emb"], p[f"lattice_lstm.{k}_cell"],
                  p[f"lattice_lstm.{k}_cell.b"]) for k in ("char", "word")]
        losses: list[Tensor] = []
        for inst in instances:
            zero = out.new_zeros(hidden)
            states = [(zero, zero)]
            for i in range(1, inst.num_states):
                hs, cs = [], []
                for a in range(inst.arc_ptr[i], inst.arc_ptr[i + 1]):
                    emb, weight, bias = cells[inst.arc_kind[a]]
                    h_in, c_in = states[inst.arc_src[a]]
                    x = F.embedding(torch.tensor(int(inst.arc_token[a])), emb, sparse=True)
                    h, c = hand_batched.lstm_step(x, h_in, c_in, weight, bias, fast_tanh)
                    hs.append(h)
                    cs.append(c)
                h, c = (hs[0], cs[0]) if len(hs) == 1 else (sum(hs[1:], hs[0]),
                                                             sum(cs[1:], cs[0]))
                states.append((h, c))
                losses.append(F.cross_entropy(F.linear(h, out, out_b)[None],
                                              torch.tensor([int(inst.tags[i])]),
                                              reduction="sum"))
        return torch.stack(losses).sum()


#: The hand-batched model of this workload.
HandBatched = LatticeLSTMLevels
#: The per-instance PyTorch model of this workload (the ``pytorch_unbatched`` contender).
Unbatched = LatticeLSTMUnbatched
