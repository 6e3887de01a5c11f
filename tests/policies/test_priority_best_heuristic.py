"""The priority trainer is never worse than the best single heuristic on its training and
validation graphs: where another heuristic (type-wise greedy on the character tagger) beats
every weight vector the search finds, the heuristic alone is deployed and the reason saved."""

from __future__ import annotations

import pytest

from edbatch.schedule import lower_bound
from edbatch.workloads import make_workload
from policies.fsm import FSMPolicy
from policies.priority import PriorityPolicy
from policies.priority_train import PriorityTrainer
from policies.table_search import table_batches


@pytest.fixture(scope="module")
def tagger() -> tuple[list, list]:
    wl = make_workload("bilstm_char_tagger")
    graphs = list(wl.batches("train", 16, limit=3))
    return graphs[:2], graphs[2:]


def _batches(policy, graphs) -> int:  # type: ignore[no-untyped-def]
    sched = policy.scheduler("p")
    return sum(sched(g).num_batches for g in graphs)


def test_a_better_heuristic_than_the_weights_is_deployed_alone(tagger) -> None:  # type: ignore[no-untyped-def]
    train, val = tagger
    everything = [*train, *val]
    tw, cp = (table_batches({}, everything, "hints", n) for n in ("typewise_greedy",
                                                                   "critical_path"))
    assert tw < cp  # the premise: critical path (the search's start) is not the best here
    weights = PriorityTrainer(3, 8, 3, seed=0, best_heuristic=False).fit(train, val).policy
    assert isinstance(weights, PriorityPolicy)
    assert _batches(weights, everything) > tw  # the weights alone lose to type-wise greedy
    res = PriorityTrainer(3, 8, 3, seed=0, best_heuristic=True).fit(train, val)
    assert isinstance(res.policy, FSMPolicy) and res.policy.num_states == 0
    assert res.policy.fallback_name == "typewise_greedy"
    assert _batches(res.policy, everything) == tw
    meta = res.policy.metadata
    assert "typewise_greedy, the best single heuristic" in meta["learned_nothing"]
    assert meta["best_heuristic"]["name"] == "typewise_greedy"
    lb = sum(lower_bound(g) for g in val)
    assert res.best_ratio == pytest.approx(table_batches({}, val, "hints", "typewise_greedy") / lb)


def test_where_critical_path_is_best_the_weights_stay() -> None:
    wl = make_workload("lattice_lstm")
    graphs = list(wl.batches("train", 8, limit=3))
    res = PriorityTrainer(2, 6, 2, seed=0, best_heuristic=True).fit(graphs[:2], graphs[2:])
    assert isinstance(res.policy, PriorityPolicy)
    assert "best_heuristic" not in res.policy.metadata


def test_experiments_train_defaults_to_the_guarded_priority_trainer() -> None:
    """`python -m experiments.train` with no trainer= runs this trainer with the check on."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    import experiments  # noqa: F401 - registers the schemas

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train")
    assert cfg.trainer._target_ == "policies.priority_train.PriorityTrainer"
    assert cfg.trainer.best_heuristic is True
