"""The extra afterstate columns (two-step, margins): values worked out by hand on a small
graph, every column informative on real graphs, zero weights leave the policy unchanged, the
trainers set them only when asked, old artifacts load with them at 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType, Vocab
from edbatch.schedule import run_policy
from edbatch.schedule._compiled_afterstate import (
    AFTER_FEATURES,
    BASE_AFTER,
    MAX_TWO_STEP_TYPES,
    afterstate_trace,
)
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_lattices
from policies.afterstate import (
    EXTRA_FEATURES,
    MAX_TYPES,
    AfterstatePolicy,
    after_mask,
    afterstate_inputs,
    afterstate_start,
)
from policies.afterstate_imitate import imitate, lean_mask
from policies.afterstate_train import AfterstateTrainer
from policies.priority import FEATURES
from tests.policies.conftest import same_schedule

F = len(FEATURES)


def _hand_graph():  # type: ignore[no-untyped-def]
    """Sources ``s`` then: f-f-f; g-f; g (-> g, -> h-h); g-f-f-f-f (types s f g h = 0 1 2 3)."""
    vocab = Vocab([OpType("s", "lookup", (), (1,)), OpType("f", "tanh", ((1,),), (1,)),
                   OpType("g", "tanh", ((1,),), (1,)), OpType("h", "tanh", ((1,),), (1,))])
    b = GraphBuilder(vocab)

    def chain(v, *names):  # type: ignore[no-untyped-def]
        for n in names:
            v = b.add(n, v)
        return v

    chain(b.add("s"), "f", "f", "f")
    chain(b.add("s"), "g", "f")
    g2 = chain(b.add("s"), "g")
    chain(g2, "g")
    chain(g2, "h", "h")
    chain(b.add("s"), "g", "f", "f", "f", "f")
    return b.build()


def test_extra_columns_by_hand() -> None:
    """After the sources run, f (one ready node, f-chain 3) and g (g-chain 2, and the
    f-chain of 4 through its fourth node, the only h-chain) are ready. f is not tight (g
    holds the longer f-chain) but becomes tight if g runs first (``tight_wait``); g owns f's
    and h's longest chains, leads its own by 2; after either, a follow-up leaves f, g, h all
    tight (``n_tight2`` 3, ``miss2`` 0)."""
    rows, ids = afterstate_trace(*afterstate_inputs(_hand_graph()), afterstate_start(),  # type: ignore[call-arg]
                                 100)
    assert ids[1:3].tolist() == [1, 2]
    x = {n: rows[1:3, F + i].tolist() for i, n in enumerate(AFTER_FEATURES)}
    assert x["tight"] == [0.0, 1.0]
    assert x["owns"] == [0.0, 2 / 4]
    assert x["miss2"] == [0.0, 0.0]
    assert x["n_tight2"] == [3 / 4, 3 / 4]
    assert x["margin"] == [0.0, 2 / 8]
    assert x["tight_wait"] == [1.0, 0.0]


@pytest.fixture(scope="module")
def lattices() -> list:
    return list(make_workload("lattice_lstm").batches("train", 6, limit=2))


def test_every_extra_column_varies_on_lattices(lattices: list) -> None:
    """A column stuck at one value (a broken feature) carries nothing; the compiled rows
    equal the twin's (tests/policies/test_afterstate.py) on these columns too."""
    for i, name in enumerate(EXTRA_FEATURES):
        vals = set()
        for g in lattices:
            rows, _ = afterstate_trace(*afterstate_inputs(g), afterstate_start(), 200_000)  # type: ignore[call-arg]
            vals |= set(rows[:, F + BASE_AFTER + i].tolist())
        assert len(vals) >= 2, name


def test_extra_weights_change_choices_and_zero_ones_are_skipped_exactly(lattices: list
                                                                      ) -> None:
    """Non-zero extra weights override critical path; with them 0 the compiled loop skips
    the extra columns and still schedules as the twin (which computes them)."""
    w = afterstate_start()
    w[F + AFTER_FEATURES.index("miss2")] = -3.0
    p = AfterstatePolicy(w)
    p.count_hits(lattices)
    assert p.hits > 0
    rng = np.random.default_rng(2)
    w = afterstate_start() + rng.normal(0.0, 0.7, len(w))
    w[F + BASE_AFTER:] = 0.0
    q = AfterstatePolicy(w)
    for g in lattices:
        assert same_schedule(q(g), run_policy(g, q.twin()))


