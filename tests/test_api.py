"""edbatch.api: user cells run batched equal plain PyTorch; build-time errors are actionable."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, Handle, RecordingWarning
from edbatch.data.trees import Tree, parse_tree
from edbatch.errors import ExecutionError, GraphError, UnknownNameError
from edbatch.schedule import AgendaPolicy

ROOT = Path(__file__).resolve().parents[1]
DIM = 6
TREES = [parse_tree(s) for s in (
    "(3 (2 a) (4 (3 (2 b) (4 c)) (2 d)))",
    "(1 (1 e) (2 a))",
    "(0 (1 (0 c) (1 b)) (2 (2 d) (3 (1 a) (2 e))))",
    "(2 x)",
)]
WORDS = {w: i for i, w in enumerate("abcdex")}


class Compose(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)

    def forward(self, left: Tensor, right: Tensor) -> Tensor:
        return torch.tanh(self.linear(torch.cat([left, right], dim=1)))


class Classify(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.linear(h), labels, reduction="none")


def _modules(seed: int = 0) -> tuple[nn.Embedding, Compose, Classify]:
    torch.manual_seed(seed)
    return nn.Embedding(len(WORDS), DIM), Compose(DIM), Classify(DIM)


def _plain_loss(trees: list[Tree], emb: nn.Embedding, comp: Compose, cls: Classify
                ) -> tuple[Tensor, list[Tensor]]:
    """Node by node in plain PyTorch (batches of one); returns the loss and root states."""
    losses: list[Tensor] = []

    def enc(t: Tree) -> Tensor:
        if t.is_leaf:
            h = emb(torch.tensor([WORDS[t.word or ""]]))
        else:
            h = comp(*[enc(c) for c in t.children])
        losses.append(cls(h, torch.tensor([t.label])))
        return h

    roots = [enc(t)[0] for t in trees]
    return torch.stack(losses).sum(), roots


def _record(batch: DynamicBatch, trees: list[Tree], emb: nn.Embedding, comp: object,
            cls: object) -> list[Handle]:
    def enc(t: Tree) -> Handle:
        h = (batch.lookup(emb, WORDS[t.word or ""]) if t.is_leaf
             else comp(*[enc(c) for c in t.children]))  # type: ignore[operator]
        batch.add_loss(cls(h, attr=t.label))  # type: ignore[operator]
        return h

    roots = []
    for t in trees:
        with batch.instance():
            roots.append(enc(t))
    return roots


def _grads(modules: tuple[nn.Module, ...]) -> list[Tensor]:
    return [p.grad.clone() for m in modules for p in m.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize(("scheduler", "strategy"), [
    ("typewise_greedy", "planned"), ("depth", "naive"), (AgendaPolicy(), "planned")])
def test_api_batched_loss_and_grads_equal_plain_pytorch(scheduler: object, strategy: str
                                                        ) -> None:
    mods = _modules()
    plain, plain_roots = _plain_loss(TREES, *mods)
    plain.backward()
    want = _grads(mods)
    for m in mods:
        m.zero_grad()
    batch = DynamicBatch()
    comp = batch.cell(mods[1], "compose", [DIM, DIM], DIM)
    cls = batch.cell(mods[2], "loss", [DIM], (), takes_attr=True)
    roots = _record(batch, TREES, mods[0], comp, cls)
    out = batch.run(scheduler, outputs=roots, strategy=strategy)  # type: ignore[arg-type]
    assert out.loss is not None
    out.loss.backward()
    assert torch.allclose(out.loss, plain, atol=1e-5)
    for got, exp in zip(_grads(mods), want, strict=True):
        assert torch.allclose(got, exp, atol=1e-5)
    assert torch.allclose(out.stack(roots), torch.stack(plain_roots), atol=1e-5)
    assert out.num_batches < out.graph.num_nodes
    assert out.graph.instance.max() == len(TREES) - 1


def test_api_input_rows_get_gradients_and_no_grad_mode_runs_in_place() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(3, 3)
    rows = [torch.randn(3, requires_grad=True) for _ in range(4)]
    batch = DynamicBatch()
    step = batch.cell(lin, "step", [3], 3)
    total = batch.cell(lambda x: x.sum(1), "total", [3], ())
    for r in rows:
        with batch.instance():
            batch.add_loss(total(step(step(batch.input(r)))))
    out = batch.run("max_frontier")
    assert out.loss is not None
    out.loss.backward()
    plain = sum(lin(lin(r)).sum() for r in rows)
    assert torch.allclose(out.loss, plain, atol=1e-5)  # type: ignore[arg-type]
    got = [r.grad.clone() for r in rows]  # type: ignore[union-attr]
    for r in rows:
        r.grad = None
    plain.backward()  # type: ignore[union-attr]
    for g, r in zip(got, rows, strict=True):
        assert torch.allclose(g, r.grad, atol=1e-5)  # type: ignore[arg-type]
    with batch.instance():
        h = step(batch.input(rows[0]))
    value = batch.run(grad=False, outputs=[h])[h]
    assert not value.requires_grad and torch.allclose(value, lin(rows[0]), atol=1e-5)


# ---------------------------------------------------------------------- errors
def test_api_operand_shape_mismatch_names_cell_and_fix() -> None:
    batch = DynamicBatch()
    comp = batch.cell(Compose(DIM), "compose", [DIM, DIM], DIM)
    narrow = batch.input(torch.zeros(4))
    wide = batch.input(torch.zeros(DIM))
    with pytest.raises(GraphError, match=r"cell 'compose' operand 1 has shape \(4,\).*"
                                         r"in_shapes\[1\] = \(6,\); pass a handle of shape"):
        comp(wide, narrow)
    with pytest.raises(GraphError, match="cell 'compose' takes 2 operands"):
        comp(wide)
    with pytest.raises(GraphError, match="cell 'compose' operand 0 is a Tensor.*batch.input"):
        comp(torch.zeros(DIM), wide)  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="cell 'compose' takes no attr"):
        comp(wide, wide, attr=1)


def test_api_module_with_wrong_output_shape_is_rejected_at_registration() -> None:
    batch = DynamicBatch()
    with pytest.raises(GraphError, match=re.escape(
            "cell 'bad': module Linear returned (1, 5) for a batch of 1 with input shapes "
            "[(1, 6)]; expected (1, 6). Fix the module or declare out_shape=(5,)")):
        batch.cell(nn.Linear(DIM, 5), "bad", [DIM], DIM)
    with pytest.raises(GraphError, match=r"cell 'wrong_in': module Linear raised RuntimeError"
                                         r".*check in_shapes"):
        batch.cell(nn.Linear(DIM, DIM), "wrong_in", [4], DIM)
    assert "user.bad" not in batch.vocab and len(batch.vocab) == 0


def test_api_handles_of_another_batch_or_a_finished_minibatch_are_rejected() -> None:
    emb, comp_module, _ = _modules()
    first, second = DynamicBatch(), DynamicBatch()
    comp = second.cell(comp_module, "compose", [DIM, DIM], DIM)
    foreign = first.lookup(emb, 0)
    with pytest.raises(GraphError, match="cell 'compose' operand 0.*another DynamicBatch"):
        comp(foreign, foreign)
    own = second.lookup(emb, 1)
    second.add_loss(second.cell(lambda h: h.sum(1), "s", [DIM], ())(comp(own, own)))
    with pytest.warns(RecordingWarning, match="outside any"):
        second.run()
    with pytest.raises(GraphError, match="already ran.*rebuild it in the current mini-batch"):
        comp(own, own)


def test_api_other_build_errors_are_actionable() -> None:
    batch = DynamicBatch()
    emb = nn.Embedding(3, DIM)
    cls = batch.cell(Classify(DIM), "loss", [DIM], (), takes_attr=True)
    with pytest.raises(GraphError, match="cell 'embedding0': index 3 is out of range"):
        batch.lookup(emb, 3)
    h = batch.lookup(emb, 2)
    with pytest.raises(GraphError, match="cell 'loss' needs attr=<int>"):
        cls(h)
    with pytest.raises(GraphError, match="add_loss.*declare the loss cell with out_shape=()"):
        batch.add_loss(h)
    with pytest.raises(GraphError, match="cell 'loss' is already registered as Cell"):
        batch.cell(Classify(DIM), "loss", [DIM], (), takes_attr=True)
    with pytest.raises(UnknownNameError, match="unknown scheduler 'typewise_gredy'.*Did you "
                                               "mean 'typewise_greedy'"):
        batch.run("typewise_gredy")
    out = batch.run(outputs=[h])
    assert out.loss is None and out[h].shape == (DIM,)
    with pytest.raises(GraphError, match="mini-batch is empty"):
        batch.run()


def test_api_example_script_model_trains() -> None:
    spec = importlib.util.spec_from_file_location("custom_tree_rnn",
                                                  ROOT / "examples" / "custom_tree_rnn.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    losses = example.main(num_trees=32, batch_size=8, epochs=5)  # 20 Adam steps
    assert len(losses) == 5 and losses[-1] < 0.8 * losses[0]


def test_api_module_failing_on_a_real_batch_raises_execution_error_naming_the_cell() -> None:
    batch = DynamicBatch()
    first = batch.cell(lambda x: x[:1], "first_row", [3], 3)  # fine on the probe (1 row)
    for _ in range(2):
        with batch.instance():
            first(batch.input(torch.zeros(3)))
    with pytest.raises(ExecutionError, match=r"op type 'user.first_row'.*2 nodes.*cell "
                                             r"'first_row': module function returned \(1, 3\)"):
        batch.run()


def test_default_memory_strategy_is_the_cheap_aligned_one(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """``run()`` and ``run_programs()`` plan ``aligned`` unless told otherwise: the chain
    planner (``planned``) costs 70-200 ms of Python per fresh 64-instance mini-batch, 3-6x
    a whole inference pass (docs/api.md), so it is opt-in."""
    import edbatch.api._batch as batch_mod

    seen: list[str] = []
    real = batch_mod.plan_memory

    def spy(graph: object, schedule: object, strategy: str, **kw: object) -> object:
        seen.append(strategy)
        return real(graph, schedule, strategy, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(batch_mod, "plan_memory", spy)
    mods = _modules()
    batch = DynamicBatch()
    comp = batch.cell(mods[1], "compose", [DIM, DIM], DIM)
    cls = batch.cell(mods[2], "loss", [DIM], (), takes_attr=True)
    _record(batch, TREES, mods[0], comp, cls)
    batch.run("typewise_greedy")
    assert seen == ["aligned"]
    assert inspect.signature(DynamicBatch.run_programs).parameters["strategy"].default \
        == "aligned"
