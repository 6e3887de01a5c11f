"""Hand-batched PyTorch peers: what a PyTorch practitioner writes instead of a batching library.

Every model takes the same parameters as the edbatch workload (``init_params`` seeded with 0,
the same names) and computes the same loss (the sum of every per-node / per-token negative
log-likelihood), so its loss on a mini-batch equals edbatch's reference loss:

* **Tree-LSTM**, level by level (as DGL propagates, in plain PyTorch): all nodes of the
  mini-batch sorted by height; every leaf in one embedding + GEMM, then one cell call per
  height over all nodes of that height, children gathered by index from ``h`` / ``c``
  buffers that each level writes a slice of; one GEMM + cross-entropy for every node's loss.
* **Lattice-LSTM**, level by level: states sorted by their longest path from the start
  state; per level one LSTM step per arc kind (character / word arcs have their own
  embeddings and weights) over all arcs into that level's states, the arcs' outputs summed
  into their states with ``index_add``; one loss GEMM over every state.
* **BiLSTM tagger**: one ``nn.LSTM(num_layers=2, bidirectional=True)`` over a packed padded
  mini-batch (its weights are the workload's, gate rows reordered from edbatch's
  ``i f o u`` to torch's ``i f g o``, copied once), then the per-token MLP loss on the valid
  positions.

The element-wise ``tanh`` of the Tree- and Lattice-LSTM cells is edbatch's
:func:`~edbatch.executor.kernels.fast_tanh` (the same arithmetic as the edbatch kernels, so
the rows compare batching, not a tanh implementation); ``nn.LSTM`` uses its own kernels.
Embedding lookups have sparse (row) gradients, as edbatch's training and DyNet's lookups.

Each model is a :class:`HandBatched`: ``prepare(instances)`` builds the index arrays of a
mini-batch (numpy; the ``construction`` phase) and ``forward(prepared)`` returns the loss.

TorchFold (``torchfold`` 0.1.0 on PyPI, the dynamic-batching helper for PyTorch) is tried by
:func:`torchfold_status`: on torch >= 1 its ``Fold.add`` evaluates ``torch.tensor._TensorBase``
(torch 0.3's tensor base class; ``torch.tensor`` is now a function), so every ``add`` raises
``AttributeError`` before anything is batched.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.errors import GraphError
from edbatch.executor.kernels import fast_tanh

__all__ = ["HAND_BATCHED", "BiLSTMPacked", "HandBatched", "LatticeLSTMLevels",
           "TreeLSTMLevels", "make_hand_batched", "torchfold_status"]


class HandBatched:
    """A hand-batched model over one workload's parameters (see the module docstring)."""

    def __init__(self, wl: Any, params: Mapping[str, Tensor]) -> None:
        self.wl, self.params = wl, params

    def prepare(self, instances: Sequence[Any]) -> Any:
        """Index arrays of one mini-batch (the construction phase)."""
        raise NotImplementedError

    def forward(self, prepared: Any) -> Tensor:
        """The mini-batch loss (a scalar)."""
        raise NotImplementedError

    def parameters(self) -> list[Tensor]:
        """The tensors an optimizer step updates."""
        return list(self.params.values())

    def loss(self, instances: Sequence[Any]) -> Tensor:
        """``forward(prepare(instances))``."""
        return self.forward(self.prepare(instances))


