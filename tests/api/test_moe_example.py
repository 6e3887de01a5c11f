"""examples/moe_routing.py: the ``moe`` workload's model with the routing decided in the
per-sentence code from the gate's values (run_programs, one model function): losses,
routing and gradients equal a per-token PyTorch reference and the workload's own graphs
through the executor, in fp64."""

from __future__ import annotations

import gc
import importlib.util
import weakref
from pathlib import Path

import pytest
import torch

from edbatch import _lru
from edbatch.api._segments import segment_state
from edbatch.executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload

ROOT = Path(__file__).resolve().parents[2]


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("moe_routing",
                                                  ROOT / "examples" / "moe_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setup(noise_round: int):  # type: ignore[no-untyped-def]
    workload = make_workload("moe", dim=6, expert_dim=5, experts=4, max_sentences=6,
                             max_words=9, vocab_size=300)
    workload.set_noise_round(noise_round)
    model = _example().MoE(workload, dtype=torch.float64)
    return workload, model, workload.load("train")


@pytest.mark.parametrize(("scheduler", "noise_round", "cold"),
                         [("typewise_greedy", 3, False), ("depth", -1, False),
                          ("typewise_greedy", 3, True)])
def test_moe_equals_per_token_reference(scheduler: str, noise_round: int, cold: bool,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    workload, model, data = _setup(noise_round)
    if cold:  # round-plan and segment-cache lookups skipped from the first miss (Lru.cold)
        monkeypatch.setattr(_lru, "COLD_AFTER", 0)
    out = model.run(data, scheduler)
    assert (segment_state(model.batch).rounds.skipped > 0) == cold
    assert out.syncs == workload.layers  # one read per layer, whatever the sentence count
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in model.params().items() if p.grad is not None}
    model.zero_grad()
    ref = torch.zeros((), dtype=torch.float64)
    for inst, routes in zip(data, out.returns, strict=True):
        loss, want = model.reference(inst)
        assert routes == want
        ref = ref + loss
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-9)
    want = {n: p.grad for n, p in model.params().items() if p.grad is not None}
    assert got.keys() == want.keys() and "moe.gate1.W" in got
    assert ("moe.gate1.W_noise" in got) == (noise_round >= 0)  # noise only in training
    for name, g in got.items():
        torch.testing.assert_close(g, want[name], rtol=1e-6, atol=1e-9, msg=name)
    # every expert is one op type: the tokens routed to it ran as one batch
    e = workload.experts
    first = {c // e for c in out.returns[0][0]} | {c % e for c in out.returns[0][0]}
    ids = {out.segments[1].graph.vocab.id(f"user.expert0_{a}") for a in first}
    assert sum(1 for b in out.segments[1].schedule.batches if b.op_id in ids) == len(ids)


def test_routing_in_the_program_equals_the_workloads_graph() -> None:
    """Same parameters: the workload's builder routes as the program does, and its graph
    through the executor gives the same loss and gradients."""
    workload, model, data = _setup(2)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.params().items()}
    workload.set_routing_params(params)
    out = model.run(data)
    for inst, routes in zip(data, out.returns, strict=True):
        want = [[sum(a * workload.experts ** j for j, a in enumerate(c)) for c in layer]
                for layer in workload.routes(inst)]
        assert routes == want
    out.loss.backward()
    graph = workload.minibatch("train", range(len(data)))
    schedule = make_scheduler("depth")(graph)
    result = TorchExecutor("cpu", torch.float64).run(
        graph, schedule, plan_memory(graph, schedule, "aligned"), params, grad=True)
    assert result.loss.item() == pytest.approx(out.loss.item(), rel=1e-9)
    result.loss.backward()
    for name, p in model.params().items():
        if p.grad is not None:
            torch.testing.assert_close(params[name].grad, p.grad, rtol=1e-6, atol=1e-9,
                                       msg=name)


@pytest.mark.slow  # ~20 s on the shared VM
def test_moe_example_trains() -> None:
    losses = _example().main(["--sentences", "32", "--batch-size", "16", "--epochs", "2",
                              "--dim", "8"])
    assert losses[1] < losses[0]


def test_cached_segments_keep_no_mini_batch_alive() -> None:
    _, model, data = _setup(3)
    out = model.run(data)
    out.loss.backward()
    assert segment_state(model.batch).cache.entries  # (typed entries, kept for later)
    values = weakref.ref(out.values)
    del out
    gc.collect()
    assert values() is None  # no entry holds the runner (its values, autograd graph)
