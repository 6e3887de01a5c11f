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
from experiments.plots import learning_curve_figure
from policies import FSMPolicy, FSMScheduler
from policies.sb3 import DQNTrainer, MaskablePPOTrainer


@pytest.mark.parametrize("trainer", [MaskablePPOTrainer, DQNTrainer])
def test_sb3_trainer_learns_through_env_and_distills(trainer, tmp_path, monkeypatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3's logger would write
    graphs = DumpWorkload("bilstm_B1").graphs()
    t = trainer(total_timesteps=1500, seed=0, eval_points=3)
    rows: list[dict] = []
    result = t.fit(graphs[:2], graphs[2:4], callback=rows.append)
    assert result.policy.num_states > 0 and result.policy.encoding == "hints"
    for g in graphs[4:6]:
        run_policy(g, t.network).validate(g)  # the net never picks a masked action
        run_policy(g, result.policy).validate(g)
    curve = [h for h in result.history if "eval/ratio_to_lb" in h]
    assert len(curve) >= 2 and all(h["eval/ratio_to_lb"] >= 1.0 for h in curve)
    assert [h["timestep"] for h in curve] == sorted({h["timestep"] for h in curve})
    assert curve[-1]["timestep"] == result.timesteps >= 1500  # PPO: whole rollouts of 512
    assert result.episodes == curve[-1]["episode"] > 0  # counted, not 0
    assert result.history[-1]["eval/fsm_ratio_to_lb"] == result.best_ratio
    sent = [r for r in rows if "eval/ratio_to_lb" in r]  # what W&B receives
    assert [r["timestep"] for r in sent] == [h["timestep"] for h in curve]
    assert sum(1 for r in rows if "train/num_batches" in r) == result.episodes
    fig = learning_curve_figure(result.history)  # the PNG's figure is not an empty frame
    line = fig.axes[0].lines[0]
    assert len(line.get_xdata()) == len(curve) >= 2
    level = {ln.get_label(): ln.get_ydata()[0] for ln in fig.axes[0].lines}
    fb_ratio = curve[-1]["eval/fallback_ratio_to_lb"]  # the heuristic's level, as a line
    assert level["heuristic (fallback alone)"] == fb_ratio >= 1.0
    assert level["deployed FSM"] == result.best_ratio  # the distilled FSM, as a star
    assert list(tmp_path.glob("SB3-*")) == []  # no empty SB3-<time> log folder left behind


def test_fsm_scheduler_checks_vocabulary(tmp_path) -> None:
    g = DumpWorkload("mvrnn_B1").graphs()[1]
    path = FSMPolicy({}, "base", g.vocab.names).save(tmp_path / "p.json")
    FSMScheduler(path)(g).validate(g)
    other = random_lattices(np.random.default_rng(0), 2, 6, 2)
    with pytest.raises(PolicyFileError, match="evaluate the policy on the workload"):
        FSMScheduler(path)(other)


@pytest.mark.parametrize("trainer", [MaskablePPOTrainer, DQNTrainer])
def test_guarded_sb3_trainer_takes_no_step_where_the_fallback_meets_the_bound(trainer
                                                                                ) -> None:
    """On trees every heuristic is at the lower bound: the guard could keep no entry, so the
    trainer takes no env step (it ran its 20k timesteps before: 91 s on a 10k-node chain)
    and says why; the guard scores no proposal there."""
    from edbatch.workloads.synthetic import random_binary_trees

    graphs = [random_binary_trees(np.random.default_rng(i), 4, 6) for i in range(3)]
    result = trainer(total_timesteps=1500, seed=0, guard=True).fit(graphs[:2], graphs[2:])
    meta = result.policy.metadata
    assert result.timesteps == 0 and result.policy.num_states == 0
    assert "meets the lower bound on the training graphs" in meta["skipped"]
    assert meta["guard"]["evaluations"] == 0 and meta["guard"]["train_table"] == \
        meta["guard"]["train_lb"]
