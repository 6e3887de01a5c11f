"""The transition parser written per sentence through ``edbatch.api``, and its per-instance
plain-PyTorch reference.

:class:`ApiParser` uses the ``transition_parser`` workload's cells
(:meth:`DynamicBatch.from_workload <edbatch.api.DynamicBatch.from_workload>`: the same
kernels and parameters as the workload's graphs) and one user cell, ``scores``, for the
transition MLP without its loss.

* **Training** (:meth:`ApiParser.record_loss`, :meth:`ApiParser.loss`): per sentence, the
  BiLSTM, then one ``parser.step`` loss per oracle transition; one ``run()`` batches the
  mini-batch.
* **Parsing** (:meth:`ApiParser.program`, :meth:`ApiParser.parse`): per sentence a generator
  program records the BiLSTM, then at every configuration records the scores node, *yields*
  ``argmax(scores, allowed)`` (the best legal class, taken for all sentences at once) and
  applies it.
  :meth:`DynamicBatch.run_programs <edbatch.api.DynamicBatch.run_programs>` advances every
  sentence to its next read and runs all pending nodes as one graph: the configurations of
  every sentence at one step batch together. A configuration with ``SHIFT`` as its only
  legal move needs no read (the first move of every sentence, and each time the stack holds
  only the root and one word while the buffer is not empty), so the synchronisations per
  mini-batch are the most reads of any sentence, at most ``2n - 1``.

:func:`reference_loss` and :func:`reference_parse` compute the same model one sentence at a
time with plain tensor code (no edbatch executor): the equality tests compare against them.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, ProgramsResult, SchedulerLike, argmax
from edbatch.data.transitions import SHIFT, ArcStandardState
from edbatch.executor.cells_parser import transition_scores
from edbatch.memory import Strategy
from edbatch.workloads.transition_parser import (
    PAD,
    ROOT,
    ParseInstance,
    TransitionParser,
    config_items,
)

__all__ = ["ApiParser", "Parse", "choose", "reference_loss", "reference_parse"]

_P = "parser"
#: A parse: heads (0 = root), relation ids, and the number of value reads it took.
Parse = tuple[list[int], list[int], int]


def choose(scores: Tensor, legal: tuple[bool, bool, bool], class_actions: np.ndarray) -> int:
    """The best-scoring class whose action is legal (first on ties)."""
    values = scores.detach().cpu().numpy()
    return int(np.where(np.asarray(legal)[class_actions], values, -np.inf).argmax())


_ONLY_SHIFT = (True, False, False)


def only_shift(legal: tuple[bool, bool, bool]) -> bool:
    """Whether ``SHIFT`` is the only legal move (nothing to decide, no value read)."""
    return legal == _ONLY_SHIFT


class Scores(nn.Module):
    """The transition MLP of ``parser.step`` without the loss: ``[B, A]`` scores."""

    def __init__(self, params: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.weights = [params[f"{_P}.{k}"] for k in ("W_h", "W_h.b", "W_o", "W_o.b")]

    def forward(self, *features: Tensor) -> Tensor:
        return transition_scores(features, *self.weights)


class ApiParser:
    """The parser over one :class:`~edbatch.api.DynamicBatch` (module docstring).

    Args:
        workload: the ``transition_parser`` workload (its op types and class ids).
        params: its parameters (e.g. :func:`~edbatch.executor.init_params`), trained in
            place by whoever owns them.
        dtype: the batch's dtype (``torch.float64`` for the equality tests).
    """

    def __init__(self, workload: TransitionParser, params: Mapping[str, Tensor],
                 dtype: torch.dtype = torch.float32) -> None:
        self.wl, self.params = workload, params
        b = self.batch = DynamicBatch.from_workload(workload, params, dtype=dtype)
        self.embed, self.zero, self.feat, self.special, self.step = (
            b.op(f"{_P}.{k}") for k in ("embed", "zero_state", "feat", "special", "step"))
        self.cells = [b.op(f"{_P}.l{k}_{d}") for k in range(1, workload.layers + 1)
                      for d in ("fwd", "bwd")]
        width = 2 * workload.hidden_dim
        self.scores = b.cell(Scores(params), "scores", [width] * 4, workload.num_classes)
        self.class_actions = workload.class_actions()
        self._masks: dict[tuple[bool, bool, bool], np.ndarray] = {}  # legal -> classes

    # ------------------------------------------------------------------ recording
    def encode(self, attrs: Sequence[int]) -> tuple[list[Handle], dict[int, Handle]]:
        """Record the BiLSTM of one sentence: its word features and the root / pad vectors."""
        n, zero = len(attrs), self.zero
        xs = [self.embed(attr=a) for a in attrs]
        ins: list[tuple[Handle, ...]] = [(x,) for x in xs]
        for layer in range(self.wl.layers):
            fwd, bwd = self.cells[2 * layer], self.cells[2 * layer + 1]
            f: list[Handle] = []
            s = zero()
            for t in range(n):
                s = fwd(*ins[t], s)
                f.append(s)
            back: list[Handle] = [s] * n
            s = zero()
            for t in range(n - 1, -1, -1):
                s = back[t] = bwd(*ins[t], s)
            ins = list(zip(f, back, strict=True))
        feats = [self.feat(fw, bw) for fw, bw in ins]
        return feats, {ROOT: self.special(attr=0), PAD: self.special(attr=1)}

    @staticmethod
    def _vectors(state: ArcStandardState, feats: list[Handle], vec: dict[int, Handle]
                 ) -> list[Handle]:
        return [vec[i] if i <= 0 else feats[i - 1]
                for i in config_items(state.stack, state.next, state.n)]

    def record_loss(self, inst: ParseInstance, attrs: Sequence[int] | None = None) -> None:
        """Record one sentence's loss terms (``attrs``: embed attrs to use instead of the
        instance's, e.g. with word dropout)."""
        feats, vec = self.encode(inst.embed_attrs if attrs is None else attrs)
        state = ArcStandardState(len(inst))
        for cls in inst.classes:
            self.batch.add_loss(self.step(*self._vectors(state, feats, vec), attr=cls))
            state.apply(self.wl.action_of(cls)[0])

    def loss(self, instances: Sequence[ParseInstance], scheduler: SchedulerLike = "dynet_agenda",
             attrs: Sequence[Sequence[int]] | None = None, strategy: Strategy = "aligned"
             ) -> Tensor:
        """The summed transition loss of ``instances``, recorded and run as one batch."""
        for k, inst in enumerate(instances):
            with self.batch.instance():
                self.record_loss(inst, None if attrs is None else attrs[k])
        out = self.batch.run(scheduler, strategy=strategy)
        assert out.loss is not None
        return out.loss

    # ------------------------------------------------------------------ parsing
    def program(self, attrs: Sequence[int]) -> Generator[Any, Tensor, Parse]:
        """Parse one sentence greedily, reading the scores of each decision."""
        feats, vec = self.encode(attrs)
        nodes = [vec[ROOT], *feats, vec[PAD]]  # item i of config_items: nodes[i] (PAD: -1)
        n = len(attrs)
        state = ArcStandardState(n)
        labels = [-1] * n
        reads, masks, scores, action_of = 0, self._masks, self.scores, self.wl.action_of
        while not state.done:
            legal = state.legal()
            if legal == _ONLY_SHIFT:  # nothing to decide: no value read
                state.apply(SHIFT)
                continue
            allowed = masks.get(legal)
            if allowed is None:  # the classes whose action is legal (made once per pattern)
                allowed = masks[legal] = np.asarray(legal)[self.class_actions]
            s2, s1, s0, b0 = config_items(state.stack, state.next, n)
            # choose()'s pick (first best legal class), taken for every sentence at once
            cls = yield argmax(scores(nodes[s2], nodes[s1], nodes[s0], nodes[b0]), allowed)
            reads += 1
            action, label = action_of(cls)
            dependent = state.apply(action)
            if dependent:
                labels[dependent - 1] = label
        return list(state.heads), labels, reads

    def parse(self, sentences: Sequence[Sequence[int]], scheduler: SchedulerLike = "dynet_agenda",
              strategy: Strategy = "aligned") -> tuple[list[Parse], ProgramsResult]:
        """Parse every sentence (embed attrs) in one batched run; the parses and the run."""
        out = self.batch.run_programs([self.program(a) for a in sentences], scheduler,
                                      strategy=strategy, grad=False)
        return out.returns, out


