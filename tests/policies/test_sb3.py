"""Deep-RL baselines: train through the env, act only on allowed actions, distill to an FSM."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

from edbatch.errors import PolicyFileError
from edbatch.schedule import run_policy
from edbatch.workloads.dumps import DumpWorkload
from edbatch.workloads.synthetic import random_lattices
from policies import FSMPolicy, FSMScheduler
from policies.sb3 import DQNTrainer, MaskablePPOTrainer


@pytest.mark.parametrize("trainer", [MaskablePPOTrainer, DQNTrainer])
def test_sb3_trainer_learns_through_env_and_distills(trainer, tmp_path, monkeypatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3's logger would write
    graphs = DumpWorkload("bilstm_B1").graphs()
    t = trainer(total_timesteps=1500, seed=0)
    result = t.fit(graphs[:2], graphs[2:4])
    assert result.policy.num_states > 0 and result.policy.encoding == "hints"
    for g in graphs[4:6]:
        run_policy(g, t.network).validate(g)  # the net never picks a masked action
        run_policy(g, result.policy).validate(g)
    assert result.history[0]["eval/net_ratio_to_lb"] >= 1.0
    assert list(tmp_path.glob("SB3-*")) == []  # no empty SB3-<time> log folder left behind


def test_fsm_scheduler_checks_vocabulary(tmp_path) -> None:
    g = DumpWorkload("mvrnn_B1").graphs()[1]
    path = FSMPolicy({}, "base", g.vocab.names).save(tmp_path / "p.json")
    FSMScheduler(path)(g).validate(g)
    other = random_lattices(np.random.default_rng(0), 2, 6, 2)
    with pytest.raises(PolicyFileError, match="evaluate the policy on the workload"):
        FSMScheduler(path)(other)