def test_masks_set_extra_columns_only_when_asked() -> None:
    assert not after_mask()[BASE_AFTER:].any() and after_mask()[:BASE_AFTER].all()
    assert after_mask(["all"]).all()
    assert after_mask(["miss2"]).tolist().count(True) == BASE_AFTER + 1
    assert lean_mask(15, ["owns"])[F + BASE_AFTER] and not lean_mask(15)[F + BASE_AFTER]
    with pytest.raises(ValueError, match="'nope'"):
        after_mask(["nope"])
    with pytest.raises(ValueError, match="'nope'"):
        AfterstateTrainer(extra_features=["nope"])


def test_imitation_leaves_unasked_extra_weights_at_zero() -> None:
    rng = np.random.default_rng(5)
    graphs = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    w, _, rec = imitate(graphs, steps=(50,))
    assert not w[F + BASE_AFTER:].any() and rec["extra_features"] == []
    w2, _, _ = imitate(graphs, steps=(50,), extra=["all"])
    assert w2[F + BASE_AFTER:].any() or np.array_equal(w2, afterstate_start())


def test_artifact_written_before_the_extra_columns_loads(tmp_path: Path) -> None:
    doc = AfterstatePolicy(afterstate_start()).to_json()
    doc["after_features"] = list(AFTER_FEATURES[:BASE_AFTER])
    doc["weights"] = doc["weights"][:F + BASE_AFTER]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    q = AfterstatePolicy.load(path)
    assert np.array_equal(q.weights, afterstate_start())


@pytest.mark.parametrize("cols", [("miss2",), ("miss2", "margin"), ("n_tight2",), ("owns",)])
def test_partial_extra_weights_schedule_as_the_twin(lattices: list, cols: tuple) -> None:
    """Only some extra weights set: the compiled loop computes only their group (the
    two-step columns with the pair releases, ``miss2`` pruned without ``n_tight2``; or the
    others) and still schedules as the twin, which computes every column."""
    rng = np.random.default_rng(len(cols))
    w = afterstate_start() + rng.normal(0.0, 0.5, len(afterstate_start()))
    w[F + BASE_AFTER:] = 0.0
    for c in cols:
        w[F + AFTER_FEATURES.index(c)] = -2.0
    q = AfterstatePolicy(w)
    q.count_hits(lattices)
    assert q.hits > 0
    for g in lattices:
        assert same_schedule(q(g), run_policy(g, q.twin()))


def _many_types(k: int, n: int, seed: int):  # type: ignore[no-untyped-def]
    """A random DAG of ``n`` nodes over ``k`` affine op types (plus one input type)."""
    rng = np.random.default_rng(seed)
    vocab = Vocab([OpType(f"t{i}", "affine", ((4,),), (4,)) for i in range(k)]
                  + [OpType("src", "input", (), (4,))])
    b = GraphBuilder(vocab)
    nodes = [b.add("src") for _ in range(6)]
    for _ in range(n):
        nodes.append(b.add(f"t{int(rng.integers(0, k // 4))}",
                           nodes[int(rng.integers(0, len(nodes)))]))
    return b.build()


def test_many_types_zero_the_two_step_columns_and_still_schedule_as_the_twin() -> None:
    """Over MAX_TWO_STEP_TYPES op types the two-step columns (their k^4 pair releases: 32
    GB at 251 types, a MemoryError before) are 0 in the compiled loop and in the twin; the
    policy still schedules as the twin."""
    g = _many_types(MAX_TWO_STEP_TYPES + 6, 300, 0)
    rng = np.random.default_rng(3)
    w = afterstate_start() + rng.normal(0.0, 0.5, len(afterstate_start()))
    for c in ("miss2", "n_tight2"):
        w[F + AFTER_FEATURES.index(c)] = -2.0
    q = AfterstatePolicy(w)
    assert same_schedule(q(g), run_policy(g, q.twin()))
    rows = afterstate_trace(*afterstate_inputs(g), w, 10_000)[0]  # type: ignore[call-arg]
    cols = [F + AFTER_FEATURES.index(c) for c in ("miss2", "n_tight2")]
    assert len(rows) > 50 and not rows[:, cols].any() and rows[:, F:F + BASE_AFTER].any()


def test_more_types_than_the_loop_takes_is_one_clear_error() -> None:
    g = _many_types(MAX_TYPES + 1, 20, 1)
    with pytest.raises(GraphError, match=r"402 op types need 0\.5 GiB.*trainer=priority"):
        AfterstatePolicy(afterstate_start())(g)
