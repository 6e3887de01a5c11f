"""The neural route: a small network imitates the search teacher, then is distilled to an FSM.

Teacher: the same as expert iteration's (:mod:`policies.expert`): fortified rollout over the
fallback with a large budget, relabelled by the exact solver where it proves optimality on
small graphs. Its schedules are replayed and every decision becomes a sample
``(features of the state, mask, op the teacher batched)`` (behaviour cloning).

Student network: a small MLP (``layers`` x ``hidden``, ReLU) over the env's vector
observation (:func:`envs.encoding.encode_observation`) plus three per-type critical-path
features (the height of the type's highest ready node, its gap below the frontier's
highest, whether the type's batch is complete), one logit per op type, masked to the legal
types. Trained by cross entropy on the masked logits, seeded, one thread.

DAgger: the network schedules the training graphs; every state it visits is labelled by the
teacher's one-step rule (each ready type tried, the rest completed by the fallback, the
fewest batches wins, ties to the fallback's own choice), the samples are aggregated and the
network is refitted. The round whose network needs the fewest batches on the validation
graphs wins.

Distillation: the winning network schedules the training graphs; its decisions are voted
``FSM key -> op`` (the ``expert`` key by default) and the majority per key
(:func:`policies.expert.fit_table`) becomes the table of an :class:`~policies.fsm.FSMPolicy`
with the usual fallback: the same JSON artifact and table-lookup runtime as every learner.
The network itself (one forward pass per decision) is reported beside it and saved as
``network.pt`` next to the trainer's checkpoint path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edbatch.errors import GraphError, PolicyFileError
from edbatch.graph import Graph
from edbatch.schedule import Frontier, FrontierView, lower_bound, run_policy
from edbatch.schedule.bounds import height_list
from edbatch.schedule.exact import exact_schedule
from edbatch.schedule.policy import Policy, drive
from edbatch.schedule.rollout import rollout_schedule
from envs.encoding import encode_observation
from policies._header import save_path
from policies.expert import fit_table
from policies.fsm import FSMPolicy, make_fallback
from policies.q_learning import TrainResult, evaluate_policy, select_fallback
from policies.resample import resample_graphs
from policies.table_search import policy_votes

__all__ = ["ImitationConfig", "ImitationTrainer", "NetPolicy", "distill", "features",
           "load_network", "train_imitation"]

log = logging.getLogger(__name__)

#: Per-type feature blocks: the env's 7 observation blocks and 3 critical-path blocks.
FEATURE_BLOCKS = 10


@dataclass(frozen=True)
class ImitationConfig:
    """Hyper-parameters of the imitation-learned network and its distillation."""

    hidden: int = 64
    """Units per hidden layer."""
    layers: int = 2
    """Hidden layers."""
    epochs: int = 40
    """Passes over the aggregated samples per fit."""
    lr: float = 3e-3
    """Adam learning rate."""
    batch_size: int = 256
    """Samples per gradient step."""
    dagger_rounds: int = 2
    """DAgger rounds after behaviour cloning (0: behaviour cloning only)."""
    budget: int = 300_000
    """Teacher rollout budget per graph (batches popped in rollouts)."""
    label_budget: int = 200_000
    """Batches popped per graph by DAgger's one-step labels (later states go unlabelled)."""
    exact_max_nodes: int = 400
    """Graphs with at most this many nodes are also labelled by the exact solver."""
    exact_node_budget: int = 50_000
    """Search nodes of the exact solver per graph."""
    augment: int = 8
    """Graphs resampled from the training graphs' independent parts
    (:func:`policies.expert.resample_graphs`): half train, half select."""
    encoding: str = "expert"
    """Key of the distilled FSM."""
    fallback: str = "auto"
    """The FSM's policy for unseen states and the teacher's base, or ``auto``."""
    lookahead: str = "none"
    """How the distilled FSM schedules graphs: ``none`` or ``rollout``."""
    seed: int = 0
    """Seed of the network's initialisation, the sample order and the resampling."""


