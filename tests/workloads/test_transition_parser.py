"""The transition parser: oracle graphs on EWT, the per-sentence model through edbatch.api
(fp64 loss and gradients equal the per-instance reference), and parsing batched across
sentences with run_programs (synchronisations = the most value reads of any sentence,
trees identical to the one-sentence-at-a-time reference decoder)."""

from __future__ import annotations

import functools

import pytest
import torch

from edbatch.data.transitions import replay
from edbatch.errors import GraphError
from edbatch.executor import init_params
from edbatch.workloads import WORKLOADS, make_workload
from edbatch.workloads.transition_parser import TransitionParser, attachment_scores
from experiments.parser_model import ApiParser, reference_loss, reference_parse

__all__: list[str] = []


@functools.cache
def small(layers: int = 1) -> TransitionParser:
    kw = {**WORKLOADS["transition_parser"].test_kwargs(6, 5, short=True), "layers": layers}
    return make_workload("transition_parser", **kw)  # type: ignore[return-value]


def fp64_params(wl: TransitionParser, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for k, v in init_params(wl, gen).items():
        p = v.detach().double()
        if p.dim() == 1:  # non-zero biases, so that they are compared too
            p.uniform_(-0.5, 0.5, generator=gen)
        params[k] = p.requires_grad_()
    return params


def test_oracle_classes_rebuild_the_gold_trees() -> None:
    wl = small()
    dev = wl.load("dev")
    assert wl.nonprojective["dev"] == 31 and len(dev) > 100
    assert all(len(s) <= 6 for s in (inst.sentence for inst in dev))
    for inst in dev[:50]:
        actions = [wl.action_of(c)[0] for c in inst.classes]
        assert replay(len(inst), actions) == inst.sentence.heads
        assert len(inst.classes) == 2 * len(inst)
        assert max(inst.classes) < wl.num_classes


def test_classes_round_trip_and_labels() -> None:
    wl = small()
    assert wl.num_classes == 1 + 2 * len(wl.labels) and "root" in wl.labels
    for cls in range(wl.num_classes):
        action, label = wl.action_of(cls)
        assert wl.class_of(action, wl.labels[label] if label >= 0 else None) == cls
    unlabelled = make_workload("transition_parser", **{
        **WORKLOADS["transition_parser"].test_kwargs(4, short=True), "labelled": False})
    assert unlabelled.num_classes == 3


@pytest.mark.parametrize("kw", [{"layers": 3}, {"granularity": "primitive"},
                                {"hidden_dim": 0}])
def test_bad_arguments_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(GraphError):
        make_workload("transition_parser", **{
            **WORKLOADS["transition_parser"].test_kwargs(4, short=True), **kw})


@pytest.mark.parametrize("layers", [1, 2])
def test_api_loss_and_gradients_equal_reference_fp64(layers: int) -> None:
    wl = small(layers)
    params = fp64_params(wl)
    instances = list(wl.load("dev")[:4])
    model = ApiParser(wl, params, dtype=torch.float64)
    loss = model.loss(instances)
    ref = reference_loss(wl, params, instances)
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    refs = torch.autograd.grad(ref, list(params.values()), allow_unused=True)
    for name, g, r in zip(params, grads, refs, strict=True):
        assert r is not None, name
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-6, msg=f"gradient of {name}")


@pytest.mark.parametrize("layers", [1, 2])
def test_batched_parsing_equals_reference_decoder(layers: int) -> None:
    wl = small(layers)
    params = fp64_params(wl, seed=layers)
    sentences = [inst.embed_attrs for inst in wl.load("dev")[:12]]
    model = ApiParser(wl, params, dtype=torch.float64)
    parses, run = model.parse(sentences)
    refs = [reference_parse(wl, params, a) for a in sentences]
    assert parses == refs
    reads = [r[2] for r in refs]
    # one synchronisation per round of reads: the most reads of any sentence, not their sum
    assert run.syncs == max(reads) and sum(reads) > max(reads)
    assert all(r <= 2 * len(a) - 1 for r, a in zip(reads, sentences, strict=True))
    for heads, labels, _ in parses:  # complete trees, every word labelled
        assert heads.count(0) == 1 and min(labels) >= 0
    # the next mini-batch starts clean and gives the same trees
    assert model.parse(sentences[:3])[0] == refs[:3]


def test_attachment_scores_count_every_word() -> None:
    wl = small()
    sents = [inst.sentence for inst in wl.load("test")[:5]]
    gold = attachment_scores(sents, [s.heads for s in sents], [s.deprels for s in sents])
    assert gold["uas"] == gold["las"] == 1.0
    wrong = attachment_scores(sents, [[0] * len(s) for s in sents])
    assert wrong["uas"] == sum(h == 0 for s in sents for h in s.heads) / gold["words"]
    with pytest.raises(ValueError, match="words"):
        attachment_scores(sents[:1], [[0]])
