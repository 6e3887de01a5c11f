"""A batching policy that sees the frontier: an equivariant network over op types, trained by
DAgger-style imitation of the rollout teacher, deployed as numpy/numba or distilled to an FSM.

* **Model** (:class:`FrontierNet`): a shared per-type MLP embeds each ready op type's feature
  row (:mod:`policies._frontier_features`); mean- and max-pooling over the ready types give a
  context; a shared scorer maps ``[own embedding, context]`` to a score; a masked softmax
  over the ready types is the policy. Permuting the op types permutes the scores, so one
  network handles any number of op types and any workload.
* **Teacher** (:func:`policies._frontier_teacher.teacher_q`): at every decision of a
  trajectory, the batches of the whole schedule if each ready type were popped now and the
  rest completed by critical path (the one-step rollout that
  :func:`edbatch.schedule.rollout.rollout_schedule` fortifies). The targets are soft,
  ``softmax(-(Q - min Q) / tau)`` over the ready types (``tau=0``: any type of least Q, the
  loss ``-log`` of their total probability); decisions where every type ties carry no
  signal and are dropped.
* **DAgger** (:func:`train_frontier_net`): round 0 labels critical path's trajectories, every
  later round the current network's own trajectories; the data set grows, the network is
  refit, and the snapshot with the fewest validation batches is kept (rounds that lose to
  critical path on validation are reported, not hidden).
* **Deployment**: :class:`policies.frontier_deploy.FrontierNetPolicy` (numba or numpy per
  decision; :meth:`FrontierNet.export` gives its weights), or :func:`distill_fsm`: the
  network's decisions on the training graphs voted into an :class:`~policies.fsm.FSMPolicy`
  table, by default in residual form (the fallback plus the majority disagreements the
  guard keeps; never worse than the fallback on the training and validation graphs); the
  key with the fewest validation batches wins.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from edbatch.errors import ConfigError, GraphError
from edbatch.graph import Graph
from edbatch.schedule import CriticalPathPolicy, Frontier, lower_bound
from edbatch.schedule.policy import Policy, drive
from envs.encoding import StateKey, encode_state
from policies._frontier_features import NUM_FEATURES, FeatureTracker
from policies._frontier_teacher import teacher_q
from policies.expert import fit_table
from policies.frontier_deploy import FrontierNetPolicy
from policies.fsm import FSMPolicy
from policies.guard import fallback_choices, guard_table, pick_fallback, vote_proposals
from policies.q_learning import AUTO_FALLBACKS, TrainResult
from policies.resample import resample_graphs
from policies.table_search import table_batches

__all__ = ["FrontierNet", "FrontierNetConfig", "FrontierNetResult", "FrontierNetTrainer",
           "collect", "distill_fsm", "train_frontier_net"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrontierNetConfig:
    """Hyper-parameters of the frontier network and its DAgger training."""

    hidden: int = 32
    """Width of the per-type embedding and of the scorer."""
    rounds: int = 4
    """DAgger rounds (round 0: critical path's trajectories; then the network's own)."""
    epochs: int = 500
    """Full-batch Adam steps per round, on all the samples gathered so far."""
    tau: float = 0.5
    """Temperature of the soft targets ``softmax(-(Q - min Q) / tau)`` over the ready types
    (0: any type of least Q, the loss ``-log`` of their total probability). Measured on the
    lattice train mini-batches (seed 0, one round): 0 imitates the teacher more closely
    (75% vs 76% of the decisions, hidden 32) but schedules worse (1.32 vs 1.20 x LB on the
    validation graphs; critical path 1.18)."""
    lr: float = 3e-3
    """Adam's learning rate."""
    weight_decay: float = 1e-4
    """Adam's weight decay."""
    augment: int = 0
    """Extra training graphs resampled from the training graphs' instances (half join the
    training graphs, half the validation graphs)."""
    teacher_rule: str = "critical_path"
    """The compiled rule completing each candidate of the teacher's one-step rollout."""
    distill_encodings: tuple[str, ...] = ("expert", "tie", "crit", "fill", "rich")
    """FSM keys tried by the distillation (the fewest validation batches wins)."""
    fallback: str = "critical_path"
    """Fallback of the distilled FSM (states its table lacks); ``auto``: the heuristic of
    :data:`~policies.q_learning.AUTO_FALLBACKS` with the fewest batches on the training and
    validation graphs together (the best single heuristic)."""
    guard: bool = True
    """Distil in residual form (:mod:`policies.guard`): the fallback plus the network's
    majority disagreements with it that lower the training batches without raising the
    validation batches, so the FSM is never worse than its fallback on those graphs.
    ``False``: the plain majority vote per key (may lose to the fallback)."""
    seed: int = 0
    """Seed of the weights' initialisation and the resampling."""

    def __post_init__(self) -> None:
        for name in ("hidden", "epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"trainer.{name}", getattr(self, name), "an int >= 1",
                                  f"pass trainer.{name}=32")
        if self.tau < 0:
            raise ConfigError("trainer.tau", self.tau, "a number >= 0", "pass trainer.tau=0.5")
        if self.rounds < 1:
            raise ConfigError("trainer.rounds", self.rounds, "an int >= 1",
                              "pass trainer.rounds=4")


