"""Variadic cells of the user API: a child-sum Tree-GRU against naive PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, segment_sum
from edbatch.errors import GraphError

E, H, C = 6, 5, 3  # word width, state width, classes


class ChildSumGRU(nn.Module):
    """Child-sum Tree-GRU node: per-child reset gates, an update gate on the child sum."""

    def __init__(self) -> None:
        super().__init__()
        self.wx = nn.Linear(E, 3 * H)
        self.uz, self.ur, self.uh = (nn.Linear(H, H, bias=False) for _ in range(3))

    def forward(self, x: Tensor, rows: Tensor, segment: Tensor, size: int) -> Tensor:
        xz, xr, xh = self.wx(x).chunk(3, dim=1)
        h_sum = segment_sum(rows, segment, size)
        r = torch.sigmoid(xr[segment] + self.ur(rows))           # one gate per child
        z = torch.sigmoid(xz + self.uz(h_sum))
        h_tilde = torch.tanh(xh + self.uh(segment_sum(r * rows, segment, size)))
        return (1 - z) * h_sum + z * h_tilde

    def naive(self, x: Tensor, children: list[Tensor]) -> Tensor:
        """One node, children as a list (the reference)."""
        rows = torch.stack(children) if children else x.new_zeros(0, H)
        seg = torch.zeros(len(children), dtype=torch.int64)
        return self.forward(x[None], rows, seg, 1)[0]


class Loss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(H, C)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.out(h), labels, reduction="none")


Tree = tuple[int, int, list]  # word, label, children


def random_tree(rng: np.random.Generator, depth: int) -> Tree:
    kids = [] if depth == 0 else [random_tree(rng, depth - 1)
                                  for _ in range(int(rng.integers(0, 4)))]
    return int(rng.integers(10)), int(rng.integers(C)), kids


class Model(nn.Module):
    def __init__(self, batch: DynamicBatch) -> None:
        super().__init__()
        self.embed, self.gru, self.loss = nn.Embedding(10, E), ChildSumGRU(), Loss()
        self.to(device=batch.device, dtype=batch.dtype)
        self.batch = batch
        self.node = batch.cell(self.gru, "node", [E, H], H, variadic=True)
        self.loss_cell = batch.cell(self.loss, "loss", [H], (), takes_attr=True)

    def encode(self, tree: Tree) -> Handle:
        word, label, kids = tree
        h = self.node(self.batch.lookup(self.embed, word), *[self.encode(k) for k in kids])
        self.batch.add_loss(self.loss_cell(h, attr=label))
        return h

    def naive(self, tree: Tree) -> tuple[Tensor, Tensor]:
        word, label, kids = tree
        results = [self.naive(k) for k in kids]
        h = self.gru.naive(self.embed.weight[word], [r[0] for r in results])
        loss = self.loss(h[None], torch.tensor([label]))[0] + sum(r[1] for r in results)
        return h, loss


def _trees(seed: int, n: int = 6) -> list[Tree]:
    rng = np.random.default_rng(seed)
    return [random_tree(rng, int(rng.integers(1, 4))) for _ in range(n)]


@pytest.mark.parametrize("scheduler", ["typewise_greedy", "depth", "dynet_agenda"])
@pytest.mark.parametrize("strategy", ["naive", "aligned", "planned"])
def test_child_sum_tree_gru_equals_naive_pytorch(scheduler: str, strategy: str) -> None:
    torch.manual_seed(0)
    model = Model(DynamicBatch(dtype=torch.float64))
    trees = _trees(1)
    for t in trees:
        with model.batch.instance():
            model.encode(t)
    out = model.batch.run(scheduler, strategy=strategy)
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want = sum(model.naive(t)[1] for t in trees)
    want.backward()
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_child_sum_tree_gru_on_cuda_equals_naive_on_cpu() -> None:
    torch.manual_seed(0)
    model = Model(DynamicBatch(device="cuda", dtype=torch.float64))
    trees = _trees(3)
    for t in trees:
        with model.batch.instance():
            model.encode(t)
    out = model.batch.run("typewise_greedy")
    out.loss.backward()
    got = {n: p.grad.cpu() for n, p in model.named_parameters()}
    model.cpu().zero_grad()
    want = sum(model.naive(t)[1] for t in trees)
    want.backward()
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=0, msg=name)


def test_nodes_with_different_child_counts_share_a_batch() -> None:
    torch.manual_seed(0)
    model = Model(DynamicBatch())
    for t in _trees(2, n=8):
        with model.batch.instance():
            model.encode(t)
    graph, _ = model.batch.graph()
    node_op = graph.vocab.names.index("user.node")
    assert graph.vocab[node_op].in_shapes is None  # one variadic op type
    out = model.batch.run("depth")
    mixed = [b for b in out.schedule.batches if b.op_id == node_op
             and len({int(graph.arity[v]) for v in b.node_ids}) > 1]
    assert mixed, "no batch mixed nodes of different child counts"
    counts = {int(graph.arity[v]) - 1 for b in mixed for v in b.node_ids}
    assert {0, 2} <= counts or len(counts) >= 3
    assert out.num_batches < sum(1 for op in graph.op_ids if op == node_op)


def test_a_node_alone_in_its_batch_and_float32_training_step() -> None:
    torch.manual_seed(0)
    model = Model(DynamicBatch())
    tree = (1, 0, [(2, 1, []), (3, 2, []), (4, 0, [(5, 1, [])])])
    with model.batch.instance():
        model.encode(tree)
    out = model.batch.run("depth", strategy="planned")
    want = model.naive(tree)[1]
    assert out.loss.item() == pytest.approx(want.item(), abs=1e-5)
    out.loss.backward()
    assert model.gru.uh.weight.grad is not None and model.gru.uh.weight.grad.abs().sum() > 0
    for strategy in ("naive", "planned"):  # inference: in place, no autograd
        with model.batch.instance():
            model.encode(tree)
        infer = model.batch.run("typewise_greedy", strategy=strategy, grad=False)
        assert infer.loss.item() == pytest.approx(want.item(), abs=1e-5)


def test_variadic_errors_name_the_cell_and_the_fix() -> None:
    batch = DynamicBatch()
    model = Model(batch)
    with batch.instance():
        leaf = model.node(batch.lookup(model.embed, 1))
        with pytest.raises(GraphError, match="'node' takes 1 fixed"):
            model.node()
        with pytest.raises(GraphError, match=r"operand 1 \(repeated\) has shape \(6,\)"):
            model.node(batch.lookup(model.embed, 2), batch.lookup(model.embed, 3))
        assert model.node(batch.lookup(model.embed, 2), leaf, leaf).shape == (H,)
    with pytest.raises(GraphError, match="takes no attr"):
        batch.cell(model.gru, "other", [E, H], H, variadic=True, takes_attr=True)
    with pytest.raises(GraphError, match="returned"):
        batch.cell(lambda rows, seg, size: rows, "bad", [H], H, variadic=True)
    with pytest.raises(GraphError, match="at least the repeated"):
        batch.cell(model.gru, "empty", [], H, variadic=True)


def test_discard_drops_the_mini_batch_and_stales_its_handles() -> None:
    batch = DynamicBatch()
    model = Model(batch)
    with batch.instance():
        h = model.encode((1, 0, [(2, 1, [])]))
    batch.discard()
    with pytest.raises(GraphError, match="empty"):
        batch.run()
    with batch.instance(), pytest.raises(GraphError, match="already ran"):
        model.loss_cell(h, attr=0)
    with batch.instance():
        model.encode((3, 1, []))
    assert batch.run().graph.num_nodes == 4  # lookup, node, loss, loss_sum
