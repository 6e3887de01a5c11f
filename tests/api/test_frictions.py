"""The frictions a new user of edbatch.api met (issue 28), each pinned by a test that failed
on the behaviour before the fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch
from edbatch.errors import ExecutionError, GraphError
from policies import train_policy
from tests.test_api_policy import Chains

ROOT = Path(__file__).resolve().parents[2]


def _chain_graphs(count: int) -> list:  # type: ignore[type-arg]
    """Mini-batches of plain chains: every scheduler meets the lower bound on them."""
    batch = DynamicBatch()
    step = batch.cell(nn.Linear(3, 3), "step", [3], 3)
    loss = batch.cell(lambda h: h.sum(1), "sum", [3], ())
    out = []
    for k in range(count):
        for n in range(4):
            with batch.instance():
                h = batch.input(torch.ones(3))
                for _ in range(n + k + 1):
                    h = step(h)
                batch.add_loss(loss(h))
        out.append(batch.graph()[0])
        batch.discard()
    return out


def test_a_policy_that_learned_nothing_says_so_and_why() -> None:
    graphs = _chain_graphs(2)
    with pytest.warns(UserWarning, match=r"learned nothing \(0 states, 0 episodes\).*"
                                         r"already schedules the validation graphs at 1\.0000"):
        policy = train_policy(graphs, max_episodes=5)
    assert policy.num_states == 0 and policy.metadata["learned"] is False
    assert "early-stop" in policy.metadata["note"]


def test_policy_check_is_about_the_op_types_a_mini_batch_uses() -> None:
    model = Chains()
    policy = train_policy(model.graphs(2), trainer="ed_batch", max_episodes=5)
    assert "loss_sum" in policy.op_names
    # a cell registered after training, unused by the mini-batch: the vocabulary grew
    extra = model.batch.cell(nn.Linear(4, 4), "late", [4], 4)
    model.record(np.random.default_rng(1), 3)
    out = model.batch.run(policy)
    out.schedule.validate(out.graph)
    # a mini-batch without losses has no loss_sum op type: still the policy's op types
    with model.batch.instance():
        h = model.step(model.batch.lookup(model.embed, 1))
    out = model.batch.run(policy, outputs=[h], grad=False)
    assert "loss_sum" not in out.graph.vocab.names and out.num_batches == 2
    # one that uses an op type the policy never saw is refused, naming it (no advice
    # about registration order, which is not the problem)
    with model.batch.instance():
        model.batch.add_loss(model.loss(extra(model.batch.lookup(model.embed, 2))))
    with pytest.raises(GraphError, match=r"uses op types \['user\.late'\] that the policy "
                                         r"was not trained on") as e:
        model.batch.run(policy)
    assert "same order" not in str(e.value)


def test_training_graphs_of_grown_vocabularies_train_one_policy() -> None:
    model = Chains()
    early = model.graphs(1)
    model.batch.input(torch.zeros(2))  # registers input/2 (recorded, then discarded)
    model.batch.discard()
    late = model.graphs(1, seed=1)
    assert early[0][0].vocab.names != late[0][0].vocab.names
    policy = train_policy(early + late, trainer="ed_batch", max_episodes=5)
    assert set(policy.op_names) == set(late[0][0].vocab.names)
    other = Chains(order=("mix", "step"))  # the same cells in another order: same names
    other.record(np.random.default_rng(0), 2)
    assert other.batch.run(policy).loss is not None


def test_a_dtype_mismatch_names_the_batch_dtype_argument() -> None:
    batch = DynamicBatch()
    with pytest.raises(GraphError, match=r"DynamicBatch\(dtype=torch\.float64\)"):
        batch.cell(nn.Linear(3, 3).double(), "step", [3], 3)
    module = nn.Linear(3, 3)
    step = batch.cell(module, "ok", [3], 3)
    module.double()  # converted after registration: found when the mini-batch runs
    with batch.instance():
        step(batch.input(torch.ones(3)))
    with pytest.raises(ExecutionError, match=r"DynamicBatch\(dtype=torch\.float64\)"):
        batch.run()


def test_indexing_a_handle_is_a_clear_type_error() -> None:
    batch = DynamicBatch()
    step = batch.cell(nn.Linear(3, 3), "step", [3], 3)
    with batch.instance():
        h = step(batch.input(torch.ones(3)))
    for index in (0, 1, slice(0, 2)):
        with pytest.raises(TypeError, match="one node with one value.*cannot be indexed"):
            h[index]
    assert h == h and h != step(h) and len({h, h}) == 1
    batch.discard()


@pytest.mark.parametrize("embedding", [[], nn.Linear(3, 3), "embed"])
def test_lookup_of_something_not_an_embedding_names_it(embedding: object) -> None:
    batch = DynamicBatch()
    with batch.instance(), pytest.raises(GraphError, match=(
            f"batch.lookup takes an nn.Embedding.*got {type(embedding).__name__}")):
        batch.lookup(embedding, 1)  # type: ignore[arg-type]
    batch.discard()


def test_recording_outside_an_instance_warns_once() -> None:
    batch = DynamicBatch()
    step = batch.cell(nn.Linear(3, 3), "step", [3], 3)
    h = step(batch.input(torch.ones(3)))
    with pytest.warns(UserWarning, match=r"2 node\(s\) .* outside any `with batch.instance"):
        graph, _ = batch.graph([h])
    assert graph.instance.tolist() == [0, 0]
    batch.discard()
    step(batch.input(torch.ones(3)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch.run()  # warned once per batch


def test_run_with_a_policy_takes_the_lookup_path_made_once(monkeypatch) -> None:
    model = Chains()
    policy = train_policy(model.graphs(2), trainer="ed_batch", max_episodes=5)
    policy.lookahead = "rollout"
    made = []
    runtime = policy.runtime_scheduler
    monkeypatch.setattr(policy, "runtime_scheduler", lambda *a: made.append(1) or runtime(*a))
    monkeypatch.setattr(policy, "scheduler", lambda *a: pytest.fail("slow path taken"))
    for seed in (1, 2):
        model.record(np.random.default_rng(seed), 4)
        out = model.batch.run(policy)
        want = runtime()(out.graph).batches
        assert [(b.op_id, b.node_ids.tolist()) for b in out.schedule.batches] == \
            [(b.op_id, b.node_ids.tolist()) for b in want]
    assert made == [1]


def test_warmup_loads_the_compiled_core_before_the_first_run() -> None:
    code = textwrap.dedent("""
        import torch
        from torch import nn
        from numba.core import event
        import edbatch.api as api
        api.warmup()
        batch = api.DynamicBatch()
        step = batch.cell(nn.Linear(4, 4), "step", [4], 4)
        loss = batch.cell(lambda h: h.sum(1), "s", [4], ())
        for n in (2, 3):
            with batch.instance():
                batch.add_loss(loss(step(step(batch.input(torch.ones(4))))))
        with event.install_recorder("numba:compile") as rec:
            batch.run()
        print("compiles", len(rec.buffer))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["compiles", "0"]
