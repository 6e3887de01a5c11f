"""The path lower bound: compiled SCS against its Python twin, soundness against the exact
optimum, and the claim it rests on (every path's op types are a subsequence of a schedule's)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edbatch.errors import ScheduleError
from edbatch.graph import GraphBuilder
from edbatch.schedule import lower_bound, make_scheduler
from edbatch.schedule._compiled_scs import scs2, scs3
from edbatch.schedule.exact import exact_schedule
from edbatch.schedule.path_bound import candidate_paths, path_lower_bound, scs_length
from edbatch.workloads.synthetic import random_dag, random_lattices, synthetic_vocab
from tests.schedule.test_exact import HARD, brute_force

seqs = st.lists(st.integers(0, 3), max_size=9)


@settings(max_examples=150, deadline=None)
@given(seqs, seqs, seqs)
def test_compiled_scs_equals_python_twin(a: list[int], b: list[int], c: list[int]) -> None:
    arr = [np.asarray(s, dtype=np.int32) for s in (a, b, c)]
    assert scs2(arr[0], arr[1]) == scs_length([a, b])
    assert scs3(*arr) == scs_length([a, b, c])


def test_scs_known_values() -> None:
    assert scs_length([[0, 1], [1, 0]]) == 3
    assert scs_length([[0, 1, 2], [0, 1, 2]]) == 3
    assert scs_length([[], []]) == 0
    assert scs3(np.array([0, 1], np.int32), np.array([1, 0], np.int32),
                np.array([2], np.int32)) == 4


def _is_subsequence(sub: tuple[int, ...], seq: list[int]) -> bool:
    it = iter(seq)
    return all(any(x == y for y in it) for x in sub)


def test_crossed_chains_beat_lb() -> None:
    b = GraphBuilder(synthetic_vocab(2))
    b.add("t1", b.add("t0"))
    b.add("t0", b.add("t1"))
    g = b.build()
    r = path_lower_bound(g)
    assert (lower_bound(g), r.bound, exact_schedule(g).num_batches) == (2, 3, 3)
    assert sorted(r.paths) == [(0, 1), (1, 0)]
    assert r.gain == pytest.approx(1.5)


@pytest.mark.parametrize("name", sorted(HARD))
def test_sound_on_hard_cases(name: str) -> None:
    make, lb, opt, _ = HARD[name]
    r = path_lower_bound(make())
    assert lb <= r.bound <= opt


def test_sound_and_tight_on_random_dags() -> None:
    rng = np.random.default_rng(7)
    above = 0
    for _ in range(60):
        g = random_dag(rng, int(rng.integers(3, 13)), int(rng.integers(1, 4)),
                       int(rng.integers(1, 4)), unbatchable_prob=0.15)
        r = path_lower_bound(g, random_weights=4)
        opt = brute_force(g)
        assert lower_bound(g) <= r.bound <= opt
        above += r.bound > lower_bound(g)
    assert above > 0  # the bound is stronger than LB somewhere in this sample


def test_paths_are_subsequences_of_every_schedule() -> None:
    g = random_lattices(np.random.default_rng(3), 12, 9, 3)
    batchable = g.vocab.batchable
    paths = candidate_paths(g, random_weights=5)
    assert len(paths) > 3
    for name in ("critical_path", "depth", "dynet_agenda", "typewise_greedy"):
        sched = make_scheduler(name)(g)
        ops = [b.op_id for b in sched.batches]
        ops = [o for o in ops if batchable[o]]
        assert all(_is_subsequence(p, ops) for p in paths), name
        assert path_lower_bound(g).bound <= sched.num_batches


def test_deterministic_and_empty() -> None:
    g = random_lattices(np.random.default_rng(5), 8, 7, 3)
    assert path_lower_bound(g) == path_lower_bound(g)
    empty = GraphBuilder(synthetic_vocab(2)).build()
    assert path_lower_bound(empty).bound == 0


def test_bad_arguments_are_named() -> None:
    g = random_lattices(np.random.default_rng(1), 3, 4, 2)
    for kw in ({"random_weights": -1}, {"starts": 0}, {"pairs": -2}):
        with pytest.raises(ScheduleError, match="path_lower_bound needs"):
            path_lower_bound(g, **kw)  # type: ignore[arg-type]
