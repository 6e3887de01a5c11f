"""BatchingEnv: ED-Batch's batching MDP as a Gymnasium environment."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray

from edbatch.errors import (
    ConfigError,
    GraphError,
    InvalidActionError,
    UnknownNameError,
    did_you_mean,
    is_integer,
)
from edbatch.graph import Graph, OpType, Vocab
from edbatch.schedule import Frontier, lower_bound
from edbatch.workloads import GraphSampler, make_workload
from envs.encoding import ENCODINGS, OBS_HIGH, encode_state
from envs.observation import check_observation, observation_length, observe

__all__ = ["REWARDS", "BatchingEnv", "CostModel", "GraphSource", "MaskedDiscrete"]

#: A graph source: a sampler (``rng -> Graph``) or a fixed list of graphs.
GraphSource = Callable[[np.random.Generator], Graph] | Sequence[Graph]
#: Estimated cost (e.g. seconds) of one kernel launch of an op type over ``n`` nodes.
CostModel = Callable[[OpType, int], float]

REWARDS = ("ed_batch", "unit", "cost_model")


class MaskedDiscrete(spaces.Discrete):
    """``Discrete`` whose ``sample()`` without a mask draws from the env's current mask.

    Actions are validated by the env, not by the space: ``contains`` is the plain
    ``Discrete`` check. Sampling a random *allowed* action is what checkers and random
    baselines need from an environment whose action set changes every step.
    """

    def __init__(self, n: int, mask_fn: Callable[[], NDArray[np.int8] | None] | None = None,
                 seed: int | None = None) -> None:
        super().__init__(n, seed=seed)
        self.mask_fn = mask_fn

    def sample(self, mask: Any = None, probability: Any = None) -> np.int64:
        """Sample an action; without ``mask``/``probability``, an allowed one."""
        if mask is None and probability is None and self.mask_fn is not None:
            current = self.mask_fn()
            if current is not None and current.any():
                mask = current.astype(np.int8)
        return super().sample(mask=mask, probability=probability)

    def __deepcopy__(self, memo: dict[int, Any]) -> MaskedDiscrete:
        out = MaskedDiscrete(int(self.n), None)
        out.np_random.bit_generator.state = self.np_random.bit_generator.state
        return out


class BatchingEnv(gym.Env[NDArray[np.float32], np.int64]):
    """Pick the op type to batch next; all its ready nodes run as one kernel.

    ## Description
    A mini-batch dataflow graph is sampled at ``reset``. At each step the agent picks an op
    type; every ready node of that type runs as one batch. Unbatchable nodes run alone as
    forced steps inside ``step`` (they still count as batches). The episode ends when every
    node has run. Fewer batches is better; the lower bound LB is reported in ``info``.

    ## Action Space
    ``Discrete(K)`` over the workload's op types. Only batchable types with ready nodes are
    allowed: ``info["action_mask"]`` (int8, Gymnasium convention) and ``action_masks()``
    (bool, sb3-contrib convention). An action must be integral (Python ``int``, NumPy
    integer, or a one-element NumPy integer array); a float, string, ``None`` or ``bool``
    raises :class:`InvalidActionError` naming the value (``0.5`` is never truncated to 0).
    An integer outside ``0..K-1`` (``step(10**6)``, ``step(-1)``) always raises
    :class:`InvalidActionError` naming the value and the valid range, in every mode and
    through ``gym.make`` too: it is not an action of the declared space.
    An in-range masked action raises :class:`InvalidActionError` with ``on_invalid="raise"`` (the
    class default, what edbatch's learners use) and is a -1 no-op with ``"noop"`` (the
    default of ``gym.make("edbatch/Batching-v0")``, so every action of the declared
    ``Discrete`` space is a legal ``step`` input, as Gymnasium's ``check_env`` expects).

    ## Observation Space
    ``Box(0, 4, (7K,), float32)`` from :func:`envs.encoding.encode_observation`: mask,
    scaled ready counts, ``|F(a)|/T(a)``, scaled ``T(a)``, remaining fraction, remaining
    mean depth, last op. ``observation="critical"``: ``(10K,)``, plus per type the scaled
    height of its highest ready node, its gap below the highest and whether its batch is
    complete (:mod:`envs.observation`). ``info["state_key"]`` holds the hashable key of
    ``encoding`` for tabular learners.

    ## Rewards
    ``ed_batch``: ``-1 + |F(a)|/T(a)`` (docs/architecture.md 3.5); ``unit``: ``-1`` per decision;
    ``cost_model``: ``-cost_model(op, batch size)``; ``cost_model`` is a callable, or the
    path of a file written by ``python -m experiments.calibrate`` (milliseconds per launch,
    measured on this device: :mod:`edbatch.executor.cost_model`), checked against the
    workload's op types.

    ## Arguments
    graphs: a sampler or a list of graphs (sampled uniformly); or ``workload`` (+ ``split``,
    ``batch_size``, ``granularity``, ``workload_kwargs``) to sample mini-batches of a
    registered workload. ``encoding``, ``reward``, ``cost_model``, ``max_steps``.
    ``on_invalid``: ``"raise"`` (class default) raises on a masked action; ``"noop"`` (the
    registered env's default) makes an in-range masked action leave the state unchanged,
    return reward -1 and ``info["invalid_action"] = True``. Generic tools step with actions
    drawn in another state (Gymnasium's ``check_env`` samples an action before a seeded
    reset and steps it after), so ``gym.make`` uses ``noop``; pass ``on_invalid="raise"``
    there to be strict.

    ## Examples
        >>> import gymnasium as gym, envs
        >>> from edbatch.workloads.synthetic import random_binary_trees
        >>> g = random_binary_trees(np.random.default_rng(0), num_trees=4, max_leaves=6)
        >>> env = gym.make("edbatch/Batching-v0", graphs=[g])
        >>> obs, info = env.reset(seed=0)
        >>> done = False
        >>> while not done:
        ...     action = int(np.flatnonzero(info["action_mask"])[0])
        ...     obs, r, done, trunc, info = env.step(action)
        >>> info["num_batches"] >= info["lower_bound"]
        True
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012

    def __init__(self, graphs: GraphSource | None = None, *, workload: str | None = None,
                 split: str = "train", batch_size: int = 64, granularity: str = "cell",
                 workload_kwargs: dict[str, Any] | None = None, encoding: str = "sorted",
                 reward: str = "ed_batch", cost_model: CostModel | str | Path | None = None,
                 max_steps: int | None = None, on_invalid: str = "raise",
                 observation: str = "base", render_mode: str | None = None) -> None:
        self._source, self.vocab = _resolve_source(graphs, workload, split, batch_size,
                                                   granularity, workload_kwargs or {})
        if reward not in REWARDS:
            raise UnknownNameError(f"unknown reward {reward!r}; choose one of {list(REWARDS)}."
                                   + did_you_mean(reward, REWARDS))
        if reward == "cost_model" and cost_model is None:
            raise UnknownNameError("reward='cost_model' needs a cost_model: a calibrated "
                                   "cost-model file (python -m experiments.calibrate), a "
                                   "CostModel, or a callable (op type, batch size) -> cost")
        cost_model = _resolve_cost_model(cost_model, self.vocab)
        if encoding not in ENCODINGS:
            raise UnknownNameError(f"unknown encoding {encoding!r}; choose one of "
                                   f"{list(ENCODINGS)}." + did_you_mean(encoding, ENCODINGS))
        self.encoding, self.reward_kind, self.cost_model = encoding, reward, cost_model
        if on_invalid not in ("raise", "noop"):
            raise UnknownNameError(f"on_invalid must be 'raise' or 'noop', got {on_invalid!r}")
        if max_steps is not None and (not is_integer(max_steps) or max_steps < 1):
            raise ConfigError("max_steps", max_steps, f"an integer >= 1 or None (got type "
                              f"{type(max_steps).__name__})", "pass e.g. max_steps=500")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise UnknownNameError(f"render_mode {render_mode!r} is not one of this env's "
                                   f"{self.metadata['render_modes']}; pass render_mode='ansi' "
                                   f"(a text frame) or None")
        self.max_steps, self.render_mode, self.on_invalid = max_steps, render_mode, on_invalid
        k = len(self.vocab)
        self.action_space = MaskedDiscrete(k, self._current_mask)
        self.observation = check_observation(observation)
        self.observation_space = spaces.Box(0.0, OBS_HIGH, (observation_length(k, observation),),
                                            np.float32)
        self.graph: Graph | None = None
        self.frontier: Frontier | None = None
        self._lb = 0
        self._steps = 0

    # ------------------------------------------------------------------ Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        """Sample a graph (or take ``options["graph"]``) and run the initial forced steps."""
        super().reset(seed=seed)
        if options is not None and (not isinstance(options, Mapping) or set(options) - {"graph"}):
            raise GraphError(f"reset(options=...) takes a dict with the one key 'graph' (a "
                             f"Graph of this env's workload), got {options!r:.80}")
        graph = (options or {}).get("graph")
        if graph is None:
            graph = self._sample()
        if not isinstance(graph, Graph):
            raise GraphError(f"options['graph'] must be an edbatch Graph, got "
                             f"{type(graph).__name__}; pass e.g. workload.minibatch(split, "
                             f"indices)")
        if graph.vocab != self.vocab:
            raise GraphError("options['graph'] uses another vocabulary than this env; make "
                             "the env from the same workload as the graph")
        if not graph.batchable_node.any():
            raise GraphError("the graph has no batchable node, so there is no decision to make")
        self.graph, self._steps = graph, 0
        self.frontier = Frontier(graph, typewise=True)
        self._lb = lower_bound(graph)
        self._run_forced()
        return self._snapshot()

    def step(self, action: Any) -> tuple[NDArray[np.float32], SupportsFloat, bool, bool,
                                         dict[str, Any]]:
        """Run every ready node of op type ``action`` as one batch, then forced steps."""
        f = self.frontier
        if f is None or f.done:
            raise InvalidActionError("step() called on a finished episode; call reset() first")
        a = _integral_action(action)
        k = len(self.vocab)
        if not 0 <= a < k:  # outside the declared space: always an error, whatever on_invalid
            raise InvalidActionError(
                f"action {a!r} is outside the action space Discrete({k}): op type ids are "
                f"0..{k - 1}; pick one allowed by info['action_mask']")
        if not f.mask()[a]:
            if self.on_invalid == "raise":
                raise InvalidActionError(f._invalid_message(a))
            self._steps += 1
            truncated = self.max_steps is not None and self._steps >= self.max_steps
            obs, info = self._snapshot()
            return obs, -1.0, False, truncated, {**info, "invalid_action": True}
        reward = self._reward(a)
        f.pop(a)
        self._steps += 1
        self._run_forced()
        terminated = f.done
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        obs, info = self._snapshot()
        return obs, reward, terminated, truncated, info

    def _current_mask(self) -> NDArray[np.int8] | None:
        return None if self.frontier is None else self.frontier.mask()

    def action_masks(self) -> NDArray[np.bool_]:
        """Boolean mask of allowed actions (the name sb3-contrib's MaskablePPO looks for)."""
        if self.frontier is None:
            raise InvalidActionError("action_masks() called before reset(); call reset() first")
        return self.frontier.mask().astype(bool)

    def render(self) -> str | None:
        """ANSI text: batches so far and the ready op types with their counts."""
        if self.render_mode != "ansi" or self.frontier is None:
            return None
        f = self.frontier
        ready = ", ".join(f"{self.vocab[int(a)].name}:{int(f.ready_count[a])}"
                          for a in np.flatnonzero(f.mask()))
        return f"batches={f.num_batches} lb={self._lb} ready=[{ready}]"

    # ------------------------------------------------------------------ helpers
    def _sample(self) -> Graph:
        if callable(self._source):
            return self._source(self.np_random)
        return self._source[int(self.np_random.integers(len(self._source)))]

    def _run_forced(self) -> None:
        assert self.frontier is not None
        while self.frontier.pop_forced() is not None:
            pass

    def _reward(self, a: int) -> float:
        f = self.frontier
        assert f is not None
        if self.reward_kind == "ed_batch":
            return -1.0 + f.count(a) / max(f.typewise(a), 1)
        if self.reward_kind == "unit":
            return -1.0
        assert self.cost_model is not None
        return -float(self.cost_model(self.vocab[a], f.count(a)))

    def _snapshot(self) -> tuple[NDArray[np.float32], dict[str, Any]]:
        """Observation and info of the current state, from one frontier view."""
        f = self.frontier
        assert f is not None
        view = f.view()
        info: dict[str, Any] = {
            "action_mask": np.array(view.mask),
            "num_batches": f.num_batches,
            "lower_bound": self._lb,
            "ratio": f.num_batches / max(self._lb, 1),
        }
        if not f.done:
            info["state_key"] = encode_state(view, self.encoding)
        return observe(view, self.observation), info


def _integral_action(action: Any) -> int:
    """``action`` as an int if it is integral (Python int, NumPy integer, or a 0-d / 1-element
    NumPy integer array as SB3's ``predict`` returns); anything else raises.

    ``bool`` is refused although it subclasses ``int``: ``True`` is never a meaningful op type.
    Floats are refused even when whole (``1.0``): a float action means a continuous policy or
    a bug upstream, and silently truncating ``0.5`` to ``0`` would hide it.
    """
    if isinstance(action, np.ndarray) and action.size == 1 and \
            np.issubdtype(action.dtype, np.integer):
        return int(action.reshape(()))
    if is_integer(action):
        return int(action)
    raise InvalidActionError(
        f"action must be an integer op type id (Python int or NumPy integer), got "
        f"{action!r} of type {type(action).__name__}; pass e.g. int(np.argmax(scores))")


def _resolve_source(graphs: GraphSource | None, workload: str | None, split: str,
                    batch_size: int, granularity: str, kwargs: dict[str, Any]
                    ) -> tuple[GraphSource, Vocab]:
    if graphs is None and workload is None:
        raise GraphError("BatchingEnv needs a graph source: graphs=<sampler or list of graphs> "
                         "or workload=<name> (with split and batch_size)")
    if graphs is None:
        wl = make_workload(str(workload), granularity=granularity, **kwargs)
        sampler = GraphSampler(wl, split, batch_size)
        return sampler, wl.vocab
    if isinstance(graphs, GraphSampler):
        return graphs, graphs.vocab
    if callable(graphs):
        vocab = getattr(graphs, "vocab", None)
        if vocab is None:
            raise GraphError("a graph sampler passed to BatchingEnv needs a .vocab attribute")
        return graphs, vocab
    try:
        graphs = list(graphs)
    except TypeError:
        raise GraphError(f"BatchingEnv(graphs=...) takes a list of Graphs or a sampler, got "
                         f"{type(graphs).__name__}") from None
    if not graphs:
        raise GraphError("BatchingEnv got an empty list of graphs")
    for i, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise GraphError(f"BatchingEnv(graphs=...): item {i} is a {type(g).__name__}, not "
                             f"a Graph (e.g. workload.minibatch(split, indices))")
        if g.vocab != graphs[0].vocab:
            raise GraphError(f"graph {i} has another vocabulary than graph 0; all graphs of "
                             f"one env must come from the same workload")
    return graphs, graphs[0].vocab


def _resolve_cost_model(cost_model: CostModel | str | Path | None, vocab: Vocab
                        ) -> CostModel | None:
    """A cost-model file path -> the loaded model (checked against ``vocab``); a calibrated
    model is checked too; any other callable is taken as is."""
    if cost_model is None:
        return None
    from edbatch.executor.cost_model import CostModel as Calibrated
    from edbatch.executor.cost_model import load_cost_model

    if isinstance(cost_model, (str, Path)):
        return load_cost_model(cost_model, vocab)
    if isinstance(cost_model, Calibrated):
        cost_model.check_vocab(vocab)
        return cost_model
    if not callable(cost_model):
        raise UnknownNameError(f"cost_model must be a cost-model file path or a callable "
                               f"(op type, batch size) -> cost, got {cost_model!r}")
    return cost_model
