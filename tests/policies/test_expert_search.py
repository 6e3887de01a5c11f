"""The table search stage of the expert trainer and the ``rich`` key with its compiled twin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edbatch.schedule import CriticalPathPolicy, Frontier, run_policy
from edbatch.schedule._compiled_keys import key_expert, key_rich
from edbatch.schedule.bounds import height_list
from edbatch.workloads import make_workload
from envs.encoding import encode_state, expert_key, rich_key
from policies import FSMPolicy
from policies.expert import ExpertConfig, resample_graphs, train_expert
from policies.table_search import search_table, table_batches, visited_states

SEARCH = ExpertConfig(rounds=0, augment=4, fallback="critical_path", search_sweeps=2,
                      search_max_evals=60)



def test_rich_and_expert_keys_agree_with_their_compiled_twins(compiled_key) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    for _ in range(400):
        k = int(rng.integers(1, 9))
        ready = rng.integers(0, 6, size=k) * (rng.random(k) < 0.6)
        tw = ready + rng.integers(0, 6, size=k)
        height = rng.integers(0, 25, size=k)
        assert compiled_key(key_rich, ready, tw, height) == rich_key(ready, tw, height)
        assert compiled_key(key_expert, ready, tw, height) == expert_key(ready, tw, height)


def test_rich_key_features() -> None:
    # type 0 on the critical path, half ready; type 2 is 12 below (class 3) and complete
    assert rich_key(np.array([2, 0, 3]), np.array([4, 1, 3]), np.array([20, 0, 8])) == (
        0 + 4 * 0 + 2 * 0 + 1, 2 * 16 + 4 * 3 + 2 * 1 + 1)
    # gap classes: 0 | 1-2 | 3-9 | 10+; less than half ready sets no bit
    keys = rich_key(np.ones(5, int), np.full(5, 3), np.array([20, 19, 18, 17, 10]))
    assert [x % 16 // 4 for x in keys] == [0, 1, 1, 2, 3]
    assert all(x % 4 == 0 for x in keys)


def test_rich_key_of_a_frontier_matches_the_arrays(lattice) -> None:
    g = lattice[0][0]
    f = Frontier(g, typewise=True)
    h = height_list(g)
    for _ in range(5):
        view = f.view()
        heights = np.array([view.max_over_ready(a, h) if view.count(a) else 0
                            for a in range(len(view.mask))])
        counts = np.where(view.mask > 0, view.ready_count, 0)
        assert encode_state(view, "rich") == rich_key(counts, view.typewise_count, heights)
        f.pop(view.ready_ops[-1])


def test_search_lowers_training_batches_and_keeps_check_graphs(lattice) -> None:
    train, _ = lattice
    check = resample_graphs(train, 2, np.random.default_rng(3))
    fb_train = table_batches({}, train, "expert", "critical_path")
    fb_check = table_batches({}, check, "expert", "critical_path")
    table, st = search_table({}, train, check, "expert", "critical_path", sweeps=2,
                             max_evals=80)
    assert st.evaluations <= 80
    assert st.train_batches == table_batches(table, train, "expert", "critical_path")
    assert st.check_batches <= fb_check
    if st.changes:
        assert table and st.train_batches < fb_train
    again, _ = search_table({}, train, check, "expert", "critical_path", sweeps=2,
                            max_evals=80)
    assert again == table  # deterministic


def test_visited_states_count_every_decision(lattice) -> None:
    g = lattice[0][0]
    seen = visited_states({}, [g], "expert", "critical_path")
    s = run_policy(g, CriticalPathPolicy())
    assert sum(seen.values()) == sum(not b.forced for b in s.batches)


def test_search_trainer_beats_or_ties_its_fallback_and_is_deterministic(lattice) -> None:
    train, _ = lattice
    a = train_expert(train, SEARCH, val_graphs=train)
    b = train_expert(train, SEARCH, val_graphs=train)
    assert json.dumps(a.policy.to_json()["table"]) == json.dumps(b.policy.to_json()["table"])
    assert a.best_ratio <= a.policy.metadata["fallback_ratio"]
    assert a.history[-1]["train/search_evaluations"] > 0
    assert a.policy.num_states > 0


def test_search_table_round_trips_with_the_rich_key(lattice, tmp_path: Path) -> None:
    from dataclasses import replace
    train, val = lattice
    policy = train_expert(train, replace(SEARCH, encoding="rich"), val_graphs=train).policy
    loaded = FSMPolicy.load(policy.save(tmp_path / "p.json"), train[0].vocab)
    assert loaded.encoding == "rich" and loaded.table == policy.table
    for g in val:
        ops = [b.op_id for b in policy.scheduler()(g).batches]
        assert [b.op_id for b in loaded.scheduler(backend="python")(g).batches] == ops


def test_completed_table_keeps_the_schedules_and_answers_more(lattice) -> None:
    from policies.table_search import complete_table
    train, val = lattice
    table, _ = search_table({}, train, [], "expert", "critical_path", sweeps=1,
                            max_evals=30)
    full = complete_table(table, train, "expert", "critical_path", min_visits=1)
    assert set(table) <= set(full) and len(full) > len(table)
    assert all(full[k] == a for k, a in table.items())
    before = FSMPolicy(table, "expert", train[0].vocab.names, "critical_path")
    after = FSMPolicy(full, "expert", train[0].vocab.names, "critical_path")
    for g in train:  # same decisions on the graphs it was completed on
        assert ([b.op_id for b in run_policy(g, after).batches]
                == [b.op_id for b in run_policy(g, before).batches])
    for g in val:
        run_policy(g, before)
        run_policy(g, after)
    assert after.hit_rate > before.hit_rate


def test_search_stops_at_the_lower_bound() -> None:
    wl = make_workload("tree_lstm")
    g = next(iter(wl.batches("train", 8, limit=1)))
    from edbatch.schedule import lower_bound
    assert table_batches({}, [g], "expert", "critical_path") == lower_bound(g)
    table, st = search_table({}, [g], [], "expert", "critical_path")
    assert table == {} and st.evaluations == 0


def test_throughput_benchmark_settings_build_both_trainers() -> None:
    from benchmarks import throughput as tp
    from policies import QLearningTrainer
    from policies.expert import ExpertTrainer
    hp = tp.fsm_hparams(2, trainer="expert")
    cfg = ExpertTrainer(**hp).config
    assert cfg.augment == 8 and cfg.lookahead == "none" and cfg.encoding == "expert"
    assert QLearningTrainer(**tp.fsm_hparams(2, trainer="q_learning")) is not None
    assert tp.build_parser().parse_args([]).trainer == "expert"
