"""The afterstate priority policy: compiled rows and schedules vs the Python twin, the
tight feature's bound identity, critical path's weights, the CEM's guard, the artifact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import PolicyFileError
from edbatch.schedule import lower_bound, make_scheduler, run_policy
from edbatch.schedule._compiled_afterstate import afterstate_trace
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_binary_trees, random_lattices
from policies.afterstate import (
    AFTER_FEATURES,
    AfterstatePolicy,
    AfterstateTwin,
    afterstate_inputs,
    afterstate_start,
)
from policies.afterstate_train import AfterstateTrainer
from policies.priority import FEATURES
from tests.policies.conftest import same_schedule


@pytest.fixture(scope="module")
def graphs() -> list:
    """Real mini-batches (module networks: many op types; lattices, whose loss has
    thousands of operands) and random trees."""
    out = list(make_workload("module_net", granularity="cell").batches("test", 12, limit=1))
    out += list(make_workload("lattice_lstm").batches("train", 6, limit=1))
    out.append(random_binary_trees(np.random.default_rng(0), 6, 12))
    return out


def _weights(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return afterstate_start() + rng.normal(0.0, 0.7, len(afterstate_start()))


def test_critical_path_weights_are_critical_path(graphs: list) -> None:
    p, cp = AfterstatePolicy(afterstate_start(), learned=False), make_scheduler("critical_path")
    for g in graphs:
        assert same_schedule(p(g), cp(g))
    p.count_hits(graphs)
    assert p.hits == 0 and p.misses > 0 and p.num_states == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_equals_python_twin(graphs: list, seed: int) -> None:
    p, cp = AfterstatePolicy(_weights(seed)), make_scheduler("critical_path")
    differs = 0
    for g in graphs:
        s = p(g)
        assert same_schedule(s, run_policy(g, p.twin()))
        differs += s.num_batches != cp(g).num_batches
    p.count_hits(graphs)
    assert p.hits > 0 and differs > 0  # the afterstate weights really change choices


class _Recorder:
    """The twin, keeping every decision's (op id, row)."""

    needs_typewise = True

    def __init__(self, twin: AfterstateTwin) -> None:
        self.twin, self.seen = twin, []  # type: ignore[var-annotated]

    def choose(self, view):  # type: ignore[no-untyped-def]
        ready, rows = self.twin.rows(view)
        self.seen.extend(zip(ready, rows, strict=True))
        return self.twin.choose(view)


def test_compiled_rows_equal_the_twins(graphs: list) -> None:
    w = _weights(3)
    for g in graphs:
        rows, ids = afterstate_trace(*afterstate_inputs(g), w, 100_000)  # type: ignore[call-arg]
        rec = _Recorder(AfterstatePolicy(w).twin())
        run_policy(g, rec)
        seen = rec.seen
        assert len(seen) == len(rows) > 0
        assert [a for a, _ in seen] == ids.tolist()
        np.testing.assert_array_equal(np.array([r for _, r in seen]), rows)
        assert rows[:, len(FEATURES):].any()


def test_batches_are_the_bound_plus_the_decisions_that_were_not_tight(graphs: list) -> None:
    """The module doc's identity: a decision lowers the remaining bound by one iff its type
    is tight, so batches = LB + non-tight decisions (critical path's choice: ``is_cp``)."""
    tight, is_cp = len(FEATURES), FEATURES.index("is_cp")
    for g in graphs:
        rows, _ = afterstate_trace(*afterstate_inputs(g), afterstate_start(),  # type: ignore[call-arg]
                                   100_000)
        chosen = rows[rows[:, is_cp] == 1.0]
        slack = int((chosen[:, tight] == 0.0).sum())
        assert make_scheduler("critical_path")(g).num_batches == lower_bound(g) + slack


def test_training_is_guarded_and_deterministic() -> None:
    rng = np.random.default_rng(7)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    fit = AfterstateTrainer(iterations=4, population=8, elite=3, seed=1).fit
    res, again = fit(train, val), fit(train, val)
    p, cp = res.policy, make_scheduler("critical_path")
    assert np.array_equal(p.weights, again.policy.weights)
    val_new = sum(p(g).num_batches for g in val)
    assert val_new <= sum(cp(g).num_batches for g in val)
    assert res.best_ratio == pytest.approx(val_new / sum(lower_bound(g) for g in val))
    m = p.metadata
    assert m["lookahead"] == "one step (afterstate)" and m["after_features"] == list(
        AFTER_FEATURES)
    assert p.learned == (m["train_batches"] < m["train_fallback_batches"])


def test_no_search_keeps_critical_path_and_says_why() -> None:
    g = [random_lattices(np.random.default_rng(1), 4, 8, 3)]
    p = AfterstateTrainer(iterations=0, population=2, elite=1).fit(g, g).policy
    assert not p.learned and "no weights beat critical path" in p.metadata["learned_nothing"]
    assert np.array_equal(p.weights, afterstate_start())


def test_artifact_round_trip(tmp_path: Path, graphs: list) -> None:
    p = AfterstatePolicy(_weights(4), metadata={"seed": 4})
    q = AfterstatePolicy.load(p.save(tmp_path / "a.json"))
    assert np.array_equal(q.weights, p.weights) and q.metadata == {"seed": 4} and q.learned
    assert same_schedule(q(graphs[0]), p(graphs[0]))


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: "not json", "not a readable JSON"),
    (lambda d: {**d, "format": "edbatch.priority"}, "format 'edbatch.priority'"),
    (lambda d: {**d, "version": 9}, "version 9"),
    (lambda d: {**d, "after_features": ["tight"]}, "afterstate features"),
    (lambda d: {**d, "weights": d["weights"][:-1]}, "need 43 finite weights"),
    (lambda d: {**d, "weights": [None] * 43}, "need 43 finite weights"),
    (lambda d: {**d, "weights": [True] * 43}, "need 43 finite weights"),
    (lambda d: {**d, "metadata": True}, "metadata is True, not an object"),
    (lambda d: {**d, "learned": "yes"}, "learned is 'yes', not true or false"),
])
def test_bad_file_names_the_problem(tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    doc = edit(AfterstatePolicy(afterstate_start()).to_json())
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(PolicyFileError, match=match) as err:
        AfterstatePolicy.load(path)
    assert str(path) in str(err.value) and "Fix:" in str(err.value)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="need 43 finite weights"):
        AfterstatePolicy(np.zeros(3))
