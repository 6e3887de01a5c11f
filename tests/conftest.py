"""Shared fixtures: tiny hand-made graphs over a small vocabulary."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from edbatch.graph import Graph, GraphBuilder, OpType, Vocab

H = 4


def small_vocab() -> Vocab:
    """leaf (lookup), node (binary cell), unary (tanh), loss and an unbatchable sum."""
    return Vocab([
        OpType("leaf", "lookup", (), (H,), ("E",)),
        OpType("node", "cell", ((H,), (H,)), (H,), ("W",)),
        OpType("tanh", "tanh", ((H,),), (H,)),
        OpType("loss", "pick_nll", ((H,),), (1,)),
        OpType("sum", "sum", None, (1,), batchable=False),
    ])


def left_chain_tree(b: GraphBuilder, leaves: int) -> int:
    """A left-deep binary tree over ``leaves`` leaves; returns the root."""
    root = b.add("leaf", attr=0)
    for i in range(1, leaves):
        root = b.add("node", root, b.add("leaf", attr=i))
    return root


@pytest.fixture
def vocab() -> Vocab:
    return small_vocab()


@pytest.fixture
def two_trees(vocab: Vocab) -> Graph:
    """Two left-deep trees (3 and 2 leaves) with a tanh and loss each, and a final sum."""
    b = GraphBuilder(vocab)
    losses = []
    for i, leaves in enumerate((3, 2)):
        b.instance = i
        losses.append(b.add("loss", b.add("tanh", left_chain_tree(b, leaves)), attr=1))
    b.instance = 0
    return b.build([b.add("sum", *losses)])


def recurrent_chains(lengths: list[int], loss_kind: str = "pick_nll", width: int = 2) -> Graph:
    """Independent recurrent chains, one instance each: a lookup (attr = step) and a
    ``cell(x, h)`` per step from a zero state, a loss per step (attr 0: a ``pick_nll`` label,
    ignored by other loss kinds), and one unbatchable ``sum`` of all losses."""
    vocab = Vocab([OpType("x", "lookup", (), (width,)), OpType("h0", "zero", (), (width,)),
                   OpType("cell", "cell", ((width,), (width,)), (width,)),
                   OpType("loss", loss_kind, ((width,),), (1,)),
                   OpType("sum", "sum", None, (1,), batchable=False)])
    b = GraphBuilder(vocab)
    losses = []
    for i, n in enumerate(lengths):
        b.instance = i
        state = b.add("h0")
        for t in range(n):
            state = b.add("cell", b.add("x", attr=t), state)
            losses.append(b.add("loss", state, attr=0))
    b.instance = 0
    return b.build([b.add("sum", *losses)])


def digest(params: dict[str, Any]) -> str:
    """A short sha256 of named parameters (names, shapes, bytes): init regression fixtures."""
    h = hashlib.sha256()
    for k, v in params.items():
        h.update(k.encode())
        h.update(repr(tuple(v.shape)).encode())
        h.update(v.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def assert_gradcheck(graph: Graph, schedule: object, plan: object,
                     params: dict[str, object]) -> None:
    """fp64 ``torch.autograd.gradcheck`` of the batched executor's training run over every
    parameter (``params`` are float64 tensors)."""
    import torch

    from edbatch.executor.torch_executor import TorchExecutor

    names = list(params)
    executor = TorchExecutor(dtype=torch.float64)

    def loss(*values: torch.Tensor) -> torch.Tensor:
        result = executor.run(graph, schedule, plan,  # type: ignore[arg-type]
                              dict(zip(names, values, strict=True)), grad=True)
        assert result.loss is not None
        return result.loss

    inputs = tuple(p.detach().clone().requires_grad_(True)  # type: ignore[attr-defined]
                   for p in params.values())
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-5)


@pytest.fixture(autouse=True)
def _unfrozen_heap():  # type: ignore[no-untyped-def]
    """In-process training loops freeze the heap (``gc_freeze``); give later tests a normal
    collector again."""
    import gc

    yield
    if gc.get_freeze_count():
        gc.unfreeze()
