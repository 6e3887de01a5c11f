"""The benchmark peers of ``tree_lstm``: Tree-LSTM over SST trees.

``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`);
``HandBatched``: the hand-batched PyTorch model (:mod:`benchmarks.hand_batched`);
``Unbatched``: per-instance PyTorch, one tree and one node at a time (the same recursion as
``record``, each node's cell and loss its own small kernels: the ``pytorch_unbatched``
contender, the seeds' baseline). Found by
the workload's name (:func:`benchmarks.peers.find_peers`); the DyNet peer is
``benchmarks/peers/dynet/tree_lstm.py``.
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
from edbatch.api import DynamicBatch, Handle
from edbatch.errors import GraphError
from edbatch.executor.kernels import fast_tanh

__all__ = ["HandBatched", "TreeLSTMLevels", "TreeLSTMUnbatched", "Unbatched", "record"]


def record(batch: DynamicBatch, wl: Any, instances: Sequence[Any]) -> None:
    """Tree-LSTM over SST trees: recursion over each parsed tree, a loss at every node."""
    leaf, internal, loss = (batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))
    add_loss, word_id = batch.add_loss, wl.word_vocab.id

    def encode(node: Any) -> Handle:
        kids = node.children
        if not kids:
            state = leaf(attr=word_id(node.word))
        elif len(kids) == 1:  # unary: pass the child's state through (none in SST)
            state = encode(kids[0])
        else:
            left = encode(kids[0])
            state = internal(left, encode(kids[1]))
        add_loss(loss(state, attr=node.label))
        return state

    for inst in instances:
        with batch.instance():
            encode(inst.tree)


class TreeLSTMLevels(hand_batched.HandBatched):
    """Tree-LSTM batched level by level (binary trees; SST has no unary node)."""

    def prepare(self, instances: Sequence[Any]) -> dict[str, Any]:
        rows, heights, offset = [], [], 0
        for inst in instances:
            r, h = inst._columns
            if np.any((r[:, 1] >= 0) & (r[:, 2] < 0)):
                raise GraphError("the hand-batched Tree-LSTM takes binary trees only (SST's); "
                                 "this tree has a unary node")
            r = r.copy()
            r[:, 1:3] = np.where(r[:, 1:3] >= 0, r[:, 1:3] + offset, -1)
            rows.append(r)
            heights.append(h)
            offset += len(r)
        allrows, height = np.concatenate(rows), np.concatenate(heights)
        order, pos, starts = hand_batched.levels(height)
        sorted_rows = allrows[order]
        levels = []
        for lo, hi in itertools.pairwise(starts[1:]):
            kids = sorted_rows[lo:hi, 1:3]
            levels.append((lo, hi, torch.from_numpy(pos[kids[:, 0]]),
                           torch.from_numpy(pos[kids[:, 1]])))
        return {"n": len(order), "leaves": starts[1],
                "words": torch.from_numpy(sorted_rows[:starts[1], 0]),
                "labels": torch.from_numpy(sorted_rows[:, 3]), "levels": levels}

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p = {k.split(".", 1)[1]: v for k, v in self.params.items()}
        hidden = p["U_f1"].shape[0]
        n, leaves = prep["n"], prep["leaves"]
        dtype = p["E"].dtype
        hbuf = torch.zeros(n, hidden, dtype=dtype)
        cbuf = torch.zeros(n, hidden, dtype=dtype)
        x = F.embedding(prep["words"], p["E"], sparse=True)  # row gradients, as edbatch's
        g = F.linear(x, p["W_iou"], p["W_iou.b"])
        io, u = torch.sigmoid(g[:, :2 * hidden]), fast_tanh(g[:, 2 * hidden:])
        c = io[:, :hidden] * u
        hbuf[:leaves] = io[:, hidden:] * fast_tanh(c)
        cbuf[:leaves] = c
        for lo, hi, left, right in prep["levels"]:
            h1, h2, c1, c2 = hbuf[left], hbuf[right], cbuf[left], cbuf[right]
            g = F.linear(torch.cat([h1, h2], 1), p["U_iou"], p["U_iou.b"])
            io, u = torch.sigmoid(g[:, :2 * hidden]), fast_tanh(g[:, 2 * hidden:])
            f1 = torch.sigmoid(F.linear(h1, p["U_f1"], p["b_f"]))
            f2 = torch.sigmoid(F.linear(h2, p["U_f2"], p["b_f"]))
            c = io[:, :hidden] * u + f1 * c1 + f2 * c2
            hbuf[lo:hi] = io[:, hidden:] * fast_tanh(c)
            cbuf[lo:hi] = c
        logits = F.linear(hbuf, p["W_out"], p["W_out.b"])
        return F.cross_entropy(logits, prep["labels"], reduction="sum")


class TreeLSTMUnbatched(hand_batched.PerInstance):
    """Tree-LSTM in plain per-instance PyTorch: a recursion over each tree, every node's cell
    and its loss on that node's vectors alone (``prepare`` has nothing to do)."""

    def forward(self, instances: Sequence[Any]) -> Tensor:
        p = {k.split(".", 1)[1]: v for k, v in self.params.items()}
        hidden, word_id = p["U_f1"].shape[0], self.wl.word_vocab.id
        losses: list[Tensor] = []

        def encode(node: Any) -> tuple[Tensor, Tensor]:
            kids = node.children
            if not kids:
                x = F.embedding(torch.tensor(word_id(node.word)), p["E"], sparse=True)
                g = F.linear(x, p["W_iou"], p["W_iou.b"])
                c = torch.sigmoid(g[:hidden]) * fast_tanh(g[2 * hidden:])
                h = torch.sigmoid(g[hidden:2 * hidden]) * fast_tanh(c)
            elif len(kids) == 1:  # unary: the child's state (none in SST), as ``record``
                h, c = encode(kids[0])
            else:
                (h1, c1), (h2, c2) = encode(kids[0]), encode(kids[1])
                g = F.linear(torch.cat([h1, h2]), p["U_iou"], p["U_iou.b"])
                f1 = torch.sigmoid(F.linear(h1, p["U_f1"], p["b_f"]))
                f2 = torch.sigmoid(F.linear(h2, p["U_f2"], p["b_f"]))
                c = torch.sigmoid(g[:hidden]) * fast_tanh(g[2 * hidden:]) + f1 * c1 + f2 * c2
                h = torch.sigmoid(g[hidden:2 * hidden]) * fast_tanh(c)
            logits = F.linear(h, p["W_out"], p["W_out.b"])
            losses.append(F.cross_entropy(logits[None], torch.tensor([node.label]),
                                          reduction="sum"))
            return h, c

        for inst in instances:
            encode(inst.tree)
        return torch.stack(losses).sum()


#: The hand-batched model of this workload.
HandBatched = TreeLSTMLevels
#: The per-instance PyTorch model of this workload (the ``pytorch_unbatched`` contender).
Unbatched = TreeLSTMUnbatched
