"""CLEVR module-network peers (``benchmarks/module_net_peers.py``): the unbatched loop and
Suarez's depth-and-module batching equal the workload's reference executor in fp64, loss
and gradients, on the workload's parameters; the interleaved benchmark runs."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import Tensor

from benchmarks.module_net_peers import main, suarez_loss, unbatched_loss
from edbatch.data.clevr_programs import module_type
from edbatch.executor import init_params, reference_loss
from edbatch.workloads.module_net import ModuleNet

TOL = {"atol": 1e-6, "rtol": 1e-6}


@functools.cache
def workload() -> ModuleNet:
    return ModuleNet(embed_dim=4, hidden_dim=5)


def _params() -> dict[str, Tensor]:
    p = init_params(workload(), torch.Generator().manual_seed(0), dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero vectors, so that every parameter is exercised
        for value in p.values():
            value.add_(0.1 * torch.randn(value.shape, generator=gen, dtype=value.dtype))
    return {k: v.requires_grad_(True) for k, v in p.items()}


def _grads(loss: Tensor, params: dict[str, Tensor]) -> dict[str, Tensor]:
    names = list(params)
    got = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return {n: g for n, g in zip(names, got, strict=True) if g is not None}


@pytest.mark.parametrize("peer", [unbatched_loss, suarez_loss])
def test_peer_equals_the_reference_executor_in_fp64(peer) -> None:  # type: ignore[no-untyped-def]
    wl = workload()
    idx = list(range(10))
    params = _params()
    want = reference_loss(wl.minibatch("val", idx), params)
    got, calls = peer([wl.load("val")[i] for i in idx], params)
    torch.testing.assert_close(got, want.reshape(()), **TOL)
    assert calls >= 3
    g_want, g_got = _grads(want.reshape(()), params), _grads(got, params)
    assert g_want.keys() == g_got.keys() and len(g_want) > 20
    for n in g_want:
        torch.testing.assert_close(g_got[n], g_want[n], **TOL, msg=n)


def test_suarez_groups_by_depth_and_module() -> None:
    insts = workload().load("val")[:64]
    _, unbatched = unbatched_loss(insts, _params())
    _, grouped = suarez_loss(insts, _params())
    assert unbatched == sum(len(i.question.program) + 2 for i in insts)
    pairs = set()
    for inst in insts:
        depth: list[int] = []
        for node in inst.question.program:
            depth.append(1 + max((depth[j] for j in node.inputs), default=-1))
            pairs.add((depth[-1], module_type(node)))
    assert grouped == len(pairs) + 2  # + the objects of all scenes and the answer classifier


@pytest.mark.slow
def test_benchmark_runs() -> None:
    out = main(["--minibatches", "1", "--batch-size", "16", "--hidden-dim", "8"])
    assert {"unbatched", "suarez", "auto", "edbatch/critical_path", "floor"} <= out.keys()
    assert out["floor"]["floor_multiple"] == 1.0
    assert out["unbatched"]["floor_multiple"] > 1.0


@pytest.mark.slow
def test_benchmark_runs_the_dynet_peers() -> None:
    """``--dynet 1 2``: both workers answer, and their losses passed the check in ``main``."""
    pytest.importorskip("dynet")
    out = main(["--minibatches", "1", "--warmup", "0", "--batch-size", "8",
                "--hidden-dim", "8", "--dynet", "1", "2"])
    assert {"dynet_autobatch1", "dynet_autobatch2"} <= out.keys()
    assert all(out[k]["ms"] > 0 for k in ("dynet_autobatch1", "dynet_autobatch2"))


@pytest.mark.slow
def test_benchmark_runs_a_learned_fsm_on_unseen_questions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--policy``: an FSM artifact runs as ``edbatch/learned``; with an empty table it is
    its fallback, so it needs exactly critical path's batches on the same mini-batches."""
    from policies.fsm import FSMPolicy
    wl = ModuleNet(hidden_dim=8)
    path = FSMPolicy({}, "tie", tuple(wl.vocab.names), "critical_path"
                     ).save(tmp_path / "policy.json")
    out = main(["--minibatches", "1", "--warmup", "0", "--batch-size", "16",
                "--hidden-dim", "8", "--split", "test", "--policy", str(path)])
    assert out["edbatch/learned"]["batches"] == out["edbatch/critical_path"]["batches"]


@pytest.mark.slow
def test_profile_script_reports_every_phase() -> None:
    from benchmarks import module_net_profile
    out = module_net_profile.main(["--minibatches", "1", "--profiled", "1", "--hidden-dim", "8"])
    assert set(module_net_profile.PHASES) | set(module_net_profile.PARTS) <= out.keys()
    assert out["total"] >= out["forward"] > 0 and 0 < out["cell forwards"] < 100


@pytest.mark.slow
def test_benchmark_runs_the_unfused_bodies_and_only_the_named_contenders() -> None:
    """``--unfused --only``: the compiled and the torch cell bodies on the same mini-batch
    (their losses checked against each other in ``main``), nothing else run."""
    names = ["edbatch/critical_path", "edbatch/critical_path/unfused"]
    out = main(["--minibatches", "1", "--warmup", "0", "--batch-size", "4",
                "--hidden-dim", "4", "--dynet", "--unfused", "--clock", "cpu", "--only", *names])
    assert sorted(out) == names
    assert out[names[0]]["batches"] == out[names[1]]["batches"] > 0


def test_cpu_clock_refuses_the_dynet_workers(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["--clock", "cpu", "--dynet", "1"])
    assert "--clock cpu cannot time the DyNet workers" in capsys.readouterr().err


def test_more_minibatches_than_the_split_holds_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["--split", "test", "--minibatches", "100000", "--dynet"])
    err = capsys.readouterr().err
    assert "--minibatches 100000" in err and "--split test has" in err
