"""run_programs' bulk hand-back: ``yield argmax(handle)`` equals each program's own
``int(value.argmax())`` (uniform rounds, flat index of a 2-d value, rounds that mix requests
and handles), with the same synchronisations; bad requests fail clearly. The segments'
loss sum is reduced on its stacked read (no autograd node per loss row), loss and gradients
unchanged (fp64)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edbatch.api import ArgMax, DynamicBatch, argmax, topk
from edbatch.errors import GraphError

DIM, OUT = 4, 6


class Greedy:
    """A toy greedy decoder: feed back the argmax of a score as the next input row."""

    def __init__(self, device: str = "cpu") -> None:
        torch.manual_seed(1)
        self.embed = nn.Embedding(OUT, DIM).double().to(device)
        self.step = nn.Linear(DIM, DIM).double().to(device)
        self.score = nn.Linear(DIM, OUT).double().to(device)
        self.batch = b = DynamicBatch(device=device, dtype=torch.float64)
        self.c_step = b.cell(nn.Sequential(self.step, nn.Tanh()), "step", [DIM], DIM)
        self.c_score = b.cell(self.score, "score", [DIM], OUT)
        # a 2-d value: its argmax is the flat index
        self.c_grid = b.cell(lambda h: self.score(h).reshape(-1, 2, 3), "grid", [DIM], (2, 3))
        self.c_loss = b.cell(lambda h: h.pow(2).sum(1), "sq", [DIM], ())

    def program(self, first: int, steps: int, how: str):  # type: ignore[no-untyped-def]
        b, out, prev = self.batch, [], first
        for t in range(steps):
            h = self.c_step(b.lookup(self.embed, prev))
            cell = self.c_grid if t % 2 else self.c_score
            if how == "argmax" or (how == "mixed" and (first + t) % 2):
                prev = yield argmax(cell(h))
                assert type(prev) is int
            else:
                value = yield cell(h)
                prev = int(value.argmax())
            out.append(prev)
            b.add_loss(self.c_loss(h))
        return out

    def run(self, how: str, grad: bool = False):  # type: ignore[no-untyped-def]
        plan = [(0, 3), (1, 5), (2, 1), (3, 4), (5, 5)]
        return self.batch.run_programs([self.program(f, n, how) for f, n in plan],
                                       grad=grad)


@pytest.mark.parametrize("how", ["argmax", "mixed"])
def test_argmax_requests_equal_the_programs_own_argmax(how: str) -> None:
    model = Greedy()
    want = model.run("value", grad=True)
    got = model.run(how, grad=True)
    assert got.returns == want.returns
    assert got.syncs == want.syncs == 5  # the longest chain of reads
    grads = []
    for out in (want, got):
        for p in model.step.parameters():
            p.grad = None
        out.loss.backward()
        grads.append([p.grad.clone() for p in model.step.parameters()])
    assert torch.allclose(want.loss, got.loss, rtol=0, atol=1e-12)
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_argmax_request_errors() -> None:
    model = Greedy()
    with pytest.raises(GraphError, match="argmax\\(\\) takes a Handle"):
        argmax(torch.zeros(3))  # type: ignore[arg-type]
    old = []

    def keep():  # type: ignore[no-untyped-def]
        h = model.c_step(model.batch.lookup(model.embed, 0))
        old.append(h)
        yield argmax(model.c_score(h))

    model.batch.run_programs([keep()], grad=False)

    def stale():  # type: ignore[no-untyped-def]
        yield ArgMax(old[0])  # a handle of the previous mini-batch

    with pytest.raises(GraphError):
        model.batch.run_programs([stale()], grad=False)


def _backward_names(loss: torch.Tensor) -> set[str]:
    seen, todo, names = set(), [loss.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def test_segment_loss_sum_is_one_reduction_with_equal_loss_and_gradients() -> None:
    model = Greedy()
    out = model.run("argmax", grad=True)
    names = _backward_names(out.loss)
    assert not any(n.startswith(("SplitBackward", "SplitWithSizesBackward", "UnbindBackward"))
                   for n in names), names
    out.loss.backward()
    got = [p.grad.clone() for p in model.step.parameters()]
    # the same programs' loss recomputed by hand: sum over every step's ||h||^2
    for p in model.step.parameters():
        p.grad = None
    total = torch.zeros((), dtype=torch.float64)
    for (first, steps), toks in zip([(0, 3), (1, 5), (2, 1), (3, 4), (5, 5)], out.returns,
                                    strict=True):
        for prev in [first, *toks[:-1]][:steps]:
            h = torch.tanh(model.step(model.embed.weight[prev][None]))
            total = total + h.pow(2).sum()
    total.backward()
    assert torch.allclose(out.loss, total, rtol=0, atol=1e-12)
    for a, p in zip(got, model.step.parameters(), strict=True):
        assert torch.allclose(a, p.grad, rtol=0, atol=1e-12)


def _routing(model: Greedy, how: str):  # type: ignore[no-untyped-def]
    """Per sentence: scores of every word (one Handles), the top 2 of each, then a step
    on each word's embedding row ``a + b`` (mod OUT) and a loss."""
    b = model.batch

    def program(words: list[int], i: int):  # type: ignore[no-untyped-def]
        hs = model.c_step.map([b.lookup(model.embed, w) for w in words])
        scores = model.c_score.map(hs)
        if how == "topk" or (how == "mixed" and i % 2):
            tops = yield topk(scores if i % 3 else list(scores), 2)
        else:
            values = yield scores
            tops = values.topk(2, dim=1).indices.tolist()
        for h, (a, c) in zip(hs, tops, strict=True):  # the earlier h read twice
            b.add_loss(model.c_loss(model.c_step(h)))
            b.add_loss(model.c_loss(model.c_step(b.lookup(model.embed, (a + c) % OUT))))
            b.add_loss(model.c_loss(h))
        return tops

    sentences = [[0, 1, 2], [3, 4], [5, 1, 1, 2], [2]]
    return b.run_programs([program(s, i) for i, s in enumerate(sentences)], grad=True)


