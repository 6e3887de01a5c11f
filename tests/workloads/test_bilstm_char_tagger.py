"""The char-BiLSTM tagger: its graphs, bad input, and fp64 equality of the batched runs
(workload executor and the ``edbatch.api`` example) with unbatched references."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import Tensor

from edbatch.data.ud import UPOS_TAGS
from edbatch.errors import DataFormatError, GraphError
from edbatch.executor import init_params, reference_loss
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload
from edbatch.workloads.bilstm_char_tagger import BiLSTMCharTagger

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6
SMALL = BiLSTMCharTagger.test_kwargs(6)


@functools.cache
def workload(granularity: str = "cell") -> BiLSTMCharTagger:
    wl = make_workload("bilstm_char_tagger", granularity=granularity, **SMALL)
    assert isinstance(wl, BiLSTMCharTagger)
    return wl


# ---------------------------------------------------------------------- data and graphs
def test_rare_words_are_composed_and_frequent_looked_up() -> None:
    wl = workload()
    for inst in wl.load("dev")[:50]:
        for word, wid, chars in zip(inst.sentence.words, inst.word_ids, inst.char_ids,
                                    strict=True):
            assert (wid == 0) == wl.words.is_rare(word) == (chars is not None)
            assert wl.words.is_rare(word) == (word not in wl.words.words[1:50])
            assert wl.words.counts.get(word, 0) >= 6 or wl.words.is_rare(word)
            if chars is not None:
                assert chars[0] == chars[-1] == 1 and len(chars) == len(word) + 2
        assert [UPOS_TAGS[t] for t in inst.tag_ids] == list(inst.sentence.upos)
    g = wl.minibatch("dev", range(4))
    names = [wl.vocab.names[int(t)] for t in g.op_ids]
    insts = wl.load("dev")[:4]
    assert names.count("char_tagger.compose") == sum(i.num_rare for i in insts)
    assert names.count("char_tagger.loss") == sum(len(i) for i in insts)
    chars = sum(len(c) for i in insts for c in i.char_ids if c is not None)
    assert names.count("char_tagger.char_fwd") == names.count("char_tagger.char_bwd") == chars


def _write_ewt(root: Path, train: str, dev: str, test: str) -> Path:
    folder = root / "ud_ewt"
    folder.mkdir()
    for split, text in (("train", train), ("dev", dev), ("test", test)):
        (folder / f"en_ewt-ud-{split}.conllu").write_text(text)
    return root


def _sentence(*words: str) -> str:
    lines = [f"{i}\t{w}\t_\tNOUN\t_\t_\t{0 if i == 1 else 1}\t{'root' if i == 1 else 'dep'}"
             f"\t_\t_" for i, w in enumerate(words, start=1)]
    return "# sent_id = s\n" + "\n".join(lines) + "\n\n"


def test_sentence_longer_than_the_limit_names_file_and_line(tmp_path: Path) -> None:
    root = _write_ewt(tmp_path, _sentence("a", "b") + _sentence("a", "b", "c"),
                      _sentence("a"), _sentence("b"))
    with pytest.raises(DataFormatError, match=r"en_ewt-ud-train\.conllu:6: .*a sentence of 3 "
                                              r"words.*max_words=2"):
        make_workload("bilstm_char_tagger", data_dir=root, max_words=2, **SMALL)
    wl = make_workload("bilstm_char_tagger", data_dir=root, max_words=3, **SMALL)
    assert [len(i) for i in wl.load("train")] == [2, 3]


def test_unknown_character_names_the_word_and_line(tmp_path: Path) -> None:
    root = _write_ewt(tmp_path, _sentence("ab", "ba"), _sentence("ab", "ax"), _sentence("b"))
    wl = make_workload("bilstm_char_tagger", data_dir=root, unknown_chars="error", **SMALL)
    with pytest.raises(DataFormatError, match=r"en_ewt-ud-dev\.conllu:3: .*the character 'x' "
                                              r"\(U\+0078\) in the word 'ax'"):
        wl.load("dev")
    lenient = make_workload("bilstm_char_tagger", data_dir=root, **SMALL)
    assert lenient.load("dev")[0].char_ids[1] == (1, lenient.chars.ids["a"], 0, 1)


def test_vocab_size_keeps_the_most_frequent_words() -> None:
    full = make_workload("bilstm_char_tagger", **{**SMALL, "vocab_size": None})
    assert len(full.words) == 3505 and len(workload().words) == 50
    assert workload().words.words == full.words.words[:50]
    assert workload().param_shapes()["char_tagger.emb"][0] == 50


def test_bad_sizes_are_named() -> None:
    with pytest.raises(GraphError, match="embed_dim must be even.*got 7"):
        make_workload("bilstm_char_tagger", embed_dim=7)
    with pytest.raises(GraphError, match="unknown_chars must be 'unk' or 'error'"):
        make_workload("bilstm_char_tagger", unknown_chars="drop")


# ---------------------------------------------------------------------- fp64 equality
def _grads(loss: Tensor, params: dict[str, Tensor]) -> list[Tensor]:
    return [torch.zeros_like(p) if g is None else g for g, p in zip(
        torch.autograd.grad(loss, list(params.values()), allow_unused=True), params.values(),
        strict=True)]


@pytest.mark.parametrize("scheduler", ["depth", "dynet_agenda"])
def test_workload_batched_equals_unbatched_fp64(scheduler: str) -> None:
    params = dict(init_params(workload(), torch.Generator().manual_seed(1),
                              dtype=torch.float64))
    ref = {}
    for granularity in ("cell", "primitive"):  # both spell the same model
        graph = workload(granularity).minibatch("dev", range(4))
        ref[granularity] = reference_loss(graph, params)
        schedule = make_scheduler(scheduler)(graph)
        out = TorchExecutor(dtype=torch.float64).run(graph, schedule, plan_memory(graph, schedule),
                                                     params,
                                  grad=True)
        assert out.loss is not None and out.num_kernel_calls < graph.num_nodes / 4
        torch.testing.assert_close(out.loss, ref[granularity], atol=TOL, rtol=TOL)
        for g, want in zip(_grads(out.loss, params), _grads(ref[granularity], params),
                           strict=True):
            torch.testing.assert_close(g, want, atol=TOL, rtol=TOL)
    torch.testing.assert_close(ref["cell"], ref["primitive"], atol=1e-10, rtol=1e-10)


@functools.cache
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("char_tagger",
                                                  ROOT / "examples" / "char_tagger.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain_loss(model: torch.nn.Module, sentences: list) -> Tensor:  # type: ignore[type-arg]
    """The model's modules called one word / character at a time (no batching)."""
    def run(step: torch.nn.Module, xs: list[Tensor], width: int) -> list[Tensor]:
        s, out = torch.zeros(1, width, dtype=torch.float64), []
        for x in xs:
            s = step(x, s)
            out.append(s)
        return out

    total = torch.zeros((), dtype=torch.float64)
    half, hidden = model.char_fwd.hidden, model.fwd.hidden
    for sentence in sentences:
        xs = []
        for w in sentence.words:
            if not model.words.is_rare(w):
                xs.append(model.word_embed.weight[model.words.id(w)][None])
                continue
            cs = [model.char_embed.weight[c][None]
                  for c in model.chars.encode(w, boundaries=True)]
            f = run(model.char_fwd, cs, 2 * half)[-1]
            b = run(model.char_bwd, cs[::-1], 2 * half)[-1]
            xs.append(torch.cat([f[:, :half], b[:, :half]], dim=1))
        fwd, bwd = run(model.fwd, xs, 2 * hidden), run(model.bwd, xs[::-1], 2 * hidden)[::-1]
        for f, b, tag in zip(fwd, bwd, sentence.upos, strict=True):
            total = total + model.scorer(f, b, torch.tensor([UPOS_TAGS.index(tag)]))[0]
    return total


@pytest.mark.parametrize("scheduler", ["depth", "typewise_greedy"])
def test_api_model_equals_unbatched_pytorch_fp64(scheduler: str) -> None:
    mod, wl = example(), workload()
    sentences = list(wl.treebank("dev")[:5])
    torch.manual_seed(0)
    model = mod.CharTagger(wl.words, wl.chars, 4, 6, 5, 4, dtype=torch.float64)
    model.record(sentences)
    out = model.batch.run(scheduler)
    plain = _plain_loss(model, sentences)
    torch.testing.assert_close(out.loss, plain, atol=TOL, rtol=TOL)
    params = list(model.parameters())
    for g, w in zip(torch.autograd.grad(out.loss, params), torch.autograd.grad(plain, params),
                    strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)
    # prediction runs batched too: one tag per word
    tags = model.predict(sentences[:2])
    assert [len(t) for t in tags] == [len(s) for s in sentences[:2]]
