"""Deep-RL baselines through the same env: sb3-contrib MaskablePPO and SB3 DQN.

Both learn on the fixed-size vector observation of :class:`envs.BatchingEnv`. MaskablePPO
uses the action masks in training and inference. SB3's DQN has no masks: it trains with the
env's ``on_invalid="noop"`` (a masked action costs -1 and changes nothing) and acts with a
masked argmax over its Q-values. :func:`distill_fsm` turns either network into an FSM table
over the encoded states it visits, so the executor never runs a network per decision.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edbatch.errors import UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import Frontier, FrontierView, run_policy
from envs.batching import BatchingEnv
from envs.encoding import encode_state
from envs.observation import check_observation, observe
from policies.fsm import FSMPolicy, make_fallback
from policies.guard import (
    fallback_choices,
    guard_table,
    meets_lower_bound,
    pick_fallback,
    vote_proposals,
)
from policies.q_learning import AUTO_FALLBACKS, TrainResult, evaluate_policy, select_fallback
from policies.table_search import policy_votes

__all__ = ["DQNTrainer", "MaskablePPOTrainer", "SB3Policy", "decisions", "distill_fsm"]


class SB3Policy:
    """A trained SB3 model used as a :class:`~edbatch.schedule.Policy` (one net call per
    decision), always choosing an allowed action."""

    needs_typewise = True

    def __init__(self, model: Any, observation: str = "base") -> None:
        self.model, self.observation = model, observation

    def choose(self, view: FrontierView) -> int:
        """Masked greedy action of the network."""
        obs = observe(view, self.observation)
        mask = view.mask.astype(bool)
        q_net = getattr(self.model, "q_net", None)
        if q_net is not None:  # DQN: masked argmax over Q-values
            with torch.no_grad():
                q = q_net(torch.as_tensor(obs[None], device=self.model.device))[0]
            q = q.cpu().numpy()
            return int(np.argmax(np.where(mask, q, -np.inf)))
        action, _ = self.model.predict(obs, action_masks=mask, deterministic=True)
        return int(action)


def decisions(graph: Graph, choose: Callable[[Any], int]) -> Iterator[tuple[Any, int]]:
    """Run ``choose`` (a frontier view -> op type id) on ``graph`` to the end, yielding each
    decision's view and action (the forced pops between decisions are taken)."""
    f = Frontier(graph, typewise=True)
    while True:
        while f.pop_forced() is not None:
            pass
        if f.done:
            return
        view = f.view()
        action = int(choose(view))
        yield view, action
        f.pop(action)


def distill_fsm(policy: Any, graphs: Sequence[Graph], encoding: str, fallback: str,
                metadata: dict[str, Any] | None = None, lookahead: str = "none") -> FSMPolicy:
    """Record ``policy``'s decisions on ``graphs`` as an FSM (majority action per state)."""
    votes: dict[tuple[int, ...], Counter[int]] = {}
    for graph in graphs:
        for view, action in decisions(graph, policy.choose):
            votes.setdefault(encode_state(view, encoding), Counter())[action] += 1
    table = {key: c.most_common(1)[0][0] for key, c in votes.items()}
    names = graphs[0].vocab.names
    return FSMPolicy(table, encoding, names, fallback, metadata, lookahead)


