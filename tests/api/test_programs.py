"""Values while recording (DynamicBatch.run_programs): per-instance programs branch on
computed values while every instance batches; synchronisations follow the longest chain of
reads; losses and gradients equal plain per-instance PyTorch (fp64)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch
from edbatch.errors import GraphError

DIM = 5


class Model:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.embed = nn.Embedding(12, DIM).double()
        self.step = nn.Sequential(nn.Linear(2 * DIM, DIM), nn.Tanh()).double()
        self.up, self.down = nn.Linear(DIM, DIM).double(), nn.Linear(DIM, DIM).double()
        self.score = nn.Linear(DIM, 1).double()
        self.batch = DynamicBatch(dtype=torch.float64)
        b = self.batch
        self.c_step = b.cell(_Cat(self.step), "step", [DIM, DIM], DIM)
        self.c_up = b.cell(self.up, "up", [DIM], DIM)
        self.c_down = b.cell(self.down, "down", [DIM], DIM)
        self.c_score = b.cell(self.score, "score", [DIM], 1)
        self.c_loss = b.cell(lambda h: h.pow(2).sum(1), "sq", [DIM], ())

    def params(self) -> list[nn.Parameter]:
        return [p for m in (self.embed, self.step, self.up, self.down, self.score)
                for p in m.parameters()]

    def program(self, words: list[int]):  # type: ignore[no-untyped-def]
        """Per word: a step, then read the score and branch on its sign."""
        b = self.batch
        h = b.lookup(self.embed, words[0])
        branches = []
        for w in words[1:]:
            h = self.c_step(h, b.lookup(self.embed, w))
            s = yield self.c_score(h)
            assert s.shape == (1,) and not s.requires_grad
            up = bool(s.item() > 0)
            branches.append(up)
            h = (self.c_up if up else self.c_down)(h)
        b.add_loss(self.c_loss(h))
        return branches

    def reference(self, words: list[int]) -> tuple[torch.Tensor, list[bool]]:
        h = self.embed.weight[words[0]][None]
        branches = []
        for w in words[1:]:
            h = self.step(torch.cat([h, self.embed.weight[w][None]], 1))
            up = bool(self.score(h).item() > 0)
            branches.append(up)
            h = (self.up if up else self.down)(h)
        return h.pow(2).sum(), branches


class _Cat(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.inner(torch.cat([a, b], 1))


SENTENCES = [[1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 11, 1], [2, 3, 4]]


@pytest.mark.parametrize("scheduler", ["typewise_greedy", "depth", "auto"])
def test_programs_equal_per_instance_pytorch_and_sync_per_read_depth(scheduler: str) -> None:
    model = Model()
    out = model.batch.run_programs([model.program(s) for s in SENTENCES], scheduler)
    # syncs: the longest chain of value reads (5 reads in the 6-word sentence), not the
    # number of instances (4) nor of reads (1 + 3 + 5 + 2)
    assert out.syncs == max(len(s) - 1 for s in SENTENCES) == 5
    assert len(out.segments) == out.syncs + 1  # the rest (losses) after the last read
    out.loss.backward()
    got = [None if p.grad is None else p.grad.clone() for p in model.params()]
    assert model.score.weight.grad is None  # read only to branch on (detached)
    assert all(g is not None for g in got[:-2])
    for p in model.params():
        p.grad = None
    ref_loss = torch.zeros((), dtype=torch.float64)
    for s, branches in zip(SENTENCES, out.returns, strict=True):
        loss, want = model.reference(s)
        assert branches == want
        ref_loss = ref_loss + loss
    ref_loss.backward()
    assert out.loss.item() == pytest.approx(ref_loss.item(), rel=1e-9)
    for g, p in zip(got, model.params(), strict=True):
        if g is None or p.grad is None:
            assert g is None and p.grad is None
        else:
            torch.testing.assert_close(g, p.grad, rtol=1e-6, atol=1e-9)
    # every segment batched across instances: the first one's steps ran as one batch
    first = out.segments[0]
    step_id = first.graph.vocab.id("user.step")
    assert sum(1 for b in first.schedule.batches if b.op_id == step_id) == 1


def test_a_read_of_a_computed_value_does_not_sync_and_values_are_readable() -> None:
    model = Model()
    b = model.batch

    def program(w: int):  # type: ignore[no-untyped-def]
        x = b.lookup(model.embed, w)
        h = model.c_up(x)
        v1 = yield h
        v2 = yield [x, h]  # both computed already: no synchronisation
        assert v2.shape == (2, DIM)
        torch.testing.assert_close(v2[1], v1)
        return h

    out = b.run_programs([program(w) for w in (1, 2, 3)])
    assert out.syncs == 1 and out.loss is None
    hs = out.returns
    torch.testing.assert_close(out.stack(hs), model.up(model.embed.weight[[1, 2, 3]]))
    torch.testing.assert_close(out[hs[0]], model.up(model.embed.weight[1]))


def _bulk(model: Model, per: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    b = model.batch
    rows = torch.randn(3 * per, DIM, dtype=torch.float64, requires_grad=True)

    def program(k: int):  # type: ignore[no-untyped-def]
        xs = b.inputs(rows[per * k:per * (k + 1)])  # a block of rows in, one node each
        hs = [model.c_up(x) for x in xs]
        yield hs                                     # read many values as one tensor
        return hs

    out = b.run_programs([program(k) for k in range(3)])
    got = out.stack([h for r in out.returns for h in r])
    nodes, seen, todo = 0, set(), [got.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        nodes += 1
        todo.extend(f for f, _ in fn.next_functions)
    return rows, got, nodes


def test_bulk_inputs_and_outputs_take_no_autograd_node_per_row() -> None:
    model = Model()
    rows, got, few = _bulk(model, 2)
    torch.testing.assert_close(got, model.up(rows))
    got.sum().backward()
    torch.testing.assert_close(rows.grad, torch.autograd.grad(model.up(rows).sum(), rows)[0])
    _, _, many = _bulk(model, 8)  # 4x the rows, same instances and batches
    assert many == few


def test_program_errors() -> None:
    model = Model()
    b = model.batch

    def bad():  # type: ignore[no-untyped-def]
        yield 3

    with pytest.raises(GraphError, match="program 0 yielded int; yield a Handle"):
        b.run_programs([bad()])
    with pytest.raises(GraphError, match="takes generators .* got function"):
        b.run_programs([bad])  # (the function, not its generator: was a raw AttributeError)
    b.lookup(model.embed, 1)
    with pytest.raises(GraphError, match="already has recorded nodes"):
        b.run_programs([bad()])


def test_programs_run_with_a_policy_trained_on_their_segments() -> None:
    from policies import train_policy

    model = Model()
    out = model.batch.run_programs([model.program(s) for s in SENTENCES])
    graphs = [seg.graph for seg in out.segments]
    assert any("value/5" in g.vocab.names for g in graphs)  # earlier values taken over
    policy = train_policy(graphs, trainer="ed_batch", max_episodes=5)
    got = model.batch.run_programs([model.program(s) for s in SENTENCES], policy)
    assert got.syncs == out.syncs and got.returns == out.returns
    assert got.loss.item() == pytest.approx(out.loss.item(), rel=1e-12)


@pytest.mark.parametrize("grad", [True, False])
def test_a_finished_run_leaves_no_reference_cycle(grad: bool) -> None:
    """Dropping a result frees its mini-batch (runner, segments, every batch output) by
    reference counting: nothing is left to the cyclic garbage collector (a segment's graph
    maker holding the runner kept each mini-batch's values alive until a collection)."""
    model = Model()
    model.batch.run_programs([model.program(s) for s in SENTENCES], grad=grad)  # (warm)
    gc.collect()
    gc.disable()
    try:
        out = model.batch.run_programs([model.program(s) for s in SENTENCES], grad=grad)
        values, first = weakref.ref(out.values), weakref.ref(out.values.outputs[0])
        del out
        assert values() is None and first() is None
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_garbage_collector_resumes_after_the_recording_is_dropped() -> None:
    """The collector is paused for the run and resumes only once the recording's lists are
    dropped: a mini-batch of many programs triggers no collection of the objects it
    allocated (before, the first allocation after resuming traversed them all)."""
    model = Model()
    sentences = [[1 + k % 11, 2, 3, 4] for k in range(300)]
    model.batch.run_programs([model.program(s) for s in sentences], grad=False)  # (warm)
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    programs = [model.program(s) for s in sentences]
    gc.collect()
    gc.callbacks.append(count)
    try:
        out = model.batch.run_programs(programs, grad=False)
    finally:
        gc.callbacks.remove(count)
    assert out.syncs == 3 and runs == []
