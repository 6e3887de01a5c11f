"""The distilled priority FSM: compiled key and run vs the Python twin, the key's packing,
DAgger's determinism and guard, the JSON artifact and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import PolicyFileError
from edbatch.schedule import lower_bound, make_scheduler, run_policy
from edbatch.workloads import make_workload
from edbatch.workloads.synthetic import random_lattices
from experiments._learned import score_unseen
from policies.priority import PriorityPolicy, critical_path_weights, num_params
from policies.priority_distill import PriorityDistiller, vote
from policies.priority_fsm import FORMAT, PriorityFSM, RankKey
from tests.policies.conftest import same_schedule

RANK = RankKey(3, ("wait_gain", "rel_join"), ((0.25,), (0.1, 0.5)))
BUCKET = RankKey(features=("gap", "wait_gain", "rel_height"),
                 edges=((-0.5,), (0.143,), (0.385,)), kind="bucket")
#: Lean rows without the release sums (no release feature in the key).
PLAIN = RankKey(features=("gap", "complete", "rel_height"),
                edges=((-0.5,), (0.5,), (0.385,)), kind="bucket")


@pytest.fixture(scope="module")
def graphs() -> list:
    """Real mini-batches (module networks: many op types; lattices) and random lattices."""
    out = list(make_workload("module_net", granularity="cell").batches("test", 12, limit=2))
    out += list(make_workload("lattice_lstm").batches("train", 6, limit=1))
    out.append(random_lattices(np.random.default_rng(0), 6, 16, 4))
    return out


@pytest.fixture(scope="module")
def teacher() -> PriorityPolicy:
    w = critical_path_weights() + np.random.default_rng(3).normal(0.0, 0.7, num_params())
    return PriorityPolicy(w)


def _table(key: RankKey, graphs: list, teacher: PriorityPolicy) -> dict:
    """A table of the keys the teacher visits, each with a non-zero action where it can."""
    empty = PriorityFSM(key, {})
    keys = np.concatenate([empty.run(g, teacher, mode=0, record=4096)[-2] for g in graphs])
    return {key.unpack(k): (i % key.actions) for i, k in enumerate(np.unique(keys).tolist())}


@pytest.mark.parametrize("key", [RANK, BUCKET], ids=["rank", "bucket"])
def test_compiled_fsm_equals_python_twin(graphs: list, teacher: PriorityPolicy,
                                         key: RankKey) -> None:
    fsm = PriorityFSM(key, _table(key, graphs, teacher))
    cp = make_scheduler("critical_path")
    differs = 0
    for g in graphs:
        s = fsm(g)
        assert same_schedule(s, run_policy(g, fsm.twin()))
        differs += not same_schedule(s, cp(g))
    assert fsm.hits > 0 and differs > 0  # the table answers and changes schedules


@pytest.mark.parametrize("key", [RANK, BUCKET, PLAIN], ids=["rank", "bucket", "plain"])
def test_lean_rows_choose_as_the_full_rows(graphs: list, teacher: PriorityPolicy,
                                           key: RankKey) -> None:
    """The lean run (only the key's columns, release sums only if read, bucket picks
    without sorting) gives the full run's schedules and hit counts."""
    lean = PriorityFSM(key, _table(key, graphs, teacher))
    full = lean.scheduler()
    full.lean = False
    assert lean.lean and lean._release == (key is not PLAIN)
    for g in graphs:
        a, b = lean.run(g), full.run(g)
        assert same_schedule(lean(g), full(g)) and a[4:6] == b[4:6]
    assert not PriorityFSM(RankKey(features=("gap", "log_ready"), edges=((-0.5,), (0.3,)),
                                   kind="bucket"), {}).lean  # a column the lean rows lack


