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
    parameter the graph's op types declare (``params`` are float64 tensors).

    The others are held fixed (perturbing them costs two runs per entry and can only show a
    zero derivative); one training run with every parameter requiring grad checks that none
    of them gets a gradient, so a kernel reading an undeclared parameter still fails."""
    import numpy as np
    import torch

    from edbatch.executor.torch_executor import TorchExecutor

    used = {p for k in np.flatnonzero(graph.type_counts) for p in graph.vocab[k].params}
    names = [k for k in params if k in used]
    fixed = {k: v for k, v in params.items() if k not in used}
    assert names, "the graph reads no parameter"
    executor = TorchExecutor(dtype=torch.float64)

    def run(values: dict[str, object]) -> torch.Tensor:
        result = executor.run(graph, schedule, plan, values, grad=True)  # type: ignore[arg-type]
        assert result.loss is not None
        return result.loss

    def loss(*values: torch.Tensor) -> torch.Tensor:
        return run({**fixed, **dict(zip(names, values, strict=True))})

    every = {k: p.detach().clone().requires_grad_(True)  # type: ignore[attr-defined]
             for k, p in params.items()}
    grads = torch.autograd.grad(run(every), list(every.values()), allow_unused=True)
    for k, g in zip(every, grads, strict=True):
        if k in fixed:
            assert g is None or not g.any(), f"{k} is not declared by a used op type, " \
                                             f"but gets a gradient"
    inputs = tuple(every[k].detach().clone().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-5)


@pytest.fixture(autouse=True)
def _unfrozen_heap():  # type: ignore[no-untyped-def]
    """In-process training loops freeze the heap (``gc_freeze``); give later tests a normal
    collector again."""
    import gc

    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Every test runs with one torch thread, whatever ran or was collected before it.

    Several test modules set it at import, so a full run (and each xdist worker, which
    collects everything) was already at one thread while a run of one folder was not: the
    bit-equality tests then depended on which files were selected. One thread also keeps
    the two xdist workers of a 2-core machine from oversubscribing it."""
    import torch

    torch.set_num_threads(1)