# ---------------------------------------------------------------------- the reference
def _lstm(x: Tensor, h: Tensor, c: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    g = F.linear(torch.cat([x, h]), w, b)
    i, f, o, u = g.chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
    return torch.sigmoid(o) * torch.tanh(c), c


def _features(wl: TransitionParser, p: Mapping[str, Tensor], attrs: Sequence[int]
              ) -> list[Tensor]:
    tags = p[f"{_P}.E_p"].shape[0]
    ins = [[torch.cat([p[f"{_P}.E_w"][a // tags], p[f"{_P}.E_p"][a % tags]])] for a in attrs]
    zero = p[f"{_P}.E_w"].new_zeros(wl.hidden_dim)
    for layer in range(1, wl.layers + 1):
        outs: list[list[Tensor]] = [[] for _ in attrs]
        for d, order in (("fwd", range(len(attrs))), ("bwd", range(len(attrs) - 1, -1, -1))):
            w, b = p[f"{_P}.l{layer}_{d}"], p[f"{_P}.l{layer}_{d}.b"]
            h = c = zero
            for t in order:
                h, c = _lstm(torch.cat(ins[t]), h, c, w, b)
                outs[t].append(h)
        ins = outs
    return [torch.cat(v) for v in ins]


def _scores(p: Mapping[str, Tensor], vectors: list[Tensor]) -> Tensor:
    x = torch.cat(vectors)
    a = torch.tanh(F.linear(x, p[f"{_P}.W_h"], p[f"{_P}.W_h.b"]))
    return F.linear(a, p[f"{_P}.W_o"], p[f"{_P}.W_o.b"])


def _vectors(state: ArcStandardState, feats: list[Tensor], special: Tensor) -> list[Tensor]:
    return [special[0] if i == ROOT else special[1] if i == PAD else feats[i - 1]
            for i in config_items(state.stack, state.next, state.n)]


def reference_loss(wl: TransitionParser, params: Mapping[str, Tensor],
                   instances: Sequence[ParseInstance]) -> Tensor:
    """The summed oracle-transition cross-entropy, one sentence and one step at a time."""
    total = params[f"{_P}.W_o.b"].new_zeros(())
    special = params[f"{_P}.E_special"]
    for inst in instances:
        feats = _features(wl, params, inst.embed_attrs)
        state = ArcStandardState(len(inst))
        for cls in inst.classes:
            logits = _scores(params, _vectors(state, feats, special))
            total = total - F.log_softmax(logits, dim=0)[cls]
            state.apply(wl.action_of(cls)[0])
    return total


def reference_parse(wl: TransitionParser, params: Mapping[str, Tensor],
                    attrs: Sequence[int]) -> Parse:
    """Parse one sentence greedily, one configuration at a time (the `.value()` way)."""
    special, actions = params[f"{_P}.E_special"], wl.class_actions()
    with torch.no_grad():
        feats = _features(wl, params, attrs)
        state = ArcStandardState(len(attrs))
        labels = [-1] * len(attrs)
        reads = 0
        while not state.done:
            legal = state.legal()
            if only_shift(legal):
                state.apply(SHIFT)
                continue
            reads += 1
            action, label = wl.action_of(choose(_scores(params, _vectors(state, feats, special)),
                                                legal, actions))
            dependent = state.apply(action)
            if dependent:
                labels[dependent - 1] = label
    return list(state.heads), labels, reads
