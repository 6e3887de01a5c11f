"""The chain workloads: BiLSTM tagger and LSTM seq2seq graphs match their data.

Expected counts and token ids are derived from the parsers in :mod:`edbatch.data` and the
vocabulary files directly, not from the workloads' pre-encoded instances.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest

from edbatch.data.parallel import load_pairs, load_vocab, pair_files
from edbatch.data.tags import TaggedSentence, load_tagged
from edbatch.errors import GraphError
from edbatch.graph import Graph
from edbatch.schedule import (
    DynetAgendaPolicy,
    PolicyScheduler,
    TypewiseGreedyPolicy,
    depth_schedule,
    lower_bound,
)
from edbatch.workloads import DATA_DIR, LOSS_SUM, Workload, make_workload
from edbatch.workloads.bilstm_tagger import BiLSTMTagger
from edbatch.workloads.seq2seq import Seq2Seq

BATCH = 64
GRANULARITIES = ("cell", "primitive")
CASES = [(name, gran) for name in ("bilstm_tagger", "seq2seq") for gran in GRANULARITIES]
SPLIT = {"bilstm_tagger": "train", "seq2seq": "train"}
IWSLT = DATA_DIR / "iwslt15"


@functools.cache
def workload(name: str, granularity: str) -> Workload:
    return make_workload(name, granularity=granularity)


@functools.cache
def graph(name: str, granularity: str) -> Graph:
    return workload(name, granularity).minibatch(SPLIT[name], range(BATCH))


@functools.cache
def tagged() -> list[TaggedSentence]:
    return load_tagged(DATA_DIR / "tags" / "dev.txt")


def tagger_sentences() -> list[TaggedSentence]:
    """The first BATCH train sentences: the file's first 80% is the train split."""
    return tagged()[:BATCH]


