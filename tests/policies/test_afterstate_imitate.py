"""Imitating the critical-path rollout teacher with the afterstate features: the labels are
the teacher's (checked against rollouts run here), the fit is deterministic and never worse
than critical path on its graphs, the trainer starts its search from it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edbatch.schedule import make_scheduler
from edbatch.schedule._compiled_priority import NUM_PRIORITY_FEATURES, critical_path_weights
from edbatch.schedule._compiled_priority_q import priority_q_base
from edbatch.workloads.synthetic import random_lattices
from policies.afterstate import (
    AFTER_FEATURES,
    afterstate_inputs,
    afterstate_start,
    population_afterstate,
)
from policies.afterstate_imitate import imitate, label_critical_path
from policies.afterstate_train import AfterstateTrainer
from policies.priority import FEATURES, graph_inputs


@pytest.fixture(scope="module")
def graphs() -> list:
    rng = np.random.default_rng(11)
    return [random_lattices(rng, 6, 16, 4) for _ in range(4)]


def test_labels_are_the_rollout_teachers_choices(graphs: list) -> None:
    x, seg, target, n = label_critical_path(graphs)
    assert n > 0 and x.shape == (len(seg), len(FEATURES) + len(AFTER_FEATURES))
    assert seg.max() + 1 == n
    counts = np.bincount(seg)
    hits = np.bincount(seg, weights=target)
    assert (counts >= 2).all() and (hits >= 1).all() and (hits < counts).all()
    # the first graph's labels again from its rollout values, decision by decision
    cp = critical_path_weights(0)
    gi = graph_inputs(graphs[0])
    rows, _, ptr, q, base = priority_q_base(*gi, cp, 0, cp, 0, len(gi[0]) * 8 + 64)  # type: ignore[call-arg]
    assert base == make_scheduler("critical_path")(graphs[0]).num_batches
    want = [(rows[lo:hi], q[lo:hi] == q[lo:hi].min()) for lo, hi in itertools.pairwise(ptr)
            if hi - lo >= 2 and q[lo:hi].min() < q[lo:hi].max()]
    first = seg < len(want)
    np.testing.assert_array_equal(x[first, :NUM_PRIORITY_FEATURES],
                                  np.concatenate([r for r, _ in want]))
    np.testing.assert_array_equal(target[first], np.concatenate([t for _, t in want]))


def test_imitation_is_deterministic_and_never_worse_than_critical_path(graphs: list) -> None:
    w, batches, rec = imitate(graphs, steps=(30, 200))
    w2, batches2, _ = imitate(graphs, steps=(30, 200))
    assert np.array_equal(w, w2) and batches == batches2
    inputs = [afterstate_inputs(g) for g in graphs]
    assert batches == int(population_afterstate(inputs, w[None]).sum())
    assert batches <= rec["critical_path_batches"] == int(
        population_afterstate(inputs, afterstate_start()[None]).sum())
    assert rec["contested_decisions"] > 0 and len(rec["candidates"]) == 2
    if batches < rec["critical_path_batches"]:
        assert rec["steps_kept"] in (30, 200) and np.any(w[NUM_PRIORITY_FEATURES:] != 0)
    else:
        assert np.array_equal(w, afterstate_start())


def test_bad_steps_name_the_value(graphs: list) -> None:
    with pytest.raises(ValueError, match=r"steps must be positive.*\[0, 5\]"):
        imitate(graphs[:1], steps=(0, 5))


def test_trainer_starts_from_the_imitation(graphs: list) -> None:
    w, batches, _ = imitate(graphs[:3], steps=(30, 200))
    p = AfterstateTrainer(iterations=0, population=2, elite=1, imitate=True,
                          imitate_steps=(30, 200)).fit(
        graphs[:3], graphs[3:]).policy
    m = p.metadata
    assert m["learner"] == "imitation, then cross-entropy method"
    assert m["imitation"]["critical_path_batches"] == m["train_fallback_batches"]
    assert m["train_batches"] == batches
    if p.learned:
        assert np.array_equal(p.weights, w)
    else:
        assert np.array_equal(p.weights, afterstate_start())


def test_lean_imitation_fits_only_its_columns(graphs: list, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from edbatch.schedule import run_policy
    from edbatch.schedule._compiled_afterstate import BASE_AFTER
    from edbatch.schedule._compiled_priority import FIRST_CONTEXT
    from policies.afterstate import AfterstatePolicy
    from policies.afterstate_imitate import lean_mask

    mask = lean_mask(15)
    assert mask[:15].all() and not mask[15:NUM_PRIORITY_FEATURES].any()
    base = NUM_PRIORITY_FEATURES + BASE_AFTER  # the extra afterstate columns only if asked
    assert mask[NUM_PRIORITY_FEATURES:base].all() and not mask[base:].any()
    assert lean_mask(None)[:base].all() and not lean_mask(None)[base:].any()
    assert lean_mask(None, ["all"]).all() and lean_mask(15, ["all"])[base:].all()
    w, batches, rec = imitate(graphs, steps=(30, 200), priority_features=15)
    assert rec["priority_features"] == 15
    assert not np.any(w[15:NUM_PRIORITY_FEATURES])  # no release, far or context weight
    assert not np.any(w[FIRST_CONTEXT:NUM_PRIORITY_FEATURES])
    inputs = [afterstate_inputs(g) for g in graphs]
    assert batches == int(population_afterstate(inputs, w[None]).sum())
    assert batches <= rec["critical_path_batches"]
    # the artifact round trip, and the compiled run against the Python twin
    p = AfterstatePolicy(w)
    q = AfterstatePolicy.load(p.save(tmp_path / "lean.json"))
    assert np.array_equal(q.weights, w)
    for g in graphs[:2]:
        s, t = q(g), run_policy(g, q.twin())
        assert s.num_batches == t.num_batches
        assert [b.op_id for b in s.batches] == [b.op_id for b in t.batches]


def test_lean_bad_feature_count_names_the_value(graphs: list) -> None:
    with pytest.raises(ValueError, match=r"priority_features must be .* got 0"):
        imitate(graphs[:1], steps=(5,), priority_features=0)
    with pytest.raises(ValueError, match=r"got 99"):
        AfterstateTrainer(iterations=0, population=2, elite=1, imitate=True,
                          imitate_priority_features=99).fit(graphs[:1], graphs[1:2])
