"""Expert iteration (policies/expert.py) and its graph-size-free ``expert`` state key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edbatch.schedule import CriticalPathPolicy, Frontier, run_policy
from edbatch.workloads import make_workload
from envs.encoding import expert_code, expert_key, expert_key_code
from policies import FSMPolicy
from policies.expert import ExpertConfig, ExpertTrainer, fit_table, train_expert
from policies.resample import _parts, resample_graphs

FAST = ExpertConfig(rounds=2, budget=20_000, fallback="critical_path", max_prune_evals=10,
                    augment=2, search_sweeps=0)  # the teacher path alone
ONE = replace(FAST, rounds=1)


def _ops(schedule) -> list[tuple[int, list[int]]]:
    return [(b.op_id, b.node_ids.tolist()) for b in schedule.batches]


def test_expert_key_and_its_numba_code_agree() -> None:
    rng = np.random.default_rng(0)
    seen = {}
    for _ in range(500):
        k = int(rng.integers(1, 9))
        ready = rng.integers(0, 4, size=k) * (rng.random(k) < 0.6)
        tw = ready + rng.integers(0, 3, size=k)
        height = rng.integers(0, 6, size=k)
        key = expert_key(ready, tw, height)
        code = int(expert_code(ready.astype(np.int64), tw.astype(np.int64),
                               height.astype(np.int64)))
        assert expert_key_code(key) == code
        assert seen.setdefault((k, code), key) == key  # the code is a bijection of the key
    # the gap to the highest ready node is capped at 2, complete means |F| == T
    assert expert_key(np.array([2, 0, 1]), np.array([2, 5, 3]), np.array([9, 0, 4])) == (1, 16)


def test_expert_key_of_a_frontier_matches_the_arrays(lattice) -> None:
    g = lattice[0][0]
    f = Frontier(g, typewise=True)
    f.pop(f.view().ready_ops[0])
    view = f.view()
    from edbatch.schedule.bounds import height_list
    h = height_list(g)
    heights = np.array([view.max_over_ready(a, h) if view.count(a) else 0
                        for a in range(len(view.mask))])
    from envs.encoding import encode_state
    assert encode_state(view, "expert") == expert_key(view.ready_count, view.typewise_count,
                                                      heights)


def test_learned_table_is_non_empty_deterministic_and_never_worse_on_validation(
        lattice, tmp_path: Path) -> None:
    train, _ = lattice
    val = train  # the dump protocol selects on its training graph(s), as here
    a = train_expert(train, ONE, val_graphs=val)
    b = ExpertTrainer(**{**ONE.__dict__}).fit(train, val)
    assert a.policy.num_states > 0
    assert json.dumps(a.policy.to_json()["table"]) == json.dumps(b.policy.to_json()["table"])
    fallback_only = FSMPolicy({}, "expert", a.policy.op_names, "critical_path")
    batches = sum(run_policy(g, a.policy).num_batches for g in val)
    assert batches <= sum(run_policy(g, fallback_only).num_batches for g in val)
    assert a.policy.metadata["fallback_ratio"] >= a.best_ratio
    assert [r["episode"] for r in a.history] == [1]


def test_learned_table_is_non_empty_on_a_shipped_dump_proxy() -> None:
    wl = make_workload("dumps", folder="bilstm_B1")
    graphs = [wl.minibatch("all", list(range(i, i + 5))) for i in (0, 5)]
    res = train_expert(graphs[:1], ONE, val_graphs=graphs[:1])
    assert res.policy.num_states > 0
    assert res.history[-1]["train/samples"] > 0


def test_artifact_round_trip_with_the_expert_key(lattice, tmp_path: Path) -> None:
    train, val = lattice
    policy = train_expert(train, ONE, val_graphs=train).policy
    assert policy.num_states > 0
    loaded = FSMPolicy.load(policy.save(tmp_path / "p.json"), train[0].vocab)
    assert loaded.encoding == "expert" and loaded.table == policy.table
    assert all(isinstance(k, tuple) for k in loaded.table)
    for g in val:
        assert _ops(run_policy(g, loaded)) == _ops(run_policy(g, policy))


def test_unseen_states_go_to_the_fallback(lattice) -> None:
    g = lattice[1][0]
    unseen = {(6 * 99,): 0}  # a key no lattice frontier produces
    policy = FSMPolicy(unseen, "expert", g.vocab.names, "critical_path")
    assert _ops(run_policy(g, policy)) == _ops(run_policy(g, CriticalPathPolicy()))
    assert policy.hits == 0 and policy.misses > 0


def test_fit_table_keeps_confident_majorities_only() -> None:
    from collections import Counter
    votes = {(1,): Counter({0: 3, 1: 1}), (2,): Counter({0: 1, 1: 1}), (3,): Counter({2: 1})}
    assert fit_table(votes, min_count=1, confidence=0.5) == {(1,): 0, (2,): 0, (3,): 2}
    assert fit_table(votes, min_count=2, confidence=0.6) == {(1,): 0}


def test_resampled_graphs_are_unions_of_the_training_graphs_parts(lattice) -> None:
    g = lattice[0][0]
    parts = _parts(g)
    assert len(parts) == 8  # the mini-batch's instances (the loss sum is dropped)
    sizes = {len(p) for p in parts}
    a = resample_graphs([g], 2, np.random.default_rng(0))
    b = resample_graphs([g], 2, np.random.default_rng(0))
    assert len(a) == 2 and all(x.vocab == g.vocab for x in a)
    assert [x.op_ids.tolist() for x in a] == [x.op_ids.tolist() for x in b]  # seeded
    for x in a:
        assert {len(p) for p in _parts(x)} <= sizes and len(_parts(x)) == 8
        run_policy(x, CriticalPathPolicy())  # a valid graph the frontier can schedule


def test_parallel_teacher_gives_the_same_votes(lattice) -> None:
    from edbatch.schedule import CriticalPathPolicy as CP
    from policies.expert import teacher_samples
    graphs = [*lattice[0], *lattice[1]]
    cfg = replace(ONE, budget=2_000, exact_max_nodes=0)
    one: dict = {}  # type: ignore[type-arg]
    two: dict = {}  # type: ignore[type-arg]
    a = teacher_samples(graphs, [CP], cfg, one)
    b = teacher_samples(graphs, [CP], replace(cfg, n_jobs=2), two)
    assert a == b and one == two and a["samples"] > 0


@pytest.mark.slow  # an end-to-end run of 20-40 s: the slow suite
def test_search_teacher_labels_at_most_the_rollouts_batches(lattice) -> None:
    """``teacher=search`` improves the rollout's schedule by the sequence search: never more
    batches than the rollout teacher, on every graph, and still an MDP trajectory (its votes
    replay)."""
    from edbatch.schedule import CriticalPathPolicy as CP
    from policies.expert import _teach, teacher_samples
    graphs = [*lattice[0], *lattice[1]]
    cfg = replace(ONE, budget=2_000, exact_max_nodes=0)
    for g in graphs:
        rolled, _ = _teach(g, [CP], cfg)
        searched, _ = _teach(g, [CP], replace(cfg, teacher="search"))
        assert searched.num_batches <= rolled.num_batches
    votes: dict = {}  # type: ignore[type-arg]
    stats = teacher_samples(graphs, [CP], replace(cfg, teacher="search"), votes)
    assert stats["samples"] > 0 and sum(sum(c.values()) for c in votes.values()) == \
        stats["samples"]


def test_unknown_teacher_is_refused_with_the_key_and_fix() -> None:
    import pytest

    from edbatch.errors import ConfigError
    with pytest.raises(ConfigError, match=r"trainer.teacher='oracle'.*trainer.teacher=search"):
        ExpertConfig(teacher="oracle")