class _SB3Trainer:
    """Shared fit(): build the env, learn, distill, select nothing (one final model)."""

    name = "sb3"

    def __init__(self, total_timesteps: int = 20_000, encoding: str = "hints",
                 fallback: str = "critical_path", reward: str = "ed_batch", seed: int = 0,
                 lookahead: str = "none", eval_points: int = 10, cost_model: Any = None,
                 warm_start_epochs: int = 0, warm_start_lr: float = 1e-3, guard: bool = False,
                 guard_max_evals: int = 2000, observation: str = "base",
                 **algo_kwargs: Any) -> None:
        #: The env's observation vector (:mod:`envs.observation`): ``critical`` adds the
        #: critical-path features, so cloning the critical-path fallback can be exact.
        self.observation = check_observation(observation)
        self.total_timesteps, self.encoding, self.fallback = total_timesteps, encoding, fallback
        #: Behaviour cloning of the fallback before RL (epochs over its decisions on the
        #: training graphs; MaskablePPO only), and the residual guard of the distilled table.
        self.warm_start_epochs, self.warm_start_lr = int(warm_start_epochs), warm_start_lr
        self.guard, self.guard_max_evals = bool(guard), int(guard_max_evals)
        self.reward, self.seed, self.algo_kwargs = reward, seed, algo_kwargs
        self.cost_model = cost_model  # reward="cost_model": a CostModel, file path or callable
        self.lookahead = lookahead
        #: Greedy evaluations of the network on the validation graphs during training (the
        #: learning curve), evenly spaced in timesteps; the last one is at the end.
        self.eval_points = max(1, int(eval_points))

    def _make_model(self, env: BatchingEnv) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _env(self, graphs: Sequence[Graph]) -> BatchingEnv:
        return BatchingEnv(graphs=list(graphs), reward=self.reward, encoding="base",
                           cost_model=self.cost_model, observation=self.observation)

    def fit(self, train_graphs: Sequence[Graph], val_graphs: Sequence[Graph], *,
            checkpoint: str | Path | None = None,
            callback: Callable[[dict[str, float]], None] | None = None,
            progress: bool = False, metadata: dict[str, Any] | None = None) -> TrainResult:
        """Learn for ``total_timesteps`` env steps, then distill the net into an FSM."""
        from stable_baselines3.common.logger import Logger

        t0 = time.perf_counter()
        train, val = list(train_graphs), list(val_graphs) or list(train_graphs)
        fallback = self._fallback(train, val)
        model = self._make_model(self._env(train_graphs))
        # guarded, at the lower bound on the training graphs: nothing the guard could keep
        idle = self.guard and meets_lower_bound(train, self.encoding, fallback)
        steps = 0 if idle else self.total_timesteps
        cloned = None if idle else self._warm_start(model, train, fallback)
        # SB3's default logger makes an empty /tmp/SB3-<time> folder on every learn(); ours
        # writes nothing (episode stats go through ``callback``, i.e. W&B)
        model.set_logger(Logger(folder=None, output_formats=[]))
        net = SB3Policy(model, self.observation)
        alone = FSMPolicy({}, self.encoding, train[0].vocab.names, fallback)
        curve = _Curve(net, val, callback, every=max(1, self.total_timesteps // self.eval_points),
                       fallback_ratio=evaluate_policy(alone, val)[0])
        model.learn(total_timesteps=steps, progress_bar=False, callback=_EpisodeCallback(curve))
        if not curve.history or curve.history[-1]["timestep"] < model.num_timesteps:
            curve.evaluate(model.num_timesteps)  # the curve ends at the final network
        meta = {"trainer": self.name, "total_timesteps": self.total_timesteps,
                "seed": self.seed, **(metadata or {})}
        if idle:
            meta["skipped"] = (f"{fallback} alone meets the lower bound on the training "
                               f"graphs: no env step taken")
        if cloned is not None:
            meta["warm_start_accuracy"] = cloned
        if self.guard:
            fsm = residual_fsm(net, train, val, self.encoding, fallback, meta, self.lookahead,
                               self.guard_max_evals)
        else:
            fsm = distill_fsm(net, train, self.encoding, fallback, meta, self.lookahead)
        ratio, _, _ = evaluate_policy(fsm, val)
        seconds = time.perf_counter() - t0
        fsm.metadata.update(best_ratio=ratio, train_seconds=seconds)
        fsm.metadata.update(episodes=curve.episodes, timesteps=int(model.num_timesteps))
        final = {**curve.history[-1], "eval/fsm_ratio_to_lb": ratio}
        result = TrainResult(fsm, ratio, curve.episodes, seconds,
                             [*curve.history[:-1], final])
        result.timesteps = int(model.num_timesteps)  # type: ignore[attr-defined]
        self.network = net
        return result


    def _fallback(self, train: list[Graph], val: list[Graph]) -> str:
        """``auto``: the best heuristic on validation, with the guard on train + validation
        (the best single heuristic the learner starts from)."""
        if self.fallback != "auto":
            return self.fallback
        if self.guard:
            return pick_fallback([*train, *val], self.encoding, AUTO_FALLBACKS)
        return select_fallback(val, self.encoding)

    def _warm_start(self, model: Any, train: list[Graph], fallback: str) -> float | None:
        """Behaviour cloning of ``fallback`` (MaskablePPO): the accuracy reached, or None."""
        if not self.warm_start_epochs:
            return None
        if not hasattr(model.policy, "evaluate_actions"):
            raise UnknownNameError(f"warm_start_epochs needs a policy-gradient model with "
                                   f"masks (maskable_ppo), not {self.name}; set "
                                   f"trainer.warm_start_epochs=0")
        return clone_fallback(model.policy, train, fallback, self.encoding,
                              self.warm_start_epochs, self.warm_start_lr, self.seed,
                              observation=self.observation)


def clone_fallback(policy: Any, graphs: Sequence[Graph], fallback: str, encoding: str,
                   epochs: int, lr: float, seed: int, batch: int = 256,
                   observation: str = "base") -> float:
    """Fit a MaskablePPO actor to ``fallback``'s decisions on ``graphs`` (masked
    cross-entropy on the env's observation), so RL starts from the heuristic; returns the
    share of those decisions the fitted actor's masked argmax reproduces."""
    fb = make_fallback(fallback, encoding)
    obs, masks, acts = [], [], []
    for g in graphs:
        for view, a in decisions(g, fb.choose):
            obs.append(observe(view, observation))
            masks.append(np.asarray(view.mask, dtype=bool))
            acts.append(a)
    x = torch.as_tensor(np.stack(obs), device=policy.device)
    m = torch.as_tensor(np.stack(masks), device=policy.device)
    y = torch.as_tensor(np.array(acts), device=policy.device)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    policy.set_training_mode(True)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch):
            _, logp, _ = policy.evaluate_actions(x[idx], y[idx], action_masks=m[idx].numpy())
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        dist = policy.get_distribution(x, action_masks=m.numpy())
        pred = dist.distribution.probs.argmax(dim=1)
    return float((pred == y).float().mean())