class FrontierNet(nn.Module):
    """The equivariant scorer (see :mod:`policies.frontier_deploy` for the formula)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(NUM_FEATURES, hidden), nn.ReLU(),
                                   nn.Linear(hidden, hidden), nn.ReLU())
        self.mix = nn.Linear(3 * hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, R]`` of ``x`` ``[N, R, F]``; ``-inf`` where ``valid`` is false."""
        h = self.embed(x) * valid.unsqueeze(-1)
        n = valid.sum(-1, keepdim=True).clamp(min=1).unsqueeze(-1)
        mean = (h.sum(1, keepdim=True) / n).expand_as(h)
        mx = h.max(1, keepdim=True).values.expand_as(h)  # h >= 0, padded rows are 0
        s = self.out(torch.relu(self.mix(torch.cat([h, mean, mx], -1)))).squeeze(-1)
        return s.masked_fill(~valid, float("-inf"))

    def export(self) -> dict[str, NDArray[np.float64]]:
        """The weights as :class:`~policies.frontier_deploy.FrontierNetPolicy` reads them."""
        def a(t: torch.Tensor) -> NDArray[np.float64]:
            return t.detach().cpu().double().numpy().copy()
        l1, l2 = self.embed[0], self.embed[2]
        return {"W1": a(l1.weight.T), "b1": a(l1.bias), "W2": a(l2.weight.T), "b2": a(l2.bias),
                "V1": a(self.mix.weight.T), "c1": a(self.mix.bias),
                "v2": a(self.out.weight[0]), "c2": a(self.out.bias)}


