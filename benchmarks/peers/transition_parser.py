"""PyTorch peers of the transition parser (``transition_parser``), on the workload's own
parameters (the dict of :func:`edbatch.executor.init_params`), with the same model
(equations in :mod:`edbatch.workloads.transition_parser`).

Training (the throughput harness, :mod:`benchmarks.throughput`; the summed cross-entropy of
the static oracle's transitions, as the workload's graph):

* ``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`), node
  for node the workload's builder;
* ``HandBatched`` (:class:`ParserPacked`): a packed bidirectional ``nn.LSTM`` per layer over
  the padded mini-batch, then **every oracle configuration of the mini-batch in one MLP
  call** (the configurations are known before the forward pass; their four feature rows
  are gathered from one table with one ``index_select``);
* ``Unbatched``: one sentence, word and transition at a time
  (:func:`experiments.parser_model.reference_loss`).

Greedy inference:

* :func:`unbatched_parse`: **unbatched per-instance PyTorch**: one sentence at a time, its
  BiLSTM step by step, one MLP call per configuration
  (:func:`experiments.parser_model.reference_parse`).
* :func:`hand_batched_parse`: **hand-batched** as a practitioner writes it: a packed
  bidirectional ``nn.LSTM`` per layer over the padded mini-batch, then the sentences advance
  **together by transition step**: at each step every sentence that has a decision to make
  contributes one row (its four feature vectors gathered from one table with one
  ``index_select``), one MLP call scores all rows, and each sentence applies its best legal
  class. A sentence whose only legal move is ``SHIFT`` applies it without a row, as the
  edbatch program does.

Both return ``(heads, relation ids, reads)`` per sentence, like
:meth:`experiments.parser_model.ApiParser.parse`. No timing here
(``benchmarks/parser_inference.py`` interleaves the peers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from benchmarks import hand_batched
from edbatch.api import DynamicBatch
from edbatch.data.transitions import SHIFT, ArcStandardState
from edbatch.workloads.transition_parser import (
    PAD,
    ROOT,
    ParseInstance,
    TransitionParser,
    config_items,
)
from experiments.parser_model import Parse, only_shift, reference_loss, reference_parse

__all__ = ["HandBatched", "HandBatchedParser", "ParserPacked", "ParserUnbatched", "Unbatched",
           "hand_batched_parse", "record", "unbatched_parse"]

_P = "parser"


def record(batch: DynamicBatch, wl: TransitionParser, instances: Sequence[ParseInstance]
           ) -> None:
    """Per sentence: its BiLSTM (layer by layer, forward then backward), the features, the
    root and pad vectors, one ``step`` loss per oracle transition (the builder's order)."""
    embed, zero, feat, special, step = (batch.op(f"{_P}.{k}") for k in
                                        ("embed", "zero_state", "feat", "special", "step"))
    cells = [batch.op(f"{_P}.l{k}_{d}") for k in range(1, wl.layers + 1) for d in ("fwd", "bwd")]
    add_loss = batch.add_loss
    for inst in instances:
        n = len(inst)
        with batch.instance():
            ins: list[tuple[Any, ...]] = [(embed(attr=a),) for a in inst.embed_attrs]
            for layer in range(wl.layers):
                fwd, bwd = cells[2 * layer], cells[2 * layer + 1]
                f, b = [None] * n, [None] * n
                s = zero()
                for t in range(n):
                    s = f[t] = fwd(*ins[t], s)
                s = zero()
                for t in range(n - 1, -1, -1):
                    s = b[t] = bwd(*ins[t], s)
                ins = list(zip(f, b, strict=True))
            feats = [feat(fw, bw) for fw, bw in ins]
            vec = {ROOT: special(attr=0), PAD: special(attr=1)}
            state = ArcStandardState(n)
            for cls in inst.classes:
                items = config_items(state.stack, state.next, n)
                add_loss(step(*[vec[i] if i <= 0 else feats[i - 1] for i in items], attr=cls))
                state.apply(wl.action_of(cls)[0])


class ParserPacked(hand_batched.HandBatched):
    """Training, hand-batched: packed BiLSTM layers, one MLP call over every configuration
    (module docstring)."""

    def __init__(self, wl: TransitionParser, params: Mapping[str, Tensor]) -> None:
        super().__init__(wl, params)
        h, d = wl.hidden_dim, wl.embed_dim + wl.pos_dim
        self.lstms = [_torch_lstm(d if k == 1 else 2 * h, h,
                                  (params[f"{_P}.l{k}_fwd"], params[f"{_P}.l{k}_fwd.b"]),
                                  (params[f"{_P}.l{k}_bwd"], params[f"{_P}.l{k}_bwd.b"]))
                      for k in range(1, wl.layers + 1)]

    def parameters(self) -> list[Tensor]:
        keep = ("E_w", "E_p", "E_special", "W_h", "W_h.b", "W_o", "W_o.b")
        return [self.params[f"{_P}.{k}"] for k in keep] + \
            [w for lstm in self.lstms for w in lstm.parameters()]

    def prepare(self, instances: Sequence[ParseInstance]) -> dict[str, Any]:
        lengths = [len(inst) for inst in instances]
        width = max(lengths)
        attrs = np.zeros((len(instances), width), dtype=np.int64)
        rows, classes = [], []
        for k, inst in enumerate(instances):
            attrs[k, :len(inst)] = inst.embed_attrs
            base = 2 + k * width - 1  # word i of sentence k is table row base + i
            state = ArcStandardState(len(inst))
            for cls in inst.classes:
                rows.append([0 if i == ROOT else 1 if i == PAD else base + i
                             for i in config_items(state.stack, state.next, state.n)])
                classes.append(cls)
                state.apply(self.wl.action_of(cls)[0])
        return {"attrs": torch.from_numpy(attrs), "lengths": torch.tensor(lengths),
                "rows": torch.tensor(rows).reshape(-1), "classes": torch.tensor(classes)}

    def forward(self, prep: dict[str, Any]) -> Tensor:
        p, attrs = self.params, prep["attrs"]
        tags = p[f"{_P}.E_p"].shape[0]
        x = torch.cat([F.embedding(attrs // tags, p[f"{_P}.E_w"], sparse=True),
                       F.embedding(attrs % tags, p[f"{_P}.E_p"], sparse=True)], dim=2)
        for lstm in self.lstms:
            packed = pack_padded_sequence(x, prep["lengths"], batch_first=True,
                                          enforce_sorted=False)
            x = pad_packed_sequence(lstm(packed)[0], batch_first=True,
                                    total_length=attrs.shape[1])[0]
        table = torch.cat([p[f"{_P}.E_special"], x.reshape(-1, x.shape[2])])
        feats = table.index_select(0, prep["rows"]).reshape(len(prep["classes"]), -1)
        hidden = torch.tanh(F.linear(feats, p[f"{_P}.W_h"], p[f"{_P}.W_h.b"]))
        logits = F.linear(hidden, p[f"{_P}.W_o"], p[f"{_P}.W_o.b"])
        return F.cross_entropy(logits, prep["classes"], reduction="sum")


class ParserUnbatched(hand_batched.PerInstance):
    """Training, per instance: :func:`experiments.parser_model.reference_loss` (one
    sentence, word and transition at a time)."""

    def forward(self, prepared: Sequence[ParseInstance]) -> Tensor:
        return reference_loss(self.wl, self.params, prepared)


def unbatched_parse(wl: TransitionParser, params: Mapping[str, Tensor],
                    sentences: Sequence[Sequence[int]]) -> list[Parse]:
    """Parse each sentence alone, one configuration at a time."""
    return [reference_parse(wl, params, a) for a in sentences]


def _torch_lstm(in_dim: int, hidden: int, fwd: tuple[Tensor, Tensor],
                bwd: tuple[Tensor, Tensor]) -> nn.LSTM:
    """A bidirectional ``nn.LSTM`` holding edbatch's ``[i f o u] = W [x; h] + b`` weights
    (``nn.LSTM``'s gate order is ``[i f g o]``, its input and hidden weights separate)."""
    lstm = nn.LSTM(in_dim, hidden, bidirectional=True, batch_first=True)
    h = hidden
    order = torch.cat([torch.arange(0, 2 * h), torch.arange(3 * h, 4 * h),
                       torch.arange(2 * h, 3 * h)])  # [i f o u] -> [i f u o]
    with torch.no_grad():
        for suffix, (w, b) in (("", fwd), ("_reverse", bwd)):
            w, b = w.detach()[order], b.detach()[order]
            getattr(lstm, f"weight_ih_l0{suffix}").copy_(w[:, :in_dim])
            getattr(lstm, f"weight_hh_l0{suffix}").copy_(w[:, in_dim:])
            getattr(lstm, f"bias_ih_l0{suffix}").copy_(b)
            getattr(lstm, f"bias_hh_l0{suffix}").zero_()
    return lstm.to(fwd[0].dtype).requires_grad_(fwd[0].requires_grad)


class HandBatchedParser:
    """The hand-batched peer (module docstring), built once from the parameters."""

    def __init__(self, wl: TransitionParser, params: Mapping[str, Tensor]) -> None:
        self.wl = wl
        p = {k: v.detach() for k, v in params.items()}
        self.e_w, self.e_p, self.special = p[f"{_P}.E_w"], p[f"{_P}.E_p"], p[f"{_P}.E_special"]
        h, d = wl.hidden_dim, wl.embed_dim + wl.pos_dim
        self.lstms = [_torch_lstm(d if k == 1 else 2 * h, h,
                                  (p[f"{_P}.l{k}_fwd"], p[f"{_P}.l{k}_fwd.b"]),
                                  (p[f"{_P}.l{k}_bwd"], p[f"{_P}.l{k}_bwd.b"]))
                      for k in range(1, wl.layers + 1)]
        self.mlp = [p[f"{_P}.{k}"] for k in ("W_h", "W_h.b", "W_o", "W_o.b")]
        self.class_actions = torch.as_tensor(wl.class_actions())

    def features(self, sentences: Sequence[Sequence[int]]) -> tuple[Tensor, int]:
        """The vector table ``[2 + B * n_max, 2H]``: root, pad, then every padded word."""
        tags = self.e_p.shape[0]
        lengths = torch.tensor([len(a) for a in sentences])
        attrs = nn.utils.rnn.pad_sequence([torch.tensor(a) for a in sentences],
                                          batch_first=True)
        x = torch.cat([self.e_w[attrs // tags], self.e_p[attrs % tags]], dim=2)
        for lstm in self.lstms:
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            x = pad_packed_sequence(lstm(packed)[0], batch_first=True)[0]
        return torch.cat([self.special, x.reshape(-1, x.shape[2])]), x.shape[1]

    @torch.no_grad()
    def parse(self, sentences: Sequence[Sequence[int]]) -> list[Parse]:
        """Parse the mini-batch, all sentences advancing together by transition step."""
        table, width = self.features(sentences)
        states = [ArcStandardState(len(a)) for a in sentences]
        labels = [[-1] * len(a) for a in sentences]
        reads = [0] * len(sentences)
        w_h, b_h, w_o, b_o = self.mlp
        live = list(range(len(sentences)))
        while live:
            rows, legal = [], []
            for k in live:
                state = states[k]
                while not state.done and only_shift(state.legal()):
                    state.apply(SHIFT)
                if state.done:
                    continue
                base = 2 + k * width - 1  # word i of sentence k is row base + i
                rows.append([0 if i == ROOT else 1 if i == PAD else base + i
                             for i in config_items(state.stack, state.next, state.n)])
                legal.append(state.legal())
            live = [k for k in live if not states[k].done]
            if not live:
                break
            x = table.index_select(0, torch.tensor(rows).reshape(-1)).reshape(len(rows), -1)
            scores = torch.tanh(x @ w_h.T + b_h) @ w_o.T + b_o
            ok = torch.as_tensor(np.asarray(legal))[:, self.class_actions]
            best = torch.where(ok, scores, torch.full_like(scores, -torch.inf)).argmax(1)
            for k, cls in zip(live, best.tolist(), strict=True):
                reads[k] += 1
                action, label = self.wl.action_of(cls)
                dependent = states[k].apply(action)
                if dependent:
                    labels[k][dependent - 1] = label
        return [(list(s.heads), lab, r) for s, lab, r in zip(states, labels, reads, strict=True)]


def hand_batched_parse(wl: TransitionParser, params: Mapping[str, Tensor],
                       sentences: Sequence[Sequence[int]]) -> list[Parse]:
    """:meth:`HandBatchedParser.parse` with a parser built from ``params``."""
    return HandBatchedParser(wl, params).parse(sentences)


#: The hand-batched training model of this workload (the throughput harness's).
HandBatched = ParserPacked
#: The per-instance PyTorch model of this workload (the ``pytorch_unbatched`` contender).
Unbatched = ParserUnbatched
