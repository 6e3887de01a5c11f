"""PyTorch peers of the transition parser at inference (``transition_parser``), on the
workload's own parameters (the dict of :func:`edbatch.executor.init_params`), parsing
greedily with the same model (equations in :mod:`edbatch.workloads.transition_parser`).

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

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from edbatch.data.transitions import SHIFT, ArcStandardState
from edbatch.workloads.transition_parser import PAD, ROOT, TransitionParser, config_items
from experiments.parser_model import Parse, only_shift, reference_parse

__all__ = ["HandBatchedParser", "hand_batched_parse", "unbatched_parse"]

_P = "parser"


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
    return lstm.to(fwd[0].dtype)


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
