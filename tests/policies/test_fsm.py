"""FSMPolicy: decisions, fallback, artifact round trip and every corruption path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edbatch.errors import PolicyFileError, UnknownNameError
from edbatch.schedule import Frontier, run_policy
from edbatch.workloads.dumps import DumpWorkload
from edbatch.workloads.synthetic import random_binary_trees, synthetic_vocab
from envs.encoding import encode_state
from policies import FSMPolicy


@pytest.fixture(scope="module")
def mvrnn():
    return DumpWorkload("mvrnn_B1")


def test_fsm_follows_its_table_and_counts_hits(mvrnn) -> None:
    g = mvrnn.graphs()[1]
    f = Frontier(g)
    f.pop_forced()
    view = f.view()
    key = encode_state(view, "base")
    last = key[0]  # choose the first ready type instead of ED-Batch's last
    policy = FSMPolicy({key: last}, "base", g.vocab.names)
    assert policy.choose(view) == last
    assert (policy.hits, policy.misses) == (1, 0)
    run_policy(g, policy).validate(g)
    assert policy.misses > 0 and 0 < policy.hit_rate < 1


def test_unseen_state_uses_ed_batch_rule_last_element(mvrnn) -> None:
    g = mvrnn.graphs()[1]
    policy = FSMPolicy({}, "sorted", g.vocab.names)
    f = Frontier(g)
    f.pop_forced()
    view = f.view()
    assert policy.choose(view) == encode_state(view, "sorted")[-1]


def test_round_trip_preserves_everything(tmp_path: Path, mvrnn) -> None:
    g = mvrnn.graphs()[0]
    p = FSMPolicy({(1, 3): 3, (2,): 2}, "max", g.vocab.names, "typewise_greedy",
                  {"seed": 3, "git_sha": "abc"})
    path = p.save(tmp_path / "fsm.json")
    q = FSMPolicy.load(path, g.vocab)
    assert q.table == p.table and q.encoding == "max" and q.fallback_name == "typewise_greedy"
    assert q.metadata == {"seed": 3, "git_sha": "abc"}
    assert [b.node_ids.tolist() for b in run_policy(g, p).batches] == \
           [b.node_ids.tolist() for b in run_policy(g, q).batches]


def _artifact(**fields: object) -> str:
    """A valid two-op artifact's JSON with ``fields`` replaced."""
    return json.dumps({"format": "edbatch.fsm", "schema_version": 1, "op_types": ["a", "b"],
                       "encoding": "base", "fallback": "ed_batch", "table": [[[0], 1]],
                       "metadata": {}, **fields})


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    ('{"format": "something"}', "not an edbatch FSM policy"),
    ('{"format": "edbatch.fsm", "schema_version": 99}', "schema version 99"),
    ('{"format": "edbatch.fsm", "schema_version": 1, "op_types": ["a"]}', "malformed field"),
    ('{"format": "edbatch.fsm", "schema_version": 1, "op_types": ["a"], "encoding": "base",'
     ' "fallback": "ed_batch", "table": [[[0], 5]]}', "outside 0..0"),
    # ids that int() would truncate or accept, names that are no list or repeat, a state
    # listed twice, metadata that is no object, an unknown encoding (was: loaded silently, or
    # a raw TypeError / UnknownNameError without the path)
    *((_artifact(**{k: v}), m) for k, v, m in (
        ("table", [[[0], 1.5]], r"1\.5 is not an integer"),
        ("table", [[[0], True]], "True is not an integer"),
        ("table", [[[0.0], 0]], r"0\.0 is not an integer"),
        ("table", [[[0], 0], [[0], 1]], r"1 table state\(s\) listed twice"),
        ("op_types", "ab", "op_types is 'ab', not a list of names"),
        ("op_types", ["a", "a"], r"op_types lists \['a'\] more than once"),
        ("op_types", ["a", 1.5], r"op_types lists 1\.5, not an op type name"),
        ("op_types", ["a", float("nan")], "op_types lists nan, not an op type name"),
        ("op_types", ["a", ""], "op_types lists '', not an op type name"),
        ("metadata", 5, "metadata is 5, not an object"),
        ("encoding", "nope", "encoding 'nope' is not one of"))),
])
def test_corrupt_files_fail_clearly(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PolicyFileError, match=match) as e:
        FSMPolicy.load(path)
    assert str(path) in str(e.value) and "Fix:" in str(e.value)


