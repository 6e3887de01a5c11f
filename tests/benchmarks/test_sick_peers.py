"""SICK Tree-LSTM peers and the user-API model: the same loss as the workload (fp64).

* the unbatched per-instance and the level-batched PyTorch peers
  (``benchmarks/peers/tree_lstm_sick.py``) equal the workload's node-by-node reference
  executor, loss and gradients, on the workload's parameters;
* ``examples/sick_relatedness.py`` (written through ``edbatch.api``, a variadic cell) run
  batched equals a plain per-instance PyTorch implementation written here, loss and
  gradients; its ``main`` trains (the loss falls).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import Tensor

from benchmarks.peers.tree_lstm_sick import level_batched_loss, unbatched_loss
from edbatch.data.sick import DepTree, SickPair, similarity_target
from edbatch.executor import init_params, reference_loss
from edbatch.workloads.tree_lstm_sick import TreeLSTMSick

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6


@functools.cache
def workload() -> TreeLSTMSick:
    return TreeLSTMSick(embed_dim=6, hidden_dim=5, sim_dim=4)


def _grads(loss: Tensor, params: dict[str, Tensor]) -> list[Tensor]:
    return [g.to_dense() if g.is_sparse else g
            for g in torch.autograd.grad(loss, list(params.values()))]


@pytest.mark.parametrize("split, start", [("dev", 0), ("train", 100), ("test", 2000)])
def test_peers_equal_the_reference_fp64(split: str, start: int) -> None:
    wl = workload()
    indices = list(range(start, start + 10))
    params = dict(init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64))
    ref = reference_loss(wl.minibatch(split, indices), params)
    ref_grads = _grads(ref, params)
    instances = wl.instances(split, indices)
    for peer in (unbatched_loss, level_batched_loss):
        loss = peer(instances, params)
        torch.testing.assert_close(loss, ref, atol=TOL, rtol=TOL, msg=peer.__name__)
        for name, g, want in zip(params, _grads(loss, params), ref_grads, strict=True):
            torch.testing.assert_close(g, want, atol=TOL, rtol=TOL,
                                       msg=f"{peer.__name__}: gradient of {name}")


def test_level_batched_order_does_not_matter() -> None:
    wl = workload()
    params = dict(init_params(wl, torch.Generator().manual_seed(4), dtype=torch.float64))
    inst = wl.instances("dev", range(6))
    torch.testing.assert_close(level_batched_loss(inst, params),
                               level_batched_loss(inst[::-1], params), atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------- the API model
@functools.cache
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sick_relatedness", ROOT / "examples" / "sick_relatedness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain_tree(model: torch.nn.Module, tree: DepTree, token: int) -> tuple[Tensor, Tensor]:
    """Plain PyTorch, one node at a time, from the model's weights (Tai et al. eq. 2-8)."""
    cell = model.tree
    kids = [_plain_tree(model, tree, k) for k in tree.children[token]]
    x = model.embed.weight[model.words.get(tree.words[token - 1].lower(), 0)]
    hidden = cell.hidden
    h_sum = sum((h for h, _ in kids), start=x.new_zeros(hidden))
    g = cell.w_iou.weight @ x + cell.w_iou.bias + cell.u_iou.weight @ h_sum
    i, o, u = g[:hidden].sigmoid(), g[hidden:2 * hidden].sigmoid(), g[2 * hidden:].tanh()
    c = i * u
    for h_k, c_k in kids:
        c = c + (cell.w_f.weight @ x + cell.w_f.bias + cell.u_f.weight @ h_k).sigmoid() * c_k
    return o * c.tanh(), c


def _plain_loss(model: torch.nn.Module, pairs: list[SickPair]) -> Tensor:
    sim = model.sim
    total = torch.zeros((), dtype=torch.float64)
    for pair in pairs:
        h_a = _plain_tree(model, pair.a, pair.a.root)[0]
        h_b = _plain_tree(model, pair.b, pair.b.root)[0]
        h_s = (sim.w_x.weight @ (h_a * h_b) + sim.w_x.bias
               + sim.w_abs.weight @ (h_a - h_b).abs()).sigmoid()
        logp = torch.log_softmax(sim.w_p.weight @ h_s + sim.w_p.bias, dim=0)
        t = torch.tensor(similarity_target(pair.score), dtype=torch.float64)
        total = total + sum(t[k] * (t[k].log() - logp[k]) for k in range(5) if t[k] > 0)
    return total


@pytest.mark.parametrize("scheduler", ["depth", "dynet_agenda", "typewise_greedy"])
def test_api_model_equals_plain_pytorch_fp64(scheduler: str) -> None:
    mod = example()
    wl = workload()
    pairs = list(wl.load_pairs("dev")[:8])
    torch.manual_seed(0)
    model = mod.SickModel(mod.word_ids(pairs), embed=6, hidden=5, sim=4, dtype=torch.float64)
    model.record(pairs)
    out = model.batch.run(scheduler)
    # nodes with different numbers of children ran in shared batches
    assert out.num_batches < sum(2 * (len(p.a) + len(p.b)) for p in pairs) / 4
    plain = _plain_loss(model, pairs)
    torch.testing.assert_close(out.loss, plain, atol=TOL, rtol=TOL)
    params = list(model.parameters())
    got = torch.autograd.grad(out.loss, params)
    want = torch.autograd.grad(plain, params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)


def test_api_model_predicts_expected_scores() -> None:
    mod = example()
    pairs = list(workload().load_pairs("dev")[:5])
    model = mod.SickModel(mod.word_ids(pairs), embed=6, hidden=5, sim=4, dtype=torch.float64)
    pred = model.predict(pairs)
    assert pred.shape == (5,) and bool(((pred > 1) & (pred < 5)).all())
    for k, pair in enumerate(pairs):  # sum_k k p_k from the plain model
        h_a = _plain_tree(model, pair.a, pair.a.root)[0]
        h_b = _plain_tree(model, pair.b, pair.b.root)[0]
        p = model.sim.log_probs(h_a[None], h_b[None]).exp()[0].detach()
        expected = float(p @ torch.arange(1.0, 6.0, dtype=p.dtype))
        assert float(pred[k]) == pytest.approx(expected, abs=1e-9)


def test_sparse_target_matches_the_loader() -> None:
    mod = example()
    scores = [1.0, 1.085, 2.5, 3.2, 3.667, 4.9, 5.0]
    got = mod.sparse_target(torch.tensor(scores, dtype=torch.float64))
    want = torch.tensor([similarity_target(s) for s in scores], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_example_main_trains() -> None:
    result = example().main(["--pairs", "100", "--batch-size", "25", "--epochs", "2",
                             "--dim", "16"])
    assert result["losses"][1] < result["losses"][0]
    assert -1.0 <= result["dev"]["pearson"] <= 1.0