@functools.cache
def word_ids() -> dict[str, int]:
    """Train-split words by frequency, then word; id 0 = unknown."""
    train = tagged()[:len(tagged()) * 8 // 10]
    counts = Counter(w for s in train for w in s.words)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return {w: i + 1 for i, w in enumerate(ranked)}


def names_of(g: Graph) -> np.ndarray:
    return np.array(g.vocab.names)[g.op_ids]


def op_counts(g: Graph) -> Counter[str]:
    return Counter({op.name: int(c) for op, c in zip(g.vocab, g.type_counts, strict=True) if c})


# ---------------------------------------------------------------------- both workloads
@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_minibatch_equals_build_graph(name: str, granularity: str) -> None:
    w = workload(name, granularity)
    merged = graph(name, granularity)
    direct = w.build_graph(w.load(SPLIT[name])[:BATCH])
    merged.validate()
    direct.validate()
    for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "outputs",
                  "depth"):
        np.testing.assert_array_equal(getattr(merged, field), getattr(direct, field), field)
    assert merged.num_instances == BATCH


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_outputs_and_params(name: str, granularity: str) -> None:
    w, g = workload(name, granularity), graph(name, granularity)
    assert g.outputs.tolist() == [g.num_nodes - 1]
    assert g.vocab[int(g.op_ids[-1])].name == LOSS_SUM
    losses = g.operands(g.num_nodes - 1)
    loss_op = {("bilstm_tagger", "cell"): "bilstm.loss", ("seq2seq", "cell"): "seq2seq.loss",
               ("bilstm_tagger", "primitive"): "pick_nll/5",
               ("seq2seq", "primitive"): "pick_nll/7709"}[name, granularity]
    assert set(names_of(g)[losses]) == {loss_op}
    assert len(losses) == int((names_of(g) == loss_op).sum())
    shapes = w.param_shapes()
    prefix = "bilstm." if name == "bilstm_tagger" else "seq2seq."
    assert set(shapes) == {p for op in w.vocab for p in op.params}
    assert all(p.startswith(prefix) for p in shapes)
    other = workload(name, "primitive" if granularity == "cell" else "cell")
    assert other.param_shapes() == shapes


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_schedules_are_valid_and_above_the_lower_bound(name: str, granularity: str) -> None:
    g = graph(name, granularity)
    if granularity == "primitive":  # keep the type-wise frontier bookkeeping cheap
        g = workload(name, granularity).minibatch(SPLIT[name], range(BATCH // 4))
    lb = lower_bound(g)
    for scheduler in (depth_schedule, PolicyScheduler(DynetAgendaPolicy()),
                      PolicyScheduler(TypewiseGreedyPolicy())):
        schedule = scheduler(g)
        schedule.validate(g)
        assert schedule.num_batches >= lb


# ---------------------------------------------------------------------- BiLSTM tagger
def test_tagger_splits_partition_the_file() -> None:
    w = workload("bilstm_tagger", "cell")
    assert isinstance(w, BiLSTMTagger)
    sizes = [len(w.load(s)) for s in w.splits]
    assert w.splits == ("train", "dev", "test") and sizes == [1356, 170, 170]
    loaded = [inst.sentence for s in w.splits for inst in w.load(s)]
    assert loaded == tagged()
    assert w.tag_names == ("I-LOC", "I-MISC", "I-ORG", "I-PER", "O")


def test_tagger_cell_counts_and_attrs() -> None:
    g, sents = graph("bilstm_tagger", "cell"), tagger_sentences()
    total = sum(len(s) for s in sents)
    cells = {f"bilstm.{op}": total for op in ("lookup", "l1_fwd", "l1_bwd", "l2_fwd",
                                              "l2_bwd", "loss")}
    assert op_counts(g) == Counter({**cells, "bilstm.zero_state": 4 * BATCH, LOSS_SUM: 1})
    names = names_of(g)
    ids = word_ids()
    want_words = [ids.get(w, 0) for s in sents for w in s.words]
    assert g.attrs[names == "bilstm.lookup"].tolist() == want_words
    tag_ids = {"I-LOC": 0, "I-MISC": 1, "I-ORG": 2, "I-PER": 3, "O": 4}
    assert g.attrs[names == "bilstm.loss"].tolist() == [tag_ids[t] for s in sents
                                                         for t in s.tags]
    has_attr = np.isin(names, ["bilstm.lookup", "bilstm.loss"])
    assert np.all(g.attrs[~has_attr] == -1)


def test_tagger_cell_operands_of_one_sentence() -> None:
    w = workload("bilstm_tagger", "cell")
    g = w.instance_graph("train", 0)
    n = len(tagger_sentences()[0])
    by_op: dict[str, list[tuple[str, ...]]] = {}
    for v in range(g.num_nodes):
        node = g.node(v)
        by_op.setdefault(node.op.name, []).append(
            tuple(g.node(u).op.name for u in node.operands))
    prev = {"bilstm.zero_state"}
    for d in ("l1_fwd", "l1_bwd"):
        assert all(ops[0] == "bilstm.lookup" and ops[1] in prev | {f"bilstm.{d}"}
                   for ops in by_op[f"bilstm.{d}"])
    for d in ("l2_fwd", "l2_bwd"):
        assert all(ops[:2] == ("bilstm.l1_fwd", "bilstm.l1_bwd")
                   and ops[2] in prev | {f"bilstm.{d}"} for ops in by_op[f"bilstm.{d}"])
    assert by_op["bilstm.loss"] == [("bilstm.l2_fwd", "bilstm.l2_bwd")] * n
    # Chains: forward l1 at position t has depth t + 1, backward l1 at t has depth n - t.
    names = names_of(g)
    assert g.depth[names == "bilstm.l1_fwd"].tolist() == list(range(1, n + 1))
    assert sorted(g.depth[names == "bilstm.l1_bwd"].tolist()) == list(range(1, n + 1))


def test_tagger_primitive_counts() -> None:
    g, sents = graph("bilstm_tagger", "primitive"), tagger_sentences()
    total = sum(len(s) for s in sents)
    # per token: lookup 1 + four 15-node LSTM cells + layer-2 input concat 1 + loss block 5
    # (concat, affine H, tanh, affine O, pick_nll); per sentence: h0 and c0 per chain = 8.
    assert g.num_nodes == 67 * total + 8 * BATCH + 1
    counts = op_counts(g)
    assert counts["zero/128"] == 8 * BATCH and counts["pick_nll/5"] == total
    assert counts["lookup.bilstm.emb"] == total
    for d in ("l1_fwd", "l1_bwd", "l2_fwd", "l2_bwd", "hidden", "out"):
        assert counts[f"affine.bilstm.{d}"] == total


def test_tagger_cell_lower_bound_is_four_chains_plus_four() -> None:
    # lookup 1 + zero_state 1 + loss 1 + the unbatchable final sum 1, plus the longest chain
    # of each of the four LSTM op types (each as long as the longest sentence).
    max_len = max(len(s) for s in tagger_sentences())
    assert lower_bound(graph("bilstm_tagger", "cell")) == 4 * max_len + 4


def test_tagger_vocab_size_keeps_the_most_frequent_words() -> None:
    w = BiLSTMTagger(vocab_size=50)
    assert w.param_shapes()["bilstm.emb"] == (50, 128)
    top = {word for word, i in word_ids().items() if i < 50}
    assert set(w.word_index) == top
    g = w.minibatch("dev", range(8))
    lookups = g.attrs[g.op_ids == w.vocab.id("bilstm.lookup")]
    assert lookups.min() == 0 and lookups.max() < 50
    with pytest.raises(GraphError, match="vocab_size"):
        BiLSTMTagger(vocab_size=0)


# ---------------------------------------------------------------------- seq2seq
@functools.cache
def pair_ids(split: str, cap: int | None = None) -> list[tuple[list[int], list[int]]]:
    src, tgt = load_vocab(IWSLT / "vocab.en"), load_vocab(IWSLT / "vocab.vi")
    if split == "train":
        pairs = load_pairs(IWSLT / "tst2012.en-vi.capped")
    else:
        pairs = pair_files(IWSLT / "tst2013.en.capped", IWSLT / "tst2013.vi", tgt)
    mod = cap or 1 << 62
    return [([src[t] % mod for t in p.source], [tgt[t] % mod for t in p.target])
            for p in pairs]


def test_seq2seq_cell_counts_attrs_and_lower_bound() -> None:
    g, pairs = graph("seq2seq", "cell"), pair_ids("train")[:BATCH]
    sources = sum(len(s) for s, _ in pairs)
    steps = sum(len(t) - 1 for _, t in pairs)
    assert op_counts(g) == Counter({"seq2seq.zero_state": BATCH, "seq2seq.enc": sources,
                                    "seq2seq.dec": steps, "seq2seq.loss": steps, LOSS_SUM: 1})
    names = names_of(g)
    assert g.attrs[names == "seq2seq.enc"].tolist() == [i for s, _ in pairs for i in s]
    assert g.attrs[names == "seq2seq.dec"].tolist() == [i for _, t in pairs for i in t[:-1]]
    assert g.attrs[names == "seq2seq.loss"].tolist() == [i for _, t in pairs for i in t[1:]]
    assert np.all(g.attrs[np.isin(names, ["seq2seq.zero_state", LOSS_SUM])] == -1)
    # zero 1 + loss 1 + final sum 1 + the longest encoder and decoder chains
    longest = max(len(s) for s, _ in pairs) + max(len(t) - 1 for _, t in pairs)
    assert lower_bound(g) == 3 + longest


def test_seq2seq_decoder_starts_from_the_last_encoder_state() -> None:
    g = workload("seq2seq", "cell").instance_graph("train", 1)
    source, target = pair_ids("train")[1]
    first_dec = int(np.flatnonzero(names_of(g) == "seq2seq.dec")[0])
    (u,) = g.operands(first_dec).tolist()
    assert g.node(u).op.name == "seq2seq.enc" and g.node(u).attr == source[-1]
    assert g.node(u).depth == len(source) and g.node(first_dec).attr == target[0]


def test_seq2seq_primitive_counts() -> None:
    g, pairs = graph("seq2seq", "primitive"), pair_ids("train")[:BATCH]
    sources = sum(len(s) for s, _ in pairs)
    steps = sum(len(t) - 1 for _, t in pairs)
    # step = lookup + affine E2H + tanh + 15-node LSTM; loss = affine + pick_nll; h0, c0
    assert g.num_nodes == 18 * sources + 20 * steps + 2 * BATCH + 1
    counts = op_counts(g)
    assert counts["lookup.seq2seq.src_emb"] == counts["affine.seq2seq.enc_e2h"] == sources
    assert counts["lookup.seq2seq.tgt_emb"] == counts["affine.seq2seq.dec_lstm"] == steps
    assert counts["pick_nll/7709"] == steps and counts["zero/128"] == 2 * BATCH


def test_seq2seq_test_split_vocab_cap_and_max_len() -> None:
    w = Seq2Seq(vocab_size=256, max_len=12)
    assert w.splits == ("train", "test")
    assert w.param_shapes()["seq2seq.out"] == (256, 128)
    assert w.param_shapes()["seq2seq.src_emb"] == (256, 128)
    test = w.load("test")
    assert len(test) == 1268
    capped = pair_ids("test", 256)
    for inst, (src, tgt) in zip(test, capped, strict=True):
        assert list(inst.source_ids) == src[:12] and list(inst.target_ids) == tgt[:12]
    g = w.minibatch("test", range(BATCH))
    g.validate()
    attrs = g.attrs[g.attrs >= 0]
    assert attrs.max() < 256
    assert lower_bound(g) <= 3 + 12 + 11
    with pytest.raises(GraphError, match="max_len must be >= 2"):
        Seq2Seq(max_len=1)