def test_missing_file_and_vocab_mismatch(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="no such policy file"):
        FSMPolicy.load(tmp_path / "nope.json")
    path = FSMPolicy({}, "base", synthetic_vocab(3).names).save(tmp_path / "p.json")
    with pytest.raises(PolicyFileError, match="trained on 5 op types, but the workload has 6"):
        FSMPolicy.load(path, synthetic_vocab(4))
    names = list(synthetic_vocab(3).names)
    names[1] = "renamed"
    FSMPolicy({}, "base", tuple(names)).save(path)
    with pytest.raises(PolicyFileError, match="op 1 is 'renamed' in the file but 't1'"):
        FSMPolicy.load(path, synthetic_vocab(3))


def test_saving_onto_a_folder_names_it(tmp_path: Path) -> None:
    """Every artifact kind (a raw ``IsADirectoryError`` at the rename before)."""
    from policies.afterstate import AfterstatePolicy, afterstate_start
    from policies.priority import PriorityPolicy, critical_path_weights
    from policies.priority_fsm import PriorityFSM, RankKey

    for artifact in (FSMPolicy({(0,): 0}, "base", synthetic_vocab(2).names),
                     PriorityPolicy(critical_path_weights()),
                     AfterstatePolicy(afterstate_start()),
                     PriorityFSM(RankKey(2, ("wait_gain",), ((0.25,),)), {(2, 0, 1): 1})):
        with pytest.raises(PolicyFileError, match="is a folder, not a policy file to write"):
            artifact.save(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_interrupted_save_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    vocab = synthetic_vocab(2)
    path = FSMPolicy({(0,): 0}, "base", vocab.names).save(tmp_path / "p.json")
    before = path.read_text()

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(KeyboardInterrupt):
        FSMPolicy({(1,): 1}, "base", vocab.names).save(path)
    assert path.read_text() == before
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_bad_names_rejected() -> None:
    with pytest.raises(UnknownNameError, match="unknown encoding"):
        FSMPolicy({}, "sorte", ("a",))
    with pytest.raises(UnknownNameError, match="unknown fallback"):
        FSMPolicy({}, "sorted", ("a",), fallback="greedy")


def test_complete_encoding_marks_full_batches() -> None:
    g = random_binary_trees(np.random.default_rng(0), 3, 5)
    f = Frontier(g, typewise=True)
    view = f.view()
    key = encode_state(view, "complete")
    ready = view.ready_ops
    assert [x // 2 for x in key] == ready
    assert [x % 2 for x in key] == [int(view.count(a) >= view.typewise(a)) for a in ready]


def test_lookahead_round_trip_and_never_worse(tmp_path: Path) -> None:
    from edbatch.workloads import make_workload

    g = next(iter(make_workload("lattice_lstm").batches("dev", 16, limit=1)))
    plain = FSMPolicy({}, "hints", g.vocab.names, "critical_path")
    ahead = FSMPolicy({}, "hints", g.vocab.names, "critical_path", lookahead="rollout")
    path = ahead.save(tmp_path / "fsm.json")
    loaded = FSMPolicy.load(path, g.vocab)
    assert loaded.lookahead == "rollout"
    s_plain, s_ahead = plain.scheduler("fsm")(g), loaded.scheduler("fsm")(g)
    s_ahead.validate(g)
    assert s_ahead.num_batches < s_plain.num_batches
    assert loaded.hits + loaded.misses == 0  # rollouts run on forks
    assert plain.misses > 0


def test_artifacts_without_lookahead_load_as_none(tmp_path: Path, mvrnn) -> None:
    g = mvrnn.graphs()[0]
    data = FSMPolicy({}, "base", g.vocab.names).to_json()
    del data["lookahead"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert FSMPolicy.load(path, g.vocab).lookahead == "none"
    data["lookahead"] = "beam"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyFileError, match="lookahead 'beam'"):
        FSMPolicy.load(path, g.vocab)
    with pytest.raises(UnknownNameError, match="unknown lookahead 'rolout'.*rollout"):
        FSMPolicy({}, "base", g.vocab.names, lookahead="rolout")