def features(view: FrontierView) -> np.ndarray:
    """The network's input: :func:`encode_observation` plus, per op type, the scaled height
    of its highest ready node, its gap below the highest one (capped at 4, scaled) and
    whether its batch is complete (0 for types with nothing ready)."""
    k = len(view.mask)
    h = height_list(view.graph)
    top = np.zeros(k)
    ready = view.ready_ops
    for a in ready:
        top[a] = view.max_over_ready(a, h) + 1
    scale = float(max(h, default=0)) + 1.0
    gap = np.where(view.mask > 0, np.minimum(top.max(initial=0) - top, 4) / 4, 0.0)
    tw = view.typewise_count if view.typewise_count is not None else view.ready_count
    full = (view.mask > 0) & (view.ready_count >= tw)
    extra = np.concatenate([top / scale, gap, full.astype(np.float64)])
    return np.concatenate([encode_observation(view), extra.astype(np.float32)])


def _net(k: int, cfg: ImitationConfig) -> nn.Sequential:
    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = []
    width = FEATURE_BLOCKS * k
    for _ in range(cfg.layers):
        layers += [nn.Linear(width, cfg.hidden), nn.ReLU()]
        width = cfg.hidden
    return nn.Sequential(*layers, nn.Linear(width, k))


class NetPolicy:
    """The network as a :class:`~edbatch.schedule.Policy`: masked argmax of its logits (one
    forward pass per decision; always a legal type)."""

    needs_typewise = True

    def __init__(self, net: nn.Module) -> None:
        self.net = net.eval()

    def choose(self, view: FrontierView) -> int:
        """The legal op type with the largest logit (ties: smallest id)."""
        with torch.no_grad():
            logits = self.net(torch.from_numpy(features(view))[None])[0].numpy()
        return int(np.argmax(np.where(view.mask > 0, logits, -np.inf)))


class _Samples:
    """Aggregated (features, mask, action) samples."""

    def __init__(self) -> None:
        self.x: list[np.ndarray] = []
        self.m: list[np.ndarray] = []
        self.y: list[int] = []

    def add(self, view: FrontierView, action: int) -> None:
        self.x.append(features(view))
        self.m.append(view.mask > 0)
        self.y.append(action)

    def __len__(self) -> int:
        return len(self.y)


def _teacher(graph: Graph, bases: Sequence[Callable[[], Policy]], cfg: ImitationConfig
             ) -> tuple[list[int], int]:
    """The teacher's decisions on ``graph`` (rollout; exact where it proves optimality) and
    its number of batches."""
    sched = rollout_schedule(graph, bases, budget=cfg.budget, name="teacher")
    if graph.num_nodes <= cfg.exact_max_nodes:
        res = exact_schedule(graph, node_budget=cfg.exact_node_budget, initial=sched)
        if res.status == "optimal" and res.num_batches <= sched.num_batches:
            sched = res.schedule
    return [b.op_id for b in sched.batches if not b.forced], sched.num_batches


def _replay(graph: Graph, decisions: list[int], data: _Samples) -> None:
    it = iter(decisions)

    def choose(f: Frontier) -> int:
        a = next(it)
        data.add(f.view(), a)
        return a

    drive(Frontier(graph, typewise=True), choose)


def _dagger(graph: Graph, student: Policy, base: Callable[[], Policy], budget: int,
            data: _Samples) -> None:
    """Run ``student`` on ``graph``; label each visited state with the one-step lookahead
    over ``base`` (until ``budget`` batches were popped in lookahead completions)."""
    spent = 0

    def choose(f: Frontier) -> int:
        nonlocal spent
        view = f.view()
        ready = view.ready_ops
        if spent < budget and len(ready) > 1:
            own = int(base().choose(view))
            cost = {}
            for a in ready:
                trial = f.copy()
                before = trial.num_batches
                trial.pop(a)
                completion = base()
                drive(trial, lambda g, p=completion: int(p.choose(g.view())))
                cost[a] = trial.num_batches
                spent += trial.num_batches - before
            best = min(cost.values())
            data.add(view, own if cost[own] == best else min(a for a in ready
                                                              if cost[a] == best))
        return int(student.choose(view))

    drive(Frontier(graph, typewise=True), choose)


