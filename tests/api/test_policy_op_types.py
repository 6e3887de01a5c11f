"""Every path that runs a trained FSM file refuses graphs of other op types through one check
(edbatch.schedule.op_types.check_op_types): the user API's fsm_scheduler with a path, the
evaluation scheduler of a policy file, the training job's fsm= option and loading a file.
In memory, the user API matches op types by name and refuses only unknown ones used."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edbatch.api._schedulers import as_scheduler, fsm_scheduler
from edbatch.errors import GraphError, PolicyFileError
from edbatch.schedule.op_types import check_op_types
from edbatch.workloads.dumps import DumpWorkload
from edbatch.workloads.synthetic import random_lattices
from experiments._train_model_data import make_model_scheduler
from policies import FSMPolicy, FSMScheduler


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    g = DumpWorkload("mvrnn_B1").graphs()[1]
    path = tmp_path_factory.mktemp("policy") / "p.json"
    FSMPolicy({}, "base", g.vocab.names).save(path)
    return g, path, FSMPolicy.load(path)


def test_the_check_itself() -> None:
    check_op_types(("a", "b"), ["a", "b"])  # same names, same order: fine
    with pytest.raises(GraphError, match=r"trained on op types \['a', 'b'\].*\['b', 'a'\]; "
                                         r"register the same cells in the same order"):
        check_op_types(("a", "b"), ("b", "a"))
    with pytest.raises(PolicyFileError, match=r"^p\.json: op types differ from the "
                                              r"workload's: op 0 is 'a' in the file but 'b'"):
        check_op_types(("a", "b"), ("b", "a"), "p.json")
    with pytest.raises(PolicyFileError, match=r"trained on 2 op types, but the workload has 3 "
                                              r"\(first difference: op 2 \('c'\) exists in only"):
        check_op_types(("a", "b"), ("a", "b", "c"), Path("p.json"), fix="re-train")


def test_every_policy_path_refuses_alike(saved) -> None:
    _, path, policy = saved
    other = random_lattices(np.random.default_rng(0), 2, 6, 2)
    with pytest.raises(PolicyFileError) as want:
        check_op_types(policy.op_names, other.vocab.names, path)
    file_paths = [FSMScheduler(path), make_model_scheduler("", str(path)),
                  make_model_scheduler("", str(path), lookahead="artifact"),
                  fsm_scheduler(policy, runtime=True, path=path)]
    for sched in file_paths:
        with pytest.raises(PolicyFileError) as got:
            sched(other)
        assert str(got.value) == str(want.value)
        assert str(path) in str(got.value) and "evaluate the policy on the workload" in str(
            got.value)
    # in memory (the user API): matched by name, refused naming the op types it never saw
    for sched in [fsm_scheduler(policy), fsm_scheduler(policy, runtime=True),
                  as_scheduler(policy)]:
        with pytest.raises(GraphError, match=r"uses op types \['t0', 't1', 't2', 't3'\] that the"):
            sched(other)
    with pytest.raises(PolicyFileError, match="load the policy with the workload"):
        FSMPolicy.load(path, other.vocab)


def test_matching_graphs_are_scheduled(saved) -> None:
    g, path, policy = saved
    for sched in [FSMScheduler(path), make_model_scheduler("", str(path)),
                  fsm_scheduler(policy), fsm_scheduler(policy, runtime=True, path=path)]:
        sched(g).validate(g)
