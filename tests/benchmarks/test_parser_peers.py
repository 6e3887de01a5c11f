"""The transition parser's inference peers give the per-instance reference decoder's trees:
hand-batched PyTorch (fp64) and DyNet with ``.npvalue()`` (fp32); the DyNet loss along the
oracle equals the reference loss; the inference benchmark's outputs match (slow)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from benchmarks.peers.transition_parser import hand_batched_parse, unbatched_parse
from edbatch.executor import init_params
from edbatch.workloads import make_workload
from edbatch.workloads.transition_parser import TransitionParser
from experiments.parser_model import reference_loss

__all__: list[str] = []


@functools.cache
def small(layers: int) -> TransitionParser:
    return make_workload("transition_parser", embed_dim=6, pos_dim=3, hidden_dim=5,  # type: ignore[return-value]
                         mlp_dim=7, layers=layers, min_count=50, max_words=12)


def params_of(wl: TransitionParser, dtype: torch.dtype, seed: int = 0
              ) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in init_params(wl, gen).items():
        p = v.detach().clone()
        if p.dim() == 1:
            p.uniform_(-0.5, 0.5, generator=gen)
        out[k] = p.to(dtype)
    return out


def sentences(wl: TransitionParser, k: int) -> list[tuple[int, ...]]:
    return [wl.embed_attrs(s) for s in list(wl.sentences("dev"))[:k]]  # non-projective too


@pytest.mark.parametrize("layers", [1, 2])
def test_hand_batched_equals_reference_fp64(layers: int) -> None:
    wl = small(layers)
    params = params_of(wl, torch.float64, seed=layers)
    sents = sentences(wl, 10)
    ref = unbatched_parse(wl, params, sents)
    assert hand_batched_parse(wl, params, sents) == ref
    other = params_of(wl, torch.float64, seed=9)  # the check can fail
    assert hand_batched_parse(wl, other, sents) != ref




@pytest.mark.parametrize("layers", [1, 2])
def test_dynet_peer_parses_and_loss_equal_reference(dy: Any, layers: int) -> None:
    from benchmarks.dynet_peer import build_peer
    from benchmarks.peers.dynet import transition_parser as peer

    wl = small(layers)
    params = params_of(wl, torch.float32)
    model, p = build_peer(dy, wl.name, {k: v.numpy() for k, v in params.items()})
    sents = sentences(wl, 6)
    assert peer.parse(dy, p, wl.hidden_dim, sents, wl.class_actions()) == unbatched_parse(
        wl, params, sents)
    instances = list(wl.load("dev")[:3])
    with torch.no_grad():
        expected = float(reference_loss(wl, params, instances))
    assert peer.loss(dy, p, wl.hidden_dim, instances).value() == pytest.approx(expected,
                                                                               rel=1e-4)
    del model


@pytest.mark.slow
def test_inference_benchmark_outputs_match(dy_autobatch: int) -> None:
    from benchmarks.parser_inference import main

    mode = dy_autobatch  # an earlier test in this process may have fixed the mode
    report = main(["--sentences", "6", "--batch-size", "3", "--repeats", "1", "--embed", "6",
                   "--pos", "3", "--hidden", "5", "--mlp", "7", "--autobatch", str(mode)])
    assert report["mismatched_sentences"] == dict.fromkeys(
        ("edbatch", "hand_batched", "unbatched", "dynet"), 0)
    assert set(report["ms_per_batch"]) == set(report["mismatched_sentences"])


def test_inference_benchmark_without_dynet_never_starts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.parser_inference as bench

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("DyNet started though --contenders leaves it out")

    monkeypatch.setattr(bench, "init_dynet", refuse)
    report = bench.main(["--sentences", "4", "--batch-size", "2", "--repeats", "1", "--embed",
                         "6", "--pos", "3", "--hidden", "5", "--mlp", "7", "--contenders",
                         "edbatch", "edbatch_long", "hand_batched"])
    assert report["mismatched_sentences"] == dict.fromkeys(
        ("edbatch", "edbatch_long", "hand_batched"), 0)


@pytest.mark.parametrize("layers", [1, 2])
def test_training_peers_equal_the_reference_loss_fp64(layers: int) -> None:
    """The throughput harness's training peers (hand-batched: packed LSTMs, one MLP call
    over every configuration; unbatched) give the reference loss, and the hand-batched
    peer's gradients of the shared parameters equal the reference's."""
    from benchmarks.peers.transition_parser import HandBatched, Unbatched

    wl = small(layers)
    params = {k: v.requires_grad_() for k, v in params_of(wl, torch.float64).items()}
    instances = list(wl.load("dev")[:6])
    ref = reference_loss(wl, params, instances)
    hand = HandBatched(wl, params).loss(instances)
    torch.testing.assert_close(hand, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(Unbatched(wl, params).loss(instances), ref, rtol=1e-12,
                               atol=1e-12)
    shared = [params[f"parser.{k}"] for k in ("W_h", "W_o", "E_special")]
    for g, want in zip(torch.autograd.grad(hand, shared), torch.autograd.grad(ref, shared),
                       strict=True):
        torch.testing.assert_close(g, want, rtol=1e-8, atol=1e-10)
    other = {k: v.detach() for k, v in params_of(wl, torch.float64, seed=1).items()}
    assert abs(float(HandBatched(wl, other).loss(instances)) - float(ref.detach())) > 1e-3
