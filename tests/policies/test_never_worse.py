"""Every shipped learner config ends no worse than its fallback on its validation graphs.

Each RL/imitation learner of ``conf/trainer`` (with the budgets cut so the test is quick) is
trained on small random lattices; the deployed FSM's own schedules of the validation graphs
(the compiled trace, no lookahead) must need no more batches than its fallback alone. A
learner whose table loses to its fallback on validation (a guard switched off, a distillation
that keeps whatever the network voted) fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hydra.utils import get_class

from edbatch.workloads.synthetic import random_lattices
from policies.table_search import table_batches

CONF = Path(__file__).resolve().parents[2] / "conf" / "trainer"

#: Per learner config: the quick budget that replaces the shipped one.
QUICK: dict[str, dict[str, Any]] = {
    "q_learning": {"max_episodes": 20, "eval_every": 10, "early_stop_ratio": 0.0},
    "maskable_ppo": {"total_timesteps": 256, "n_steps": 128, "batch_size": 64,
                     "warm_start_epochs": 3, "eval_points": 1},
    "frontier_net": {"hidden": 8, "rounds": 2, "epochs": 20,
                     "distill_encodings": ["expert", "tie"]},
}


def _trainer(name: str, seed: int) -> Any:
    hp = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    cls = get_class(hp.pop("_target_"))
    resolved = {"encoding": "hints", "fallback": "auto", "lookahead": "none",
                "reward": "ed_batch"}
    for k, v in list(hp.items()):
        if isinstance(v, str) and v.startswith("${"):
            key = v[2:-1].split(".")[-1]
            if key == "seed":
                hp[k] = seed
            else:
                hp[k] = resolved[key]
    hp.update(QUICK[name])
    return cls(**hp)


@pytest.mark.parametrize("name", sorted(QUICK))
@pytest.mark.parametrize("seed", [1])
def test_learner_ends_no_worse_than_its_fallback_on_validation(name: str, seed: int) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(100 + seed)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    p = _trainer(name, seed).fit(train, val).policy
    assert p.lookahead == "none" or name == "frontier_net"
    fsm = table_batches(p.table, val, p.encoding, p.fallback_name)
    alone = table_batches({}, val, p.encoding, p.fallback_name)
    assert fsm <= alone, f"{name} seed {seed}: {fsm} validation batches, fallback {alone}"
    g = p.metadata["guard"]  # the residual form says what it kept and what it is worth
    assert g["kept"] == p.num_states and g["val_table"] <= g["val_fallback"]
    if not p.metadata.get("config", {}).get("guard_check"):  # no resampled check graphs
        assert g["val_table"] == fsm and g["val_fallback"] == alone
    assert ("learned_nothing" in p.metadata) == (p.num_states == 0)


def test_unguarded_distillation_can_lose_and_the_guard_prevents_it() -> None:
    """The check above can fail: the plain majority vote of a barely trained network is
    worse than critical path on some validation graphs, its guarded form never."""
    from policies.frontier_net import FrontierNetConfig, distill_fsm, train_frontier_net

    torch.set_num_threads(1)
    worse = 0
    for seed in range(3):
        rng = np.random.default_rng(200 + seed)
        train = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
        val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
        net = train_frontier_net(train, FrontierNetConfig(hidden=4, rounds=1, epochs=1,
                                                          seed=seed), val_graphs=val).net
        alone = table_batches({}, val, "expert", "critical_path")
        plain, _ = distill_fsm(net, train, val, ("expert",), guard=False)
        guarded, _ = distill_fsm(net, train, val, ("expert",), guard=True)
        worse += table_batches(plain.table, val, "expert", "critical_path") > alone
        assert table_batches(guarded.table, val, "expert", "critical_path") <= alone
    assert worse >= 1