def residual_fsm(net: Any, train: list[Graph], val: list[Graph], encoding: str,
                 fallback: str, meta: dict[str, Any], lookahead: str, max_evals: int
                 ) -> FSMPolicy:
    """The fallback plus the network's disagreements with it that pay on the training
    graphs without costing on the validation graphs (:mod:`policies.guard`)."""
    votes = policy_votes(net, train, encoding)
    proposals = vote_proposals(votes, fallback_choices(train, encoding, fallback))
    table, report = guard_table(proposals, train, val, encoding, fallback,
                                max_evals=max_evals, lookahead=lookahead)
    meta.update(guard=report.as_meta(), net_states=len(votes))
    reason = report.reason()
    if reason is not None:
        meta["learned_nothing"] = reason
    return FSMPolicy(table, encoding, train[0].vocab.names, fallback, meta, lookahead)


def _net_ratio(net: SB3Policy, graphs: Sequence[Graph]) -> float:
    batches = sum(run_policy(g, net).num_batches for g in graphs)
    from edbatch.schedule import lower_bound

    return batches / max(sum(lower_bound(g) for g in graphs), 1)


class MaskablePPOTrainer(_SB3Trainer):
    """sb3-contrib MaskablePPO on the vector observation, with action masks."""

    name = "maskable_ppo"

    def _make_model(self, env: BatchingEnv) -> Any:
        from sb3_contrib import MaskablePPO

        kwargs = {"n_steps": 512, "batch_size": 128, "verbose": 0, **self.algo_kwargs}
        return MaskablePPO("MlpPolicy", env, seed=self.seed, device="cpu", **kwargs)


class DQNTrainer(_SB3Trainer):
    """SB3 DQN; masked actions are no-ops costing -1 in training, masked argmax at inference."""

    name = "dqn"

    def _env(self, graphs: Sequence[Graph]) -> BatchingEnv:
        return BatchingEnv(graphs=list(graphs), reward=self.reward, encoding="base",
                           on_invalid="noop", max_steps=20_000, cost_model=self.cost_model,
                           observation=self.observation)

    def _make_model(self, env: BatchingEnv) -> Any:
        from stable_baselines3 import DQN

        kwargs = {"learning_starts": 500, "buffer_size": 50_000, "verbose": 0,
                  "exploration_fraction": 0.3, **self.algo_kwargs}
        return DQN("MlpPolicy", env, seed=self.seed, device="cpu", **kwargs)


class _Curve:
    """The SB3 learning curve: finished episodes, and every ``every`` timesteps the greedy
    network's batches/LB on the validation graphs (``eval/ratio_to_lb``, and the best so
    far; the fallback heuristic's level ``eval/fallback_ratio_to_lb``), each row also sent
    to ``callback`` (the tracker: W&B ``train/``, ``eval/`` series).

    Rows carry ``timestep`` (the W&B step and the curve's x) and ``episode`` (finished
    episodes so far)."""

    def __init__(self, net: SB3Policy, graphs: Sequence[Graph],
                 callback: Callable[[dict[str, float]], None] | None, every: int,
                 fallback_ratio: float | None = None) -> None:
        self.net, self.graphs, self.callback, self.every = net, graphs, callback, every
        self.fallback_ratio = fallback_ratio
        self.episodes, self.best = 0, float("inf")
        self.history: list[dict[str, float]] = []

    def _emit(self, row: dict[str, float]) -> None:
        if self.callback is not None:
            self.callback(row)

    def episode_done(self, timestep: int, info: dict[str, Any]) -> None:
        self.episodes += 1
        self._emit({"timestep": timestep, "episode": self.episodes,
                    "train/num_batches": float(info.get("num_batches", 0)),
                    "train/ratio_to_lb": float(info.get("ratio", 0.0))})

    def evaluate(self, timestep: int) -> None:
        ratio = _net_ratio(self.net, self.graphs)
        self.best = min(self.best, ratio)
        row = {"timestep": timestep, "episode": self.episodes, "eval/ratio_to_lb": ratio,
               "eval/best_ratio_to_lb": self.best, "train/episodes": float(self.episodes),
               "train/timesteps": float(timestep)}
        if self.fallback_ratio is not None:  # the heuristic's level (the curve's line)
            row["eval/fallback_ratio_to_lb"] = self.fallback_ratio
        self.history.append(row)
        self._emit(row)


class _EpisodeCallback:
    """SB3 callback feeding a :class:`_Curve`: finished episodes, periodic evaluations."""

    def __new__(cls, curve: _Curve) -> Any:
        from stable_baselines3.common.callbacks import BaseCallback

        class CurveCallback(BaseCallback):
            def _on_step(self) -> bool:
                for info, done in zip(self.locals.get("infos", []), self.locals.get("dones", [])):
                    if done:
                        curve.episode_done(self.num_timesteps, info)
                if self.num_timesteps % curve.every == 0:
                    curve.evaluate(self.num_timesteps)
                return True

        return CurveCallback()