@dataclass
class Samples:
    """Labelled decisions: feature rows and which rows are the teacher's best."""

    x: list[NDArray[np.float32]] = field(default_factory=list)
    gap: list[NDArray[np.float32]] = field(default_factory=list)
    """Per row, the teacher's Q minus its least Q (0: one of the teacher's best)."""

    def __len__(self) -> int:
        return len(self.x)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded ``(x [N, R, F], valid [N, R], gap [N, R])``."""
        r = max(len(b) for b in self.gap)
        x = np.zeros((len(self), r, NUM_FEATURES), np.float32)
        valid = np.zeros((len(self), r), bool)
        gap = np.zeros((len(self), r), np.float32)
        for i, (xi, gi) in enumerate(zip(self.x, self.gap)):
            x[i, :len(gi)], valid[i, :len(gi)], gap[i, :len(gi)] = xi, True, gi
        return torch.from_numpy(x), torch.from_numpy(valid), torch.from_numpy(gap)


def collect(graph: Graph, policy: Policy, out: Samples, rule: str = "critical_path"
            ) -> tuple[int, int]:
    """Run ``policy`` on ``graph``, label its decisions with the teacher into ``out``;
    returns ``(decisions, informative samples added)``."""
    tracker = FeatureTracker()
    rows: list[tuple[list[int], NDArray[np.float32]]] = []
    decisions: list[int] = []

    def choose(f: Frontier) -> int:
        view = f.view()
        ready, x = tracker.features(view)
        a = int(policy.choose(view))
        tracker.record(a)
        rows.append((ready, x))
        decisions.append(a)
        return a

    drive(Frontier(graph, typewise=True), choose)
    q = teacher_q(graph, decisions, rule)
    added = 0
    for (ready, x), qi in zip(rows, q):
        vals = qi[ready]
        if vals.min() < vals.max():
            out.x.append(x)
            out.gap.append((vals - vals.min()).astype(np.float32))
            added += 1
    return len(decisions), added


def _fit(net: FrontierNet, data: Samples, cfg: FrontierNetConfig) -> float:
    """Full-batch Adam on the imitation loss (see ``FrontierNetConfig.tau``); the final loss."""
    x, valid, gap = data.tensors()
    best = valid & (gap == 0)
    target = (torch.softmax((-gap / cfg.tau).masked_fill(~valid, float("-inf")), -1)
              if cfg.tau > 0 else None)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss = torch.zeros(())
    for _ in range(cfg.epochs):
        s = net(x, valid)
        if target is None:
            loss = (torch.logsumexp(s, -1)
                    - torch.logsumexp(s.masked_fill(~best, float("-inf")), -1)).mean()
        else:
            loss = -(target * torch.log_softmax(s, -1).masked_fill(~valid, 0.0)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def _batches(policy_factory: Callable[[], Policy], graphs: Sequence[Graph]) -> int:
    total = 0
    for g in graphs:
        total += len(drive(Frontier(g, typewise=True), _chooser(policy_factory())))
    return total


def _chooser(policy: Policy) -> Callable[[Frontier], int]:
    return lambda f: int(policy.choose(f.view()))


@dataclass
class FrontierNetResult:
    """What :func:`train_frontier_net` returns."""

    net: FrontierNetPolicy
    val_ratio: float
    critical_path_ratio: float
    seconds: float
    history: list[dict[str, float]]


def train_frontier_net(train_graphs: Sequence[Graph], cfg: FrontierNetConfig = FrontierNetConfig(),
                       *, val_graphs: Sequence[Graph] | None = None,
                       callback: Callable[[dict[str, float]], None] | None = None
                       ) -> FrontierNetResult:
    """DAgger over ``train_graphs`` (plus resampled ones); select on ``val_graphs``."""
    if not train_graphs:
        raise GraphError("train_frontier_net needs at least one training graph")
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    extra = resample_graphs(train_graphs, cfg.augment, np.random.default_rng(cfg.seed))
    half = (len(extra) + 1) // 2
    train = [*train_graphs, *extra[:half]]
    val = [*(val_graphs if val_graphs is not None else train_graphs), *extra[half:]]
    lb = max(sum(lower_bound(g) for g in val), 1)
    cp_batches = _batches(CriticalPathPolicy, val)
    net = FrontierNet(cfg.hidden)
    data = Samples()
    best_w, best_b = None, None
    history: list[dict[str, float]] = []
    student: Policy | None = None
    for rnd in range(cfg.rounds):
        decisions = added = 0
        for g in train:
            base = CriticalPathPolicy() if student is None else student
            d, n = collect(g, base, data, cfg.teacher_rule)
            decisions, added = decisions + d, added + n
        if not len(data):
            log.info("frontier net: the teacher agrees with every type everywhere; no signal")
            break
        loss = _fit(net, data, cfg)
        weights = net.export()
        student = FrontierNetPolicy(weights, "numpy")
        b = _batches(student.fork, val)
        if best_b is None or b < best_b:
            best_w, best_b = weights, b
        row = {"episode": rnd + 1, "train/decisions": decisions, "train/samples": len(data),
               "train/new_samples": added, "train/loss": loss, "eval/ratio_to_lb": b / lb,
               "eval/fallback_ratio_to_lb": cp_batches / lb,
               "eval/best_ratio_to_lb": best_b / lb, "seconds": time.perf_counter() - t0}
        log.info("frontier net round %d: %d samples (+%d of %d decisions), loss %.4f, "
                 "validation %.4f x LB (critical path %.4f)", rnd, len(data), added,
                 decisions, loss, b / lb, cp_batches / lb)
        history.append(row)
        if callback is not None:
            callback(row)
    seconds = time.perf_counter() - t0
    if best_w is None:
        best_w, best_b = net.export(), cp_batches
    meta = {"config": asdict(cfg), "val_ratio": best_b / lb,
            "critical_path_ratio": cp_batches / lb, "train_seconds": seconds}
    return FrontierNetResult(FrontierNetPolicy(best_w, "numba", meta), best_b / lb,
                             cp_batches / lb, seconds, history)


def distill_fsm(net: FrontierNetPolicy, train_graphs: Sequence[Graph],
                val_graphs: Sequence[Graph], encodings: Sequence[str] = ("expert",),
                fallback: str = "critical_path", guard: bool = True
                ) -> tuple[FSMPolicy, dict[str, int]]:
    """The network's decisions on ``train_graphs`` voted into an FSM table per encoding
    (with ``guard``: only the disagreements with ``fallback`` that pay, as
    :func:`policies.guard.guard_table` decides); returns the FSM whose table needs the
    fewest batches on ``val_graphs`` and the validation batches of every encoding tried."""
    if not encodings:
        raise ConfigError("trainer.distill_encodings", list(encodings), "a non-empty list",
                          "pass trainer.distill_encodings=[expert]")
    names = train_graphs[0].vocab.names
    tried: dict[str, int] = {}
    best: FSMPolicy | None = None
    votes = _votes(net.fork(), train_graphs, encodings)
    for enc in encodings:
        meta: dict[str, Any] = {"distilled_from": "frontier_net", **net.metadata}
        if guard:
            props = vote_proposals(votes[enc], fallback_choices(train_graphs, enc, fallback))
            table, report = guard_table(props, train_graphs, val_graphs, enc, fallback)
            tried[enc] = report.val_table
            meta["guard"] = report.as_meta()
            if report.reason() is not None:
                meta["learned_nothing"] = report.reason()
        else:
            table = fit_table(votes[enc], 1, 0.5)
            tried[enc] = table_batches(table, val_graphs, enc, fallback)
        if best is None or tried[enc] < tried[best.encoding]:
            best = FSMPolicy(table, enc, names, fallback, meta)
    assert best is not None
    return best, tried


def _votes(policy: Policy, graphs: Sequence[Graph], encodings: Sequence[str]
           ) -> dict[str, dict[StateKey, Counter[int]]]:
    """Per encoding and state key, the actions ``policy`` took there in its own schedules
    of ``graphs`` (one run per graph for every encoding)."""
    seen: dict[str, dict[StateKey, Counter[int]]] = {enc: {} for enc in encodings}

    def choose(f: Frontier) -> int:
        view = f.view()
        a = int(policy.choose(view))
        for enc, table in seen.items():
            table.setdefault(encode_state(view, enc), Counter())[a] += 1
        return a

    for g in graphs:
        drive(Frontier(g, typewise=True), choose)
    return seen


class FrontierNetTrainer:
    """Config-friendly wrapper: ``FrontierNetTrainer(**hparams).fit(train, val)`` trains the
    network and returns its FSM distillation (the network is :attr:`net` afterwards)."""

    name = "frontier_net"

    def __init__(self, **hparams: Any) -> None:
        if "distill_encodings" in hparams:
            hparams["distill_encodings"] = tuple(hparams["distill_encodings"])
        self.config = FrontierNetConfig(**hparams)
        self.net: FrontierNetPolicy | None = None

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: Any = None, callback: Callable[[dict[str, float]], None] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None) -> TrainResult:
        """Train on ``train_graphs``, select on ``val_graphs``; the distilled FSM (its
        ``best_ratio``: the FSM's validation batches / LB)."""
        del checkpoint, progress
        res = train_frontier_net(train_graphs, self.config, val_graphs=val_graphs,
                                 callback=callback)
        res.net.metadata.update(metadata or {})
        self.net = res.net
        fallback = self.config.fallback
        if fallback == "auto":
            fallback = pick_fallback([*train_graphs, *val_graphs], "expert", AUTO_FALLBACKS)
        fsm, tried = distill_fsm(res.net, train_graphs, val_graphs,
                                 self.config.distill_encodings, fallback, self.config.guard)
        ratio = tried[fsm.encoding] / max(sum(lower_bound(g) for g in val_graphs), 1)
        fsm.metadata.update(net_val_ratio=res.val_ratio, fsm_val_ratio=ratio,
                            distill_val_batches=tried)
        return TrainResult(fsm, ratio, len(res.history), res.seconds, res.history)