@pytest.mark.parametrize("how", ["topk", "mixed"])
def test_topk_requests_equal_the_programs_own_topk(how: str) -> None:
    model = Greedy()
    outs = []
    for mode in ("value", how):
        out = _routing(model, mode)
        for p in model.step.parameters():
            p.grad = None
        out.loss.backward()
        outs.append((out.returns, out.loss.detach(), out.syncs,
                     [p.grad.clone() for p in model.step.parameters()]))
    (r1, l1, s1, g1), (r2, l2, s2, g2) = outs
    assert r1 == r2 and s1 == s2 == 1
    assert all(len(row) == 2 and all(type(x) is int for x in row) for r in r2 for row in r)
    assert torch.allclose(l1, l2, rtol=0, atol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_topk_request_errors() -> None:
    with pytest.raises(GraphError, match="topk\\(\\) takes"):
        topk([], 2)
    model = Greedy()
    with model.batch.instance():
        h = model.c_score(model.c_step(model.batch.lookup(model.embed, 0)))
    with pytest.raises(GraphError, match="must be an int"):
        topk([h], 0)
    with pytest.raises(GraphError, match="topk\\(\\) takes"):
        topk([h, 3], 2)  # type: ignore[list-item]
    with model.batch.instance():  # a Handles block (topk's fast path) checks k the same
        hs = model.c_score.map(model.c_step.map([model.batch.lookup(model.embed, 0)]))
        none = model.c_step.map([])
    for k in (0, 2.0, True):
        with pytest.raises(GraphError, match="must be an int"):
            topk(hs, k)  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="topk\\(\\) takes"):
        topk(none, 2)
    assert topk(hs, 2).handles is hs
    width = math.prod(h.shape)  # more than a value's entries (was torch's raw error at the sync)
    for many in ([h], hs):
        with pytest.raises(GraphError, match=f"k={width + 1} is more than the {width} entries"):
            topk(many, width + 1)
        assert topk(many, width).k == width
    model.batch.discard()


def test_earlier_nodes_read_often_become_one_value_node_each(monkeypatch) -> None:
    from edbatch.api import _programs

    model = Greedy()
    results = []
    for share in (_programs.SHARE_AT, 10 ** 9):  # shared value nodes, then one per read
        monkeypatch.setattr(_programs, "SHARE_AT", share)
        out = _routing(model, "topk")
        for p in model.step.parameters():
            p.grad = None
        out.loss.backward()
        graph = out.segments[-1].graph
        names = [graph.vocab[int(o)].name for o in graph.op_ids]
        results.append((sum(n.startswith("value/") for n in names), out.loss.detach(),
                        [p.grad.clone() for p in model.step.parameters()]))
    (shared, l1, g1), (per_read, l2, g2) = results
    assert shared == 10 and per_read == 20  # 10 words, each h read twice
    assert torch.allclose(l1, l2, rtol=0, atol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_requests_and_shared_values_on_cuda_equal_cpu() -> None:
    got = []
    for device in ("cpu", "cuda"):
        model = Greedy(device)
        decoded = model.run("argmax", grad=True)
        routed = _routing(model, "topk")
        (decoded.loss + routed.loss).backward()
        got.append((decoded.returns, routed.returns, (decoded.loss + routed.loss).item(),
                    [p.grad.cpu() for p in model.step.parameters()]))
    (d1, r1, l1, g1), (d2, r2, l2, g2) = got
    assert d1 == d2 and r1 == r2
    assert abs(l1 - l2) <= 1e-9 * abs(l1)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_hand_back_argmax_is_torch_argmax(dtype: torch.dtype) -> None:
    """The CPU hand-back (numpy for float32/64) picks torch's index: the first largest, a
    NaN as the largest, all -inf at 0."""
    from edbatch.api._requests import hand_back_argmax
    torch.manual_seed(0)
    rows = torch.randint(0, 4, (64, 9)).to(dtype)  # many ties
    rows[3, 5] = rows[7, 0] = float("nan")
    rows[9] = float("nan")
    rows[11] = -float("inf")
    assert hand_back_argmax(rows) == rows.argmax(1).tolist()
    assert hand_back_argmax(rows.reshape(64, 3, 3)) == rows.argmax(1).tolist()