@pytest.mark.parametrize("key", [RANK, BUCKET], ids=["rank", "bucket"])
def test_keys_are_deterministic_and_pack_round_trips(graphs: list, teacher: PriorityPolicy,
                                                     key: RankKey) -> None:
    empty = PriorityFSM(key, {})
    a = empty.run(graphs[0], teacher, mode=0, record=4096)
    b = empty.run(graphs[0], teacher, mode=0, record=4096)
    assert np.array_equal(a[-2], b[-2]) and np.array_equal(a[-1], b[-1]) and len(a[-2]) > 0
    for k in np.unique(a[-2]).tolist():
        assert key.pack(key.unpack(k)) == k
    assert set(a[-1].tolist()) <= set(range(key.actions + (key.kind == "rank")))


def test_empty_table_is_critical_path(graphs: list) -> None:
    cp = make_scheduler("critical_path")
    for key in (RANK, BUCKET):
        fsm = PriorityFSM(key, {})
        for g in graphs:
            assert same_schedule(fsm(g), cp(g))
        assert fsm.hits == 0 and fsm.misses > 0


def test_distillation_is_deterministic_and_guarded(teacher: PriorityPolicy) -> None:
    rng = np.random.default_rng(7)
    label = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    r1 = PriorityDistiller(RANK, rounds=2).fit(teacher, label, val)
    r2 = PriorityDistiller(RANK, rounds=2).fit(teacher, label, val)
    assert r1.policy.table == r2.policy.table and len(r1.rounds) == 3
    p, cp = r1.policy, PriorityFSM(RANK, {})
    val_new = sum(p(g).num_batches for g in val)
    assert val_new <= sum(cp(g).num_batches for g in val)
    if p.num_states:
        assert sum(p(g).num_batches for g in label) < sum(cp(g).num_batches for g in label)
    else:
        assert "learned_nothing" in p.metadata
    u = score_unseen(p, val)
    assert u.fsm_batches == val_new and u.states == p.num_states


def test_vote_majority_and_unrepresentable_labels() -> None:
    keys = np.array([RANK.pack((2, 1, 2))] * 5 + [RANK.pack((4, 0, 0, 1))] * 2)
    labels = np.array([1, 1, 0, 3, 3, 2, 0])  # 3 = the teacher's choice is no candidate
    t = vote(RANK, keys, labels)
    assert t == {(2, 1, 2): 1, (4, 0, 0, 1): 0}  # tie 2 vs 0: the lower slot
    assert vote(RANK, keys, labels, min_votes=3) == {(2, 1, 2): 1}


def test_artifact_round_trips(tmp_path: Path, graphs: list, teacher: PriorityPolicy) -> None:
    for key in (RANK, BUCKET):
        fsm = PriorityFSM(key, _table(key, graphs, teacher), metadata={"seed": 3})
        back = PriorityFSM.load(fsm.save(tmp_path / f"{key.kind}.json"))
        assert back.key == key and back.table == fsm.table and back.metadata == {"seed": 3}
        for g in graphs:
            assert same_schedule(back(g), fsm(g))


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.update(format="edbatch.fsm"), "format"),
    (lambda d: d.update(version=9), "version"),
    (lambda d: d.update(features=["gap"]), "features"),
    (lambda d: d["key"].update(features=["nope"]), "unknown feature 'nope'"),
    (lambda d: d["key"].update(edges=[[0.5, 0.1]]), "ascending"),
    (lambda d: d.update(table=[[[2, 0, 0], 7]]), "names action 7"),
    (lambda d: d.update(table="x"), "malformed"),
    # (were an OverflowError, or truncated / read as numbers)
    (lambda d: d.update(table=[[[2, 10 ** 12, 1], 1]]), r"table key \(2, 1000000000000, 1\)"),
    (lambda d: d.update(table=[[[2, 0], 1]]), r"table key \(2, 0\) is no rank key"),
    (lambda d: d.update(table=[[[0], 1]]), r"table key \(0,\) is no rank key"),
    (lambda d: d.update(table=[[[2, 0, 1.5], 1]]), r"1\.5 is not an integer"),
    (lambda d: d.update(table=[[[2, 0, True], 1]]), "True is not an integer"),
    (lambda d: d["key"].update(slots=2.5), r"2\.5 is not an integer"),
    (lambda d: d.update(metadata=[1]), r"metadata is \[1\], not an object"),
])
def test_bad_artifacts_raise_policy_file_error(tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    key = RankKey(2, ("wait_gain",), ((0.25,),))
    data = PriorityFSM(key, {(2, 0, 1): 1}).to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match=match):
        PriorityFSM.load(path)
    assert data["format"] == FORMAT or match == "format"


