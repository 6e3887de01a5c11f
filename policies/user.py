"""Learned batching policies for a user's own model (``policies.train_policy``).

Record mini-batches with :class:`~edbatch.api.DynamicBatch` as usual, collect their graphs
instead of running them (``graph, _ = batch.graph(); batch.discard()``), train an FSM on
them with any of the project's trainers, save it, and pass it to ``batch.run(policy)``::

    graphs = []
    for chunk in chunks:                      # a few representative mini-batches
        for item in chunk:
            with batch.instance():
                model.encode(item)
        graphs.append(batch.graph()[0])
        batch.discard()
    policy = train_policy(graphs[:4], val_graphs=graphs[4:], path="policy.json")
    out = batch.run(load_policy("policy.json"))

Op types are matched by name: the training graphs may have different vocabularies (op
types such as ``input/<shape>``, ``embedding<k>`` and ``loss_sum`` appear only once the
program uses them), the policy is trained on their union, and ``batch.run(policy)``
re-expresses each mini-batch in the policy's op types; only a mini-batch that uses an op
type none of the training graphs had is refused (naming it). A policy that learned nothing
(an empty table: its fallback alone, e.g. because the fallback already met the lower bound
and training stopped before the first episode) says so with a :class:`UserWarning` and
``policy.metadata["learned"] = False`` with the reason in ``metadata["note"]``.

Trainers (:data:`TRAINERS`): ``fsm`` (edbatch's tabular learner, the
``experiments.train`` default), ``ed_batch`` (ED-Batch's learner), ``maskable_ppo`` and
``dqn`` (SB3, distilled into an FSM; need the ``rl`` extra), or any object with the
trainers' ``fit(train_graphs, val_graphs, ...)`` method.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edbatch.api._vocab import to_vocab, union_vocab
from edbatch.errors import GraphError, UnknownNameError, did_you_mean
from edbatch.graph import Graph
from policies.fsm import FSMPolicy

__all__ = ["TRAINERS", "load_policy", "train_policy"]

#: Trainer name -> (class path, default hyper-parameters); ``fsm`` mirrors
#: ``conf/trainer/q_learning.yaml`` with ``conf/policy/fsm.yaml``.
TRAINERS: dict[str, tuple[str, dict[str, Any]]] = {
    "fsm": ("policies.q_learning:QLearningTrainer", {
        "encoding": "hints", "fallback": "auto", "lookahead": "rollout",
        "fallback_snapshot": True, "warm_start": True, "clip_bootstrap": False,
        "max_episodes": 300}),
    "ed_batch": ("policies.q_learning:QLearningTrainer", {}),
    "maskable_ppo": ("policies.sb3:MaskablePPOTrainer", {"fallback": "auto"}),
    "dqn": ("policies.sb3:DQNTrainer", {"fallback": "auto"}),
    "priority": ("policies.priority_train:PriorityTrainer", {}),  # weights, not a table
    "priority_fsm": ("policies.priority_distill:PriorityFsmTrainer", {}),  # distilled table
}


def _graphs(items: Sequence[Any], what: str) -> list[Graph]:
    """Graphs from graphs or ``DynamicBatch.graph()`` pairs, all of one vocabulary."""
    graphs = [g[0] if isinstance(g, tuple) else g for g in items]
    for i, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise GraphError(f"{what}[{i}] is a {type(g).__name__}, not a Graph; pass the "
                             f"graphs of DynamicBatch.graph() (or the pairs it returns)")
    return graphs


def _learned_nothing(policy: Any, result: Any) -> str | None:
    """Why a trained policy is its fallback alone (``None`` if it has a table)."""
    if getattr(policy, "num_states", 1) > 0:
        return None
    episodes = getattr(result, "episodes", None)
    ratio = getattr(result, "best_ratio", float("nan"))
    fallback = getattr(policy, "fallback_name", "?")
    stop = (getattr(policy, "metadata", {}).get("config") or {}).get("early_stop_ratio")
    why = getattr(policy, "metadata", {}).get("learned_nothing")
    if why and getattr(policy, "encoding", None) in ("priority", "rank"):  # priority_fsm: rank
        return (f"train_policy: the priority policy learned nothing: {why}; the policy is "
                f"{fallback!r} alone ({ratio:.4f} x the lower bound on validation)")
    if episodes == 0:
        return (f"train_policy: the policy learned nothing (0 states, 0 episodes): its "
                f"fallback {fallback!r} already schedules the validation graphs at "
                f"{ratio:.4f} x the lower bound, which meets the early-stop ratio "
                f"{stop}; the policy is that fallback alone. Nothing is left to learn on "
                f"these graphs (pass early_stop_ratio=1.0 to train anyway)")
    return (f"train_policy: the policy learned nothing (0 states after {episodes or 'its'} "
            f"episodes): no table beat its fallback {fallback!r} ({ratio:.4f} x the lower "
            f"bound) on the validation graphs; the policy is that fallback alone. Train "
            f"longer (max_episodes=...) or on more varied graphs")


def train_policy(graphs: Sequence[Any], trainer: str | Any = "fsm", *,
                 val_graphs: Sequence[Any] | None = None, path: str | Path | None = None,
                 seed: int = 0, checkpoint: str | Path | None = None, progress: bool = False,
                 **hparams: Any) -> Any:
    """Train an FSM batching policy on recorded mini-batch graphs; optionally save it.

    Args:
        graphs: training graphs (``DynamicBatch.graph()`` results or their graphs).
        trainer: a name of :data:`TRAINERS` or a trainer object with ``fit``.
        val_graphs: graphs for snapshot selection and the ``auto`` fallback choice
            (default: the training graphs).
        path: where to save the policy artifact (JSON), if given.
        seed: the trainer's seed.
        checkpoint: the tabular learners' checkpoint file (resumes if it exists).
        progress: show a progress bar.
        **hparams: the trainer's hyper-parameters, over the defaults of :data:`TRAINERS`
            (e.g. ``max_episodes=100``; see ``policies.QLearningConfig``).

    Returns:
        The trained :class:`policies.FSMPolicy` (over the union of the graphs' op types);
        ``policy.metadata["best_ratio"]`` is its batches / lower bound on the validation
        graphs, ``metadata["learned"]`` whether its table has any state.

    Warns:
        UserWarning: the policy learned nothing (its table is empty), with the reason.

    Raises:
        GraphError: no graphs, or a non-graph.
        UnknownNameError: an unknown trainer name or hyper-parameter.
    """
    train = _graphs(graphs, "graphs")
    if not train:
        raise GraphError("train_policy needs at least one graph; record mini-batches and "
                         "collect batch.graph() before calling it")
    val = _graphs(val_graphs, "val_graphs") if val_graphs is not None else train
    vocab = union_vocab([*train, *val])
    train = [to_vocab(g, vocab) for g in train]
    val = [to_vocab(g, vocab) for g in val]
    if isinstance(trainer, str):
        trainer = _make_trainer(trainer, seed, hparams)
    elif hparams:
        raise GraphError(f"hyper-parameters {sorted(hparams)} go to a trainer given by name; "
                         f"set them on the trainer object {type(trainer).__name__} instead")
    result = trainer.fit(train, val, checkpoint=checkpoint, progress=progress,
                         metadata={"source": "edbatch.api", "trainer": getattr(
                             trainer, "name", type(trainer).__name__), "seed": seed})
    note = _learned_nothing(result.policy, result)
    result.policy.metadata["learned"] = note is None
    if note is not None:
        result.policy.metadata["note"] = note
        warnings.warn(note, UserWarning, stacklevel=2)
    if path is not None:
        result.policy.save(path)
    return result.policy


def _make_trainer(name: str, seed: int, hparams: dict[str, Any]) -> Any:
    import importlib

    if name not in TRAINERS:
        raise UnknownNameError(f"unknown trainer {name!r}; choose one of {list(TRAINERS)}."
                               + did_you_mean(name, TRAINERS))
    target, defaults = TRAINERS[name]
    module, cls = target.split(":")
    kwargs = {**defaults, "seed": seed, **hparams}
    try:
        return getattr(importlib.import_module(module), cls)(**kwargs)
    except TypeError as e:  # an unknown keyword of the trainer or its config
        raise UnknownNameError(f"trainer {name!r} rejected its hyper-parameters "
                               f"{sorted(hparams)}: {e}; see policies.QLearningConfig or "
                               f"the SB3 trainers for the accepted names") from None


def load_policy(path: str | Path) -> Any:
    """Read a saved FSM policy (:meth:`policies.FSMPolicy.load`; ``batch.run(policy)``
    checks each graph's op types against it) or priority policy
    (:meth:`policies.priority.PriorityPolicy.load`, any op types) or the priority policy
    distilled into a table (:meth:`policies.priority_fsm.PriorityFSM.load`) or afterstate
    policy (:meth:`policies.afterstate.AfterstatePolicy.load`, ``trainer=afterstate``).

    Raises:
        PolicyFileError: a missing, corrupt or foreign file.
    """
    from policies import afterstate, priority, priority_fsm
    from policies._header import artifact_format

    loaders = {priority.FORMAT: priority.PriorityPolicy.load,
               afterstate.FORMAT: afterstate.AfterstatePolicy.load,
               priority_fsm.FORMAT: priority_fsm.PriorityFSM.load}
    load = loaders.get(artifact_format(path))  # type: ignore[arg-type]
    return load(path) if load is not None else FSMPolicy.load(path)
