"""Per-instance model code on the public API records the workload builders' graphs, and the
hand-batched PyTorch peers compute the reference loss on the same parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.hand_batched import make_hand_batched, torchfold_status
from benchmarks.models_api import RECORDERS
from benchmarks.peers import sized_workload
from edbatch.api import DynamicBatch, take_graph
from edbatch.errors import GraphError, UnknownNameError
from edbatch.executor import init_params, reference_loss

__all__: list[str] = []

WORKLOADS = sorted(RECORDERS)
ARRAYS = ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "outputs", "depth")


def _setup(name: str, grad: bool = False) -> tuple[object, list, dict]:
    wl = sized_workload(name, 6, 5)
    instances = list(wl.load("train")[10:16])
    params = {k: v.requires_grad_(grad)
              for k, v in init_params(wl, torch.Generator().manual_seed(0)).items()}
    return wl, instances, params


@pytest.mark.parametrize("name", WORKLOADS)
def test_api_recording_equals_the_workload_builder(name: str) -> None:
    wl, instances, params = _setup(name)
    batch = DynamicBatch.from_workload(wl, params)
    for _ in range(2):  # a long-lived batch: the second mini-batch is recorded the same way
        RECORDERS[name](batch, wl, instances)
        graph = take_graph(batch)[0]
    ref = wl.build_graph(instances)
    assert graph.vocab == ref.vocab
    for attr in ARRAYS:
        assert np.array_equal(getattr(graph, attr), getattr(ref, attr)), attr
    with torch.no_grad():
        assert float(reference_loss(graph, params)) == pytest.approx(
            float(reference_loss(ref, params)), rel=1e-6)


def test_batch_run_uses_the_builtin_params() -> None:
    wl, instances, params = _setup("tree_lstm")
    batch = DynamicBatch.from_workload(wl, params)
    RECORDERS["tree_lstm"](batch, wl, instances)
    out = batch.run("depth", grad=False)
    with torch.no_grad():
        want = float(reference_loss(wl.build_graph(instances), params))
    assert out.loss is not None and float(out.loss) == pytest.approx(want, rel=1e-5)


def test_builtin_misuse_fails_with_a_named_error() -> None:
    wl, _, params = _setup("tree_lstm")
    batch = DynamicBatch.from_workload(wl, params)
    with pytest.raises(UnknownNameError, match="tree_lstm.leef"):
        batch.op("tree_lstm.leef")
    internal = batch.op("tree_lstm.internal")
    leaf = batch.op("tree_lstm.leaf")
    with pytest.raises(GraphError, match="takes 2 operands"):
        internal(leaf(attr=1))
    with pytest.raises(GraphError, match="lacks"):
        DynamicBatch.from_workload(wl, {"tree_lstm.E": params["tree_lstm.E"]})


@pytest.mark.parametrize("name", WORKLOADS)
def test_hand_batched_loss_and_gradients_equal_the_reference(name: str) -> None:
    wl, instances, params = _setup(name, grad=True)
    model = make_hand_batched(wl, params)
    assert model is not None
    loss = model.loss(instances)
    ref = reference_loss(wl.build_graph(instances), params)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    if name == "bilstm_tagger":  # nn.LSTM holds its own copies of the cell weights
        keep = ("bilstm.emb", "bilstm.hidden", "bilstm.out")
    else:  # the parameters the model reads itself (not copied into an nn.LSTM)
        keep = tuple(k for k, v in params.items() if any(v is t for t in model.parameters()))
    got = torch.autograd.grad(loss, [params[k] for k in keep])
    want = torch.autograd.grad(ref, [params[k] for k in keep])
    for k, a, b in zip(keep, got, want):
        a, b = (t.to_dense() if t.is_sparse else t for t in (a, b))
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), k


def test_torchfold_status_names_the_failure_or_runs() -> None:
    status = torchfold_status()
    assert status is None or "raised" in status or "not installed" in status