def _fit(data: _Samples, k: int, cfg: ImitationConfig) -> nn.Sequential:
    """A fresh network trained on ``data`` (seeded: same samples, same weights)."""
    net = _net(k, cfg)
    x = torch.from_numpy(np.stack(data.x))
    m = torch.from_numpy(np.stack(data.m))
    y = torch.tensor(data.y, dtype=torch.long)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    net.train()
    for _ in range(cfg.epochs):
        for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            logits = net(x[idx]).masked_fill(~m[idx], -1e9)
            loss = nn.functional.cross_entropy(logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def _ratio(policy: Policy, graphs: Sequence[Graph]) -> tuple[float, int]:
    batches = sum(run_policy(g, policy).num_batches for g in graphs)
    return batches / max(sum(lower_bound(g) for g in graphs), 1), batches


def distill(policy: Policy, graphs: Sequence[Graph], encoding: str, fallback: str,
            metadata: dict[str, Any] | None = None, lookahead: str = "none") -> FSMPolicy:
    """Record ``policy``'s decisions on ``graphs`` as ``key -> op`` votes; the majority per
    key (ties: smallest op id) is the FSM's table."""
    votes = policy_votes(policy, graphs, encoding)
    table = fit_table(votes, min_count=1, confidence=0.0)
    return FSMPolicy(table, encoding, graphs[0].vocab.names, fallback, metadata, lookahead)


def train_imitation(train_graphs: Sequence[Graph], cfg: ImitationConfig = ImitationConfig(), *,
                    val_graphs: Sequence[Graph] | None = None,
                    callback: Callable[[dict[str, float]], None] | None = None,
                    metadata: dict[str, Any] | None = None
                    ) -> tuple[TrainResult, NetPolicy]:
    """Behaviour cloning + DAgger on ``train_graphs``, network selection on ``val_graphs``
    (default: train), distillation to an FSM. Returns the FSM's result and the network."""
    if not train_graphs:
        raise GraphError("train_imitation needs at least one training graph")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    val = list(val_graphs) if val_graphs is not None else list(train_graphs)
    extra = resample_graphs(train_graphs, cfg.augment, np.random.default_rng(cfg.seed))
    half = (len(extra) + 1) // 2
    train, val = [*train_graphs, *extra[:half]], [*val, *extra[half:]]
    fallback = cfg.fallback
    if fallback == "auto":
        fallback = select_fallback(val, cfg.encoding)
    k = len(train[0].vocab)
    meta: dict[str, Any] = {"config": {**asdict(cfg), "fallback": fallback}, **(metadata or {})}
    base = lambda: make_fallback(fallback, cfg.encoding)  # noqa: E731
    data = _Samples()
    teacher_batches = 0
    for g in train:
        decisions, n = _teacher(g, [base], cfg)
        _replay(g, decisions, data)
        teacher_batches += n
    teacher_ratio = teacher_batches / max(sum(lower_bound(g) for g in train), 1)
    fb_ratio = evaluate_policy(FSMPolicy({}, cfg.encoding, train[0].vocab.names, fallback),
                               val)[0]
    lb = max(sum(lower_bound(g) for g in val), 1)
    best_net: tuple[int, NetPolicy] | None = None
    best_fsm: tuple[int, FSMPolicy] | None = None
    history: list[dict[str, float]] = []
    policy: NetPolicy | None = None
    for rnd in range(cfg.dagger_rounds + 1):
        if policy is not None:  # DAgger: the current network visits, the teacher labels
            for g in train:
                _dagger(g, policy, base, cfg.label_budget, data)
        policy = NetPolicy(_fit(data, k, cfg))
        net_batches = _ratio(policy, val)[1]
        fsm = distill(policy, train, cfg.encoding, fallback, meta, cfg.lookahead)
        fsm_batches = evaluate_policy(fsm, val)[1]
        if best_net is None or net_batches < best_net[0]:
            best_net = (net_batches, policy)
        if best_fsm is None or fsm_batches < best_fsm[0]:  # the deployed artifact's round
            best_fsm = (fsm_batches, fsm)
        row = {"episode": rnd + 1, "train/samples": float(len(data)),
               "train/teacher_ratio": teacher_ratio, "eval/net_ratio_to_lb": net_batches / lb,
               "eval/ratio_to_lb": fsm_batches / lb, "eval/num_states": fsm.num_states,
               "eval/fallback_ratio_to_lb": fb_ratio}
        history.append(row)
        log.info("imitation round %d: %d samples; validation x LB: network %.4f, distilled "
                 "FSM %.4f (%d states), fallback %.4f; teacher %.4f on train", rnd, len(data),
                 net_batches / lb, fsm_batches / lb, fsm.num_states, fb_ratio, teacher_ratio)
        if callback is not None:
            callback(row)
    assert best_net is not None and best_fsm is not None
    net_policy, net_ratio = best_net[1], best_net[0] / lb
    fsm, fsm_ratio = best_fsm[1], best_fsm[0] / lb
    seconds = time.perf_counter() - t0
    meta.update(net_ratio=net_ratio, best_ratio=fsm_ratio, fallback_ratio=fb_ratio,
                teacher_ratio=teacher_ratio, samples=len(data), train_seconds=seconds)
    fsm.metadata.update(meta)
    return TrainResult(fsm, fsm_ratio, cfg.dagger_rounds + 1, seconds, history), net_policy


def save_network(policy: NetPolicy, cfg: ImitationConfig, k: int, path: str | Path) -> Path:
    """Save the network's weights and shape (``torch.save``)."""
    path = save_path(path)
    torch.save({"format": "edbatch.imitation_net", "num_ops": k, "hidden": cfg.hidden,
                "layers": cfg.layers, "state_dict": policy.net.state_dict()}, path)
    return path


def load_network(path: str | Path) -> NetPolicy:
    """A network saved by :func:`save_network` (``network.pt`` of an imitation run)."""
    path = Path(path)
    if not path.is_file():
        raise PolicyFileError(path, "no such network file",
                              "train one with `python -m experiments.train trainer=imitation`")
    fix = "pass the network.pt written by trainer=imitation, or re-train"
    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises pickle, struct, zip and runtime errors alike
        raise PolicyFileError(path, f"not an edbatch imitation network ({type(e).__name__})",
                              fix) from None
    if not isinstance(data, dict) or data.get("format") != "edbatch.imitation_net":
        raise PolicyFileError(path, "not an edbatch imitation network", fix)
    try:
        cfg = ImitationConfig(hidden=int(data["hidden"]), layers=int(data["layers"]))
        net = _net(int(data["num_ops"]), cfg)
        net.load_state_dict(data["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise PolicyFileError(path, f"malformed network file ({type(e).__name__}: {e})",
                              fix) from None
    return NetPolicy(net)


class ImitationTrainer:
    """Config-friendly wrapper: ``ImitationTrainer(**hparams).fit(train, val, ...)``; the
    network stays on ``self.network`` and is saved as ``network.pt`` beside ``checkpoint``."""

    name = "imitation"

    def __init__(self, **hparams: Any) -> None:
        self.config = ImitationConfig(**hparams)
        self.network: NetPolicy | None = None

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: str | Path | None = None,
            callback: Callable[[dict[str, float]], None] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None) -> TrainResult:
        """Train on ``train_graphs``, select the network on ``val_graphs``, distill."""
        del progress
        result, self.network = train_imitation(train_graphs, self.config,
                                               val_graphs=val_graphs, callback=callback,
                                               metadata=metadata)
        if checkpoint is not None:
            save_network(self.network, self.config, len(train_graphs[0].vocab),
                         Path(checkpoint).with_name("network.pt"))
        return result
