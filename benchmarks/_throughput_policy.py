"""The throughput benchmark's learned FSM: the learner's settings from ``conf/`` and a
policy loaded from ``--policy-dir`` or trained there on first use."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks._throughput_dynet import BATCH_SIZE, ROOT
from benchmarks._throughput_passes import log
from edbatch.workloads import Workload

__all__ = ["fsm_hparams", "load_or_train_policy"]


def fsm_hparams(max_episodes: int | None = None, seed: int = 0,
                trainer: str = "q_learning") -> dict[str, Any]:
    """The learner's settings: ``conf/trainer/<trainer>.yaml`` + ``policy/fsm``, no
    lookahead (the run-time path is timed)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"seed": seed,
                            "policy": OmegaConf.load(ROOT / "conf/policy/fsm.yaml"),
                            "trainer": OmegaConf.load(ROOT / f"conf/trainer/{trainer}.yaml")})
    cfg.policy.lookahead = "none"
    hp = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(hp, dict)
    hp.pop("_target_", None)
    if max_episodes and trainer == "q_learning":
        hp["max_episodes"] = max_episodes
    if trainer == "expert":  # 8 resampled mini-batches, not 32: minutes, not a quarter hour
        hp["augment"] = 8
    return {str(k): v for k, v in hp.items()}


def load_or_train_policy(name: str, wl: Workload, policy_dir: str | Path,
                         max_episodes: int | None = None, trainer: str = "expert"
                         ) -> tuple[Any, dict[str, Any]]:
    """Load ``policy_dir/<name>[_expert].json``, or train it with ``trainer`` (``expert``:
    table search, ``q_learning``: ``max_episodes``) on 4 train graphs, 2 validation, and save.

    Returns:
        The :class:`~policies.fsm.FSMPolicy` and a record of where it lives and its training.
    """
    from experiments._common import graph_set
    from policies import FSMPolicy, QLearningTrainer
    from policies.expert import ExpertTrainer

    trainers = {"expert": ExpertTrainer, "q_learning": QLearningTrainer}
    path = Path(policy_dir) / (f"{name}.json" if trainer == "q_learning"
                               else f"{name}_{trainer}.json")
    if path.is_file():
        policy = FSMPolicy.load(path, wl.vocab)
        info: dict[str, Any] = {"path": str(path), "trained": False}
        print(f"{name}: loaded FSM policy {path}")
    else:
        hp = fsm_hparams(max_episodes, trainer=trainer)
        log(f"{name}: training the FSM policy ({trainer}) ...")
        train = graph_set(wl, "train", BATCH_SIZE, 4, shuffle_seed=0)
        val = graph_set(wl, "train", BATCH_SIZE, 2)
        t0 = time.perf_counter()
        result = trainers[trainer](**hp).fit(train, val, metadata={"workload": name, "seed": 0})
        seconds = time.perf_counter() - t0
        policy = result.policy
        policy.save(path)
        info = {"path": str(path), "trained": True, "train_seconds": seconds,
                "episodes": result.episodes, "hparams": hp}
        print(f"{name}: trained FSM policy in {seconds:.1f}s ({result.episodes} episodes), "
              f"saved to {path}")
    info.update(states=policy.num_states, fallback=policy.fallback_name)
    return policy, info