def _levels(order_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:  # type: ignore[type-arg]
    """Stable sort by ``order_key``: ``(order, position of each item, level starts)``."""
    order = np.argsort(order_key, kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    starts = np.searchsorted(order_key[order], np.arange(int(order_key.max()) + 2)).tolist()
    return order, pos, starts


class TreeLSTMLevels(HandBatched):
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
        order, pos, starts = _levels(height)
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


class LatticeLSTMLevels(HandBatched):
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
        order, pos, starts = _levels(lv_all)
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


def _torch_gate_order(w: Tensor) -> Tensor:
    """edbatch's gate blocks ``i f o u`` -> torch's ``i f g o`` (along dim 0)."""
    i, f, o, u = w.chunk(4, 0)
    return torch.cat([i, f, u, o], 0)


class BiLSTMPacked(HandBatched):
    """The BiLSTM tagger as ``nn.LSTM(2 layers, bidirectional)`` over packed sequences."""

    def __init__(self, wl: Any, params: Mapping[str, Tensor]) -> None:
        super().__init__(wl, params)
        emb = params["bilstm.emb"]
        embed, hidden = emb.shape[1], wl.hidden_dim
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, bidirectional=True).to(emb.dtype)
        with torch.no_grad():
            for layer, in_dim in ((1, embed), (2, 2 * hidden)):
                for direction, suffix in (("fwd", ""), ("bwd", "_reverse")):
                    w = _torch_gate_order(params[f"bilstm.l{layer}_{direction}"].detach())
                    b = _torch_gate_order(params[f"bilstm.l{layer}_{direction}.b"].detach())
                    tail = f"_l{layer - 1}{suffix}"
                    getattr(self.lstm, f"weight_ih{tail}").copy_(w[:, :in_dim])
                    getattr(self.lstm, f"weight_hh{tail}").copy_(w[:, in_dim:])
                    getattr(self.lstm, f"bias_ih{tail}").copy_(b)
                    getattr(self.lstm, f"bias_hh{tail}").zero_()
        self.lstm.requires_grad_(emb.requires_grad)

    def parameters(self) -> list[Tensor]:
        keep = ("bilstm.emb", "bilstm.hidden", "bilstm.hidden.b", "bilstm.out", "bilstm.out.b")
        return [self.params[k] for k in keep] + list(self.lstm.parameters())

    def prepare(self, instances: Sequence[Any]) -> dict[str, Any]:
        lengths = np.array([len(inst) for inst in instances])
        words = np.zeros((int(lengths.max()), len(instances)), dtype=np.int64)
        mask = np.arange(words.shape[0])[:, None] < lengths[None, :]
        words.T[mask.T] = np.concatenate([inst.word_ids for inst in instances])
        tags = np.concatenate([inst.tag_ids for inst in instances])  # batch-major
        return {"words": torch.from_numpy(words), "lengths": torch.from_numpy(lengths),
                "mask": torch.from_numpy(mask.T.copy()), "tags": torch.from_numpy(tags)}

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p = self.params
        x = F.embedding(prep["words"], p["bilstm.emb"], sparse=True)
        packed = nn.utils.rnn.pack_padded_sequence(x, prep["lengths"], enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out)  # [T, B, 2H]
        states = padded.transpose(0, 1)[prep["mask"][:, :padded.shape[0]]]  # batch-major
        a = torch.tanh(F.linear(states, p["bilstm.hidden"], p["bilstm.hidden.b"]))
        logits = F.linear(a, p["bilstm.out"], p["bilstm.out.b"])
        return F.cross_entropy(logits, prep["tags"], reduction="sum")


#: Workload name -> hand-batched model class.
HAND_BATCHED: dict[str, type[HandBatched]] = {
    "tree_lstm": TreeLSTMLevels, "lattice_lstm": LatticeLSTMLevels,
    "bilstm_tagger": BiLSTMPacked}


def make_hand_batched(wl: Any, params: Mapping[str, Tensor]) -> HandBatched | None:
    """The hand-batched model of ``wl`` (``None`` if there is none for it)."""
    cls = HAND_BATCHED.get(wl.name)
    return None if cls is None else cls(wl, params)


def torchfold_status() -> str | None:
    """``None`` if TorchFold batches a one-node fold on this torch, else why not (the
    exception, verbatim)."""
    try:
        import torchfold
    except ImportError as e:
        return f"torchfold is not installed ({e}); pip install torchfold"

    class _Probe(nn.Module):
        def leaf(self, words: Tensor) -> Tensor:
            return words.float().unsqueeze(1)

    try:
        fold = torchfold.Fold()
        node = fold.add("leaf", 1)
        fold.apply(_Probe(), [[node]])
    except Exception as e:  # any failure is the recorded reason
        return f"torchfold {getattr(torchfold, '__version__', '0.1.0')} on torch " \
               f"{torch.__version__}: Fold.add raised {type(e).__name__}: {e}"
    return None