def test_missing_corrupt_and_mismatched_files(tmp_path: Path, graphs: list) -> None:
    with pytest.raises(PolicyFileError, match="no such"):
        PriorityFSM.load(tmp_path / "none.json")
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(PolicyFileError, match="not a JSON"):
        PriorityFSM.load(tmp_path / "c.json")
    names = graphs[0].vocab.names
    typed = RankKey(2, ("wait_gain",), ((0.25,),), type_radix=len(names))
    path = PriorityFSM(typed, {}, names).save(tmp_path / "typed.json")
    with pytest.raises(PolicyFileError, match="other op types"):
        PriorityFSM.load(path, vocab_names=[*names[:-1], "other"])
    with pytest.raises(PolicyFileError, match="op types"):
        PriorityFSM(typed, {}, names)(graphs[-1])  # a lattice, not a module network


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="slots"):
        RankKey(0)
    with pytest.raises(ValueError, match="kind"):
        RankKey(kind="tree")
    with pytest.raises(ValueError, match="62 codes"):
        RankKey(features=("fill", "gap", "rel_join"), edges=((0.1, 0.2, 0.3), (-3, -2, -1),
                                                            (0.1, 0.2, 0.3)), kind="bucket")
    with pytest.raises(ValueError, match="int64"):
        RankKey(12, ("fill", "gap"), ((0.1, 0.2, 0.3, 0.4, 0.5), (-5, -4, -3, -2, -1)))


def test_search_never_raises_label_or_validation_batches(graphs: list,
                                                          teacher: PriorityPolicy) -> None:
    table = _table(RANK, graphs, teacher)
    label, val = graphs[:2], graphs[2:]
    new, info = PriorityDistiller(RANK, search_states=8)._search(RANK, table, None, label, val)
    assert info["evaluations"] > 0 and info["label_batches"] <= info["label_batches_before"]
    assert info["label_batches_before"] == sum(PriorityFSM(RANK, table)(g).num_batches
                                               for g in label)
    assert sum(PriorityFSM(RANK, new)(g).num_batches for g in label) == info["label_batches"]
    assert sum(PriorityFSM(RANK, new)(g).num_batches for g in val) <= sum(
        PriorityFSM(RANK, table)(g).num_batches for g in val)
    with pytest.raises(ValueError, match="search_states"):
        PriorityDistiller(search_states=-1)


def test_trainer_config_trains_a_guarded_table(tmp_path: Path) -> None:
    import yaml
    from hydra.utils import get_class

    conf = Path(__file__).resolve().parents[2] / "conf" / "trainer" / "priority_fsm.yaml"
    hp = yaml.safe_load(conf.read_text())
    cls = get_class(hp.pop("_target_"))
    hp.update(seed=0, iterations=3, population=6, elite=2, rounds=1)
    rng = np.random.default_rng(5)
    train = [random_lattices(rng, 6, 16, 4) for _ in range(3)]
    val = [random_lattices(rng, 6, 16, 4) for _ in range(2)]
    res = cls(**hp).fit(train, val)
    p = res.policy
    assert isinstance(p, PriorityFSM) and res.episodes > 0 and res.history
    val_new = sum(p(g).num_batches for g in val)
    assert val_new <= sum(PriorityFSM(p.key, {})(g).num_batches for g in val)
    assert res.best_ratio == pytest.approx(val_new / sum(lower_bound(g) for g in val))
    assert ("learned_nothing" in p.metadata) == (p.num_states == 0)
    assert PriorityFSM.load(p.save(tmp_path / "p.json")).table == p.table
    from policies.user import load_policy

    back = load_policy(tmp_path / "p.json")
    assert isinstance(back, PriorityFSM) and back.table == p.table
