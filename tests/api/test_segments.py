"""Segments of one structure reuse a schedule, memory plan and compiled program
(:mod:`edbatch.api._segments`): same values and gradients as the uncached path and as a
per-instance PyTorch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, _segments
from edbatch.api._segments import SegmentCache, segment_state, value_groups
from edbatch.graph import OpType

DIM, VOCAB = 4, 7


class Decoder:
    """Greedy decoding: every step reads the logits and looks the argmax up next, so the
    steps share one structure and differ in their attrs (token ids)."""

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, DIM).double()
        self.cell = nn.Linear(2 * DIM, DIM).double()
        self.out = nn.Linear(DIM, VOCAB).double()
        self.batch = b = DynamicBatch(dtype=torch.float64)
        self.c_step = b.cell(_Cat(self.cell), "step", [DIM, DIM], DIM)
        self.c_out = b.cell(self.out, "logits", [DIM], VOCAB)
        self.c_loss = b.cell(lambda h: h.pow(2).sum(1), "sq", [DIM], ())

    def params(self) -> list[nn.Parameter]:
        """The parameters the loss reaches (the logits are only read, detached)."""
        return [*self.embed.parameters(), *self.cell.parameters()]

    def program(self, first: int, steps: int):  # type: ignore[no-untyped-def]
        b, tok, h, toks = self.batch, first, self.batch.lookup(self.embed, first), []
        for _ in range(steps):
            h = self.c_step(h, b.lookup(self.embed, tok))
            logits = yield self.c_out(h)
            tok = int(logits.argmax())
            toks.append(tok)
        b.add_loss(self.c_loss(h))
        return toks

    def reference(self, first: int, steps: int) -> tuple[torch.Tensor, list[int]]:
        w = self.embed.weight
        h, tok, toks = w[first][None], first, []
        for _ in range(steps):
            h = torch.tanh(self.cell(torch.cat([h, w[tok][None]], 1)))
            tok = int(self.out(h).argmax())
            toks.append(tok)
        return h.pow(2).sum(), toks


class _Cat(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.inner(torch.cat([a, b], 1)))


FIRSTS, STEPS = [1, 2, 3, 5, 6], 4


def _run(model: Decoder, grad: bool = True):  # type: ignore[no-untyped-def]
    out = model.batch.run_programs([model.program(f, STEPS) for f in FIRSTS], grad=grad)
    grads = None
    if grad:
        for p in model.params():
            p.grad = None
        out.loss.backward()
        grads = [p.grad.clone() for p in model.params()]
    return out, grads


def test_cached_segments_equal_the_uncached_path_and_the_reference(monkeypatch) -> None:
    cached_model = Decoder()
    cached, cached_grads = _run(cached_model)
    again, again_grads = _run(cached_model)  # a second mini-batch: hits from the first
    cache = segment_state(cached_model.batch).cache
    assert cache.hits >= 2 * STEPS - 2  # every step after the first of each mini-batch

    monkeypatch.setattr(_segments, "CACHE_SIZE", 0)
    plain_model = Decoder()
    plain, plain_grads = _run(plain_model)
    assert segment_state(plain_model.batch).cache.hits == 0
    assert cached.syncs == plain.syncs == STEPS
    assert cached.returns == plain.returns == again.returns
    assert torch.equal(cached.loss, plain.loss) and torch.equal(again.loss, plain.loss)
    for a, b, c in zip(cached_grads, plain_grads, again_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)
        torch.testing.assert_close(c, b, rtol=0, atol=1e-15)
    # each segment's graph keeps its own attrs (the token ids it looked up)
    attrs = [s.graph.attrs.tolist() for s in cached.segments[1:STEPS]]
    assert attrs == [s.graph.attrs.tolist() for s in plain.segments[1:STEPS]]

    ref_loss = torch.zeros((), dtype=torch.float64)
    for p in plain_model.params():
        p.grad = None
    for f, toks in zip(FIRSTS, plain.returns, strict=True):
        loss, want = plain_model.reference(f, STEPS)
        assert toks == want
        ref_loss = ref_loss + loss
    ref_loss.backward()
    torch.testing.assert_close(plain.loss, ref_loss, rtol=1e-12, atol=0)
    for g, p in zip(cached_grads, plain_model.params(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-9, atol=1e-12)


def test_inference_then_training_on_cached_segments() -> None:
    model = Decoder()
    first, _ = _run(model, grad=False)
    trained, grads = _run(model, grad=True)  # the programs cached by the inference run
    fresh_model = Decoder()
    fresh, fresh_grads = _run(fresh_model, grad=True)
    assert first.returns == trained.returns == fresh.returns
    assert torch.equal(trained.loss, fresh.loss) and torch.equal(first.loss, fresh.loss)
    for a, b in zip(grads, fresh_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    cache = SegmentCache(2)
    entries = [object() for _ in range(3)]
    for k, e in enumerate(entries):
        cache.put(("k", k), e)  # type: ignore[arg-type]
    assert list(cache.entries) == [("k", 1), ("k", 2)]
    assert cache.get(("k", 0)) is None and cache.get(("k", 1)) is entries[1]
    cache.put(("k", 3), entries[0])  # type: ignore[arg-type]
    assert list(cache.entries) == [("k", 1), ("k", 3)]
    assert (cache.hits, cache.misses) == (1, 1)


def test_keys_differ_by_structure_not_by_attrs() -> None:
    ops, cnt = np.array([0, 1, 1], np.int32), np.array([0, 1, 1], np.int64)
    key = SegmentCache.key
    a = key("v", "s", "planned", ops, cnt, np.array([0, 1], np.int32))
    assert a == key("v", "s", "planned", ops.copy(), cnt.copy(), np.array([0, 1], np.int32))
    assert a != key("v", "s", "planned", ops, cnt, np.array([0, 0], np.int32))
    assert a != key("v", "s", "planned", ops, cnt.astype(np.int32), np.array([0, 1], np.int32))


@pytest.mark.parametrize("ids", [[], [2, 0, 1, 0, 2]])
def test_value_groups_group_by_output_shape(ids: list[int]) -> None:
    ops = [OpType("a", "x", None, (3,)), OpType("b", "x", None, (2,)),
           OpType("c", "x", None, (3,))]
    groups = value_groups(ops, np.array(ids, np.int64))
    want = {} if not ids else {(2,): [2], (3,): [0, 1, 3, 4]}
    assert {s: p.tolist() for s, p in groups} == want
    assert [s for s, _ in groups] == sorted(want)


def test_state_is_kept_across_mini_batches_and_renewed_when_kernels_change() -> None:
    model = Decoder()
    _run(model, grad=False)
    state = segment_state(model.batch)
    assert segment_state(model.batch) is state and state.cache.entries
    model.batch.cell(nn.Linear(DIM, DIM).double(), "extra", [DIM], DIM)
    renewed = segment_state(model.batch)
    assert renewed is not state and not renewed.cache.entries
