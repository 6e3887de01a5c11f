"""Segments hoist the input projections of op types with several batches (a greedy
decoder's encoder steps: one GEMM for all their inputs), on the first run and on cache hits
(the projection steps rebound to the hit's tokens); values, decoded tokens, loss and
gradients equal the unhoisted segments (fp64), also when a training run hits a segment
first run (and hoisted) at inference. Training reads of rows scattered over several batches
are joined (one cat, one index_select) with the same loss and gradients."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from edbatch.api import _segments, argmax

ROOT = Path(__file__).resolve().parents[2]


def _decoder():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("greedy_decode_hoist",
                                                  ROOT / "examples" / "greedy_decode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Decoder(hidden=8, vocab_size=64, dtype=torch.float64)
    model.sq = model.batch.cell(lambda s: s.pow(2).sum(1), "sq", [16], ())
    return model


def _program(model, source, steps: int, states: list):  # type: ignore[no-untyped-def]
    state = model.zero()
    for token in source:
        state = model.enc(state, attr=token)
    states.append(state)
    prev, out = model.bos, []
    for _ in range(steps):
        state = model.dec(state, attr=prev)
        prev = yield argmax(model.logits(state))
        out.append(prev)
    model.batch.add_loss(model.sq(state))
    return out


def _run(model, sources, grad: bool):  # type: ignore[no-untyped-def]
    states: list = []
    out = model.batch.run_programs([_program(model, s, 3, states) for s in sources],
                                   "typewise_greedy", grad=grad)
    return out, out.stack(states)


@pytest.mark.parametrize("first_grad", [False, True])
def test_hoisted_segments_equal_unhoisted(monkeypatch, first_grad: bool) -> None:
    model = _decoder()
    sources = [i.source_ids for i in model.wl.load("test")[:5]]
    size = model.params["seq2seq.src_emb"].shape[0]
    other = [[(7 * t + 3) % size for t in s] for s in sources]  # same structure, new tokens
    params = [p for p in model.params.values() if p.requires_grad]
    runs = []
    for hoist in (True, False):
        if not hoist:
            monkeypatch.setattr(_segments, "hoist_kinds_of", lambda g, s: frozenset())
            _segments._STATES.clear()  # no cached (hoisted) programs
        _run(model, sources[:1], grad=False)  # every kernel registered: the state is kept
        first, _ = _run(model, sources, grad=first_grad)  # a miss: compiled (and hoisted)
        projections = first.segments[0].run.stats["exec/hoisted_projections"]
        assert (projections > 0) == (hoist and not first_grad)
        out, states = _run(model, other, grad=True)  # a hit: rebound to other tokens
        for p in params:
            p.grad = None
        out.loss.backward()
        infer, states_infer = _run(model, other, grad=False)  # a hit at inference
        assert infer.segments[0].run.stats["exec/hoisted_projections"] == float(
            projections > 0 or (hoist and first_grad))
        runs.append((out.returns, infer.returns, out.loss.detach(), states.detach(),
                     states_infer, [p.grad for p in params]))
    (r1, i1, l1, s1, si1, g1), (r2, i2, l2, s2, si2, g2) = runs
    assert r1 == r2 == i1 == i2
    assert torch.allclose(l1, l2, rtol=0, atol=1e-12)
    assert torch.allclose(s1, s2, rtol=0, atol=1e-12)
    assert torch.allclose(si1, si2, rtol=0, atol=1e-12)
    assert torch.allclose(si1, s1, rtol=0, atol=1e-12)
    assert sum(g is not None for g in g1) >= 5  # the encoder's and decoder's parameters
    for a, b in zip(g1, g2, strict=True):
        assert (a is None) == (b is None)
        assert a is None or torch.allclose(a, b, rtol=0, atol=1e-12)


def test_hoisted_kinds_need_several_batches() -> None:
    model = _decoder()
    sources = [i.source_ids for i in model.wl.load("test")[:3]]
    out, _ = _run(model, sources, grad=False)
    first, *rest = out.segments
    assert _segments.hoist_kinds_of(first.graph, first.schedule) == {"seq2seq.enc"}
    for seg in rest:  # one decoder batch per step: nothing to hoist
        assert not _segments.hoist_kinds_of(seg.graph, seg.schedule)
        assert seg.run.stats["exec/hoisted_projections"] == 0


def test_joined_scattered_reads_equal_the_group_by_group_reads(monkeypatch) -> None:
    """A MoE combination reads its tokens' expert outputs from every expert's batch: joined
    (one cat, one index_select) or group by group, loss and gradients equal (fp64); on the
    general path (typed segments off) and on the typed one (``_typed.JoinedRead``)."""
    from edbatch.api import _typed
    from edbatch.workloads.moe import MoETagger

    spec = importlib.util.spec_from_file_location("moe_join", ROOT / "examples" /
                                                  "moe_routing.py")
    assert spec is not None and spec.loader is not None
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)
    workload = MoETagger(dim=8, expert_dim=8, max_sentences=6)
    workload.set_noise_round(1)
    data = workload.load("train")
    made: list = []
    real = _segments.JoinedSelect.__init__

    def spy(self, read):  # type: ignore[no-untyped-def]
        real(self, read)
        made.append(self)

    monkeypatch.setattr(_segments.JoinedSelect, "__init__", spy)
    runs = []
    default = _typed.JOIN_AT  # the one threshold of both paths
    for join_at in (default, 0):  # joined, then never (0 rows allowed)
        monkeypatch.setattr(_typed, "JOIN_AT", join_at)
        monkeypatch.setattr(_typed, "TYPED", False)
        made.clear()
        model = moe.MoE(workload, dtype=torch.float64)
        out = model.run(data)
        out.loss.backward()
        joined = sum(isinstance(r.flat, torch.Tensor) for r in made)
        runs.append((joined, out.loss.detach(),
                     {n: p.grad.clone() for n, p in model.params().items()
                      if p.grad is not None}))
    (j1, l1, g1), (j2, l2, g2) = runs
    assert j1 > 0 and j2 == 0
    assert torch.allclose(l1, l2, rtol=0, atol=1e-12)
    assert g1.keys() == g2.keys()
    for n in g1:
        assert torch.allclose(g1[n], g2[n], rtol=0, atol=1e-12), n
    typed, joins = [], []
    for joined_kind in (_typed.JoinedRead, _typed.GatherGroup):  # (one slot's, several's)
        def spy_join(self, *args, real=joined_kind.__init__):  # type: ignore[no-untyped-def]
            real(self, *args)
            joins.append(self)

        monkeypatch.setattr(joined_kind, "__init__", spy_join)
    monkeypatch.setattr(_typed, "TYPED", True)
    for join_at in (default, 0):  # the typed path: joined reads, then SelectRead groups
        monkeypatch.setattr(_typed, "JOIN_AT", join_at)
        joins.clear()
        model = moe.MoE(workload, dtype=torch.float64)
        out = model.run(data)
        out.loss.backward()
        assert {s.schedule.scheduler for s in out.segments} == {"typed"}
        typed.append((len(joins), out.loss.detach(),
                      {n: p.grad.clone() for n, p in model.params().items()
                       if p.grad is not None}))
    assert typed[0][0] > 0 and typed[1][0] == 0
    for _, loss, grads in typed:
        assert torch.allclose(loss, l1, rtol=0, atol=1e-12)
        for n in g1:
            assert torch.allclose(grads[n], g1[n], rtol=0, atol=1e-12), n
