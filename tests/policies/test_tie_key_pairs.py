"""The ``tie`` key (``expert`` plus which critical type critical path picks) equals its
compiled twin, round trips as an artifact, falls back on unseen states; pair moves after the
table search are deterministic and never make the training or check graphs worse."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from edbatch.schedule import CriticalPathPolicy, Frontier, run_policy
from edbatch.schedule._compiled_keys import key_tie
from edbatch.schedule.bounds import height_list
from envs.encoding import encode_state, expert_key, key_actions, tie_key
from policies import FSMPolicy
from policies.expert import ExpertConfig, train_expert
from policies.pair_search import pair_search
from policies.table_search import search_table, table_batches, trace

SEARCH = ExpertConfig(rounds=0, augment=4, fallback="critical_path", search_sweeps=2,
                      search_max_evals=60)


def test_tie_key_agrees_with_its_compiled_twin_on_random_arrays(compiled_key) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    ties = 0
    for _ in range(600):
        k = int(rng.integers(1, 9))
        ready = rng.integers(0, 6, size=k) * (rng.random(k) < 0.7)
        tw = ready + rng.integers(0, 6, size=k)
        height = rng.integers(0, 4, size=k)  # small heights: many ties at the top
        key = tie_key(ready, tw, height)
        assert compiled_key(key_tie, ready, tw, height) == key
        ties += sum(1 for x in key if x % 8 in (2, 3))
    assert ties > 50  # the "other critical type" tier was exercised


def test_tie_key_features_and_relation_to_expert() -> None:
    # types 0 and 1 at the top (height 30): critical path takes the fuller one, 1 (3/5 > 2/5);
    # type 2 complete one below; type 3 incomplete 5 below
    ready, tw, h = np.array([2, 3, 4, 1]), np.array([5, 5, 4, 3]), np.array([30, 30, 29, 25])
    assert tie_key(ready, tw, h) == (2, 8, 16 + 5, 24 + 6)
    # equal ratios: the smaller id is critical path's pick
    assert tie_key(np.array([2, 2]), np.array([4, 4]), np.array([7, 7])) == (0, 8 + 2)
    # with one critical type the key is the expert key, re-based (8 features per type)
    rng = np.random.default_rng(4)
    for _ in range(200):
        k = int(rng.integers(1, 7))
        ready = rng.integers(1, 6, size=k)
        tw = ready + rng.integers(0, 3, size=k)
        h = rng.permutation(40)[:k]  # distinct heights: no ties
        exp = expert_key(ready, tw, h)
        tie = tie_key(ready, tw, h)
        assert [x // 8 for x in tie] == [x // 6 for x in exp]
        assert [x % 8 - (2 if x % 8 >= 2 else 0) for x in tie] == [x % 6 for x in exp]


def test_tie_key_on_real_frontiers_names_critical_paths_pick(lattice, compiled_key) -> None:  # type: ignore[no-untyped-def]
    from edbatch.schedule.policy import drive
    g = lattice[0][0]
    h = height_list(g)
    cp = CriticalPathPolicy()
    steps = [0]

    def choose(f: Frontier) -> int:
        view = f.view()
        heights = np.array([view.max_over_ready(a, h) if view.count(a) else 0
                            for a in range(len(view.mask))])
        counts = np.where(view.mask > 0, view.ready_count, 0)
        key = encode_state(view, "tie")
        assert key == tie_key(counts, view.typewise_count, heights)
        assert key == compiled_key(key_tie, counts, view.typewise_count, heights)
        assert [x // 8 for x in key if x % 8 < 2] == [cp.choose(view)]
        assert key_actions(key, "tie") == view.ready_ops
        steps[0] += 1
        return view.ready_ops[steps[0] % len(view.ready_ops)]  # not critical path's path

    drive(Frontier(g, typewise=True), choose)
    assert steps[0] > 10


def test_tie_trace_equals_the_python_frontier(lattice) -> None:
    from policies.table_search import policy_votes
    for g in lattice[1]:
        table = {key: sorted(set(key_actions(key, "tie")))[0]
                 for key in sorted(trace({}, g, "tie", "critical_path")[0])[::2]}
        policy = FSMPolicy(table, "tie", g.vocab.names, "critical_path")
        seen, nb = trace(table, g, "tie", "critical_path")
        assert seen == policy_votes(policy, [g], "tie")
        assert nb == table_batches(table, [g], "tie", "critical_path")


def test_tie_policy_round_trips_and_falls_back_on_unseen_states(lattice, tmp_path: Path) -> None:
    train, val = lattice
    policy = train_expert(train, replace(SEARCH, encoding="tie"), val_graphs=train).policy
    assert policy.encoding == "tie" and policy.num_states > 0
    loaded = FSMPolicy.load(policy.save(tmp_path / "p.json"), train[0].vocab)
    assert loaded.encoding == "tie" and loaded.table == policy.table
    for g in val:
        ops = [b.op_id for b in policy.scheduler()(g).batches]
        assert [b.op_id for b in loaded.scheduler(backend="python")(g).batches] == ops
    # an unseen state: the fallback (critical path) decides
    empty = FSMPolicy({(999,): 0}, "tie", train[0].vocab.names, "critical_path")
    g = val[0]
    assert ([b.op_id for b in run_policy(g, empty).batches]
            == [b.op_id for b in run_policy(g, CriticalPathPolicy()).batches])
    assert empty.hits == 0 and empty.misses > 0


def test_pair_search_is_deterministic_and_never_worse(lattice) -> None:
    train, val = lattice
    table, _ = search_table({}, train, val, "expert", "critical_path", sweeps=1, max_evals=40)
    before_t = table_batches(table, train, "expert", "critical_path")
    before_c = table_batches(table, val, "expert", "critical_path")
    a, st = pair_search(table, train, val, "expert", "critical_path", top=5, max_evals=80)
    b, _ = pair_search(table, train, val, "expert", "critical_path", top=5, max_evals=80)
    assert json.dumps(sorted(a.items())) == json.dumps(sorted(b.items()))
    assert 0 < st.evaluations <= 80
    assert st.train_batches == table_batches(a, train, "expert", "critical_path") <= before_t
    assert st.check_batches == table_batches(a, val, "expert", "critical_path") <= before_c
    assert (st.train_batches < before_t) == (st.changes > 0)
    same, none = pair_search(table, train, val, "expert", "critical_path", top=0)
    assert same == table and none.evaluations == 0


def test_pair_moves_in_the_trainer(lattice) -> None:
    train, _ = lattice
    res = train_expert(train, replace(SEARCH, search_pairs=4, search_pair_evals=30),
                       val_graphs=train)
    row = res.history[-1]
    assert 0 < row["train/pair_evaluations"] <= 30
    assert res.best_ratio <= res.policy.metadata["fallback_ratio"]
