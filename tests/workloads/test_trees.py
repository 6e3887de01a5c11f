"""The SST tree workloads (Tree-LSTM, Tree-GRU, MV-RNN) at both granularities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edbatch.data.trees import Tree
from edbatch.errors import DataFormatError, UnknownNameError
from edbatch.graph import Graph
from edbatch.schedule import (
    PolicyScheduler,
    TypewiseGreedyPolicy,
    depth_schedule,
    lower_bound,
)
from edbatch.workloads import LOSS_SUM, make_workload
from edbatch.workloads._trees import TreeWorkload
from edbatch.workloads.mvrnn import MVRNN
from edbatch.workloads.tree_gru import TreeGRU
from edbatch.workloads.tree_lstm import TreeLSTM

NAMES = ("tree_lstm", "tree_gru", "mvrnn")
GRANULARITIES = ("cell", "primitive")
BATCH = 64
#: Primitive nodes per pre-terminal and per binary node (a loss is 2 nodes everywhere).
PRIMITIVE_COST = {"tree_lstm": (11, 19), "tree_gru": (8, 19), "mvrnn": (2, 7)}
#: Word lookups per pre-terminal at primitive granularity (MV-RNN looks up v and M).
LOOKUPS_PER_WORD = {"tree_lstm": 1, "tree_gru": 1, "mvrnn": 2}


def _postorder(tree: Tree) -> list[Tree]:
    out: list[Tree] = []
    for child in tree.children:
        out.extend(_postorder(child))
    out.append(tree)
    return out


def _internal_chain(tree: Tree) -> int:
    """Most binary internal nodes on a root-to-leaf path."""
    if not tree.children:
        return 0
    below = max(_internal_chain(c) for c in tree.children)
    return below + (len(tree.children) == 2)


def _dims(name: str) -> dict[str, int | None]:
    return {"hidden_dim": 16, "embed_dim": None if name == "mvrnn" else 8}


@pytest.fixture(scope="module", params=[(n, g) for n in NAMES for g in GRANULARITIES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def workload(request: pytest.FixtureRequest) -> TreeWorkload:
    name, granularity = request.param
    wl = make_workload(name, granularity=granularity, **_dims(name))
    assert isinstance(wl, TreeWorkload)
    return wl


@pytest.fixture(scope="module")
def graphs(workload: TreeWorkload) -> tuple[Graph, Graph]:
    instances = workload.load("dev")
    return workload.minibatch("dev", range(BATCH)), workload.build_graph(instances[:BATCH])


def test_minibatch_equals_build_graph(workload: TreeWorkload, graphs: tuple[Graph, Graph]) -> None:
    merged, built = graphs
    for g in (merged, built):
        g.validate()
        assert g.vocab is workload.vocab
        assert g.outputs.tolist() == [g.num_nodes - 1]
        assert workload.vocab[int(g.op_ids[-1])].name == LOSS_SUM
    for attr in ("op_ids", "operand_ptr", "operand_ids", "attrs", "depth", "instance"):
        assert np.array_equal(getattr(merged, attr), getattr(built, attr)), attr


def test_node_counts_follow_tree_sizes(workload: TreeWorkload, graphs: tuple[Graph, Graph]) -> None:
    trees = [inst.tree for inst in workload.load("dev")[:BATCH]]
    num_nodes = sum(t.num_nodes for t in trees)
    num_leaves = sum(len(t.leaves()) for t in trees)
    num_binary = sum(1 for t in trees for n in _postorder(t) if len(n.children) == 2)
    if workload.granularity == "cell":
        want = 2 * num_nodes + 1
    else:
        leaf, internal = PRIMITIVE_COST[workload.name]
        want = leaf * num_leaves + internal * num_binary + 2 * num_nodes + 1
    g = graphs[1]
    assert g.num_nodes == want
    assert g.num_edges == g.arity.sum()
    assert len(g.operands(g.num_nodes - 1)) == num_nodes  # one loss per tree node
    assert sorted(set(g.instance.tolist())) == list(range(BATCH))


def test_attrs_are_word_ids_and_labels(workload: TreeWorkload, graphs: tuple[Graph, Graph]) -> None:
    g, vocab = graphs[1], workload.vocab
    trees = [inst.tree for inst in workload.load("dev")[:BATCH]]
    words = [workload.word_vocab.id(w) for t in trees for w in t.leaves()]
    labels = [n.label for t in trees for n in _postorder(t)]
    kinds = np.array([op.kind for op in vocab])[g.op_ids]
    if workload.granularity == "cell":
        word_nodes = g.op_ids == vocab.id(f"{workload.name}.leaf")
        label_nodes = g.op_ids == vocab.id(f"{workload.name}.loss")
        per_word = 1
    else:
        word_nodes, label_nodes = kinds == "lookup", kinds == "pick_nll"
        per_word = LOOKUPS_PER_WORD[workload.name]
    attrs = g.attrs
    assert np.all((attrs[word_nodes] >= 0) & (attrs[word_nodes] < workload.num_words))
    assert np.repeat(words, per_word).tolist() == attrs[word_nodes].tolist()
    assert attrs[label_nodes].tolist() == labels
    assert set(attrs[label_nodes].tolist()) <= set(range(5))
    assert np.all(attrs[~(word_nodes | label_nodes)] == -1)
    rows = workload.param_shapes()[f"{workload.name}.E" if workload.name != "mvrnn"
                                   else "mvrnn.E_v"][0]
    assert rows == workload.num_words == len(workload.word_vocab)


def test_params_named_and_shared_across_granularities(workload: TreeWorkload) -> None:
    shapes = workload.param_shapes()
    used = {p for op in workload.vocab for p in op.params}
    assert used == set(shapes)
    assert all(p.startswith(f"{workload.name}.") for p in used)
    other = "primitive" if workload.granularity == "cell" else "cell"
    twin = make_workload(workload.name, granularity=other, **_dims(workload.name))
    assert twin.param_shapes() == shapes


@pytest.mark.parametrize("name", NAMES)
def test_cell_lower_bound_and_typewise_greedy(name: str) -> None:
    wl = make_workload(name)
    g = wl.minibatch("dev", range(BATCH))
    trees = [inst.tree for inst in wl.load("dev")[:BATCH]]
    # final sum + one leaf batch + the longest internal chain + one loss batch
    want = 1 + 1 + max(_internal_chain(t) for t in trees) + 1
    assert lower_bound(g) == want
    assert PolicyScheduler(TypewiseGreedyPolicy())(g).num_batches == want
    assert depth_schedule(g).num_batches >= want


def test_word_vocab_is_ranked_by_train_frequency() -> None:
    wl = TreeLSTM(vocab_size=50, hidden_dim=4, embed_dim=4)
    words = wl.word_vocab.words
    assert len(wl.word_vocab) == wl.num_words == 50 and words[0] == "<unk>"
    assert wl.param_shapes()["tree_lstm.E"] == (50, 4)
    full = TreeLSTM(hidden_dim=4, embed_dim=4).word_vocab
    assert full.words[:50] == words and len(full) > 10_000
    assert wl.word_vocab.id(words[7]) == 7 and wl.word_vocab.id(full.words[60]) == 0
    g = wl.minibatch("dev", range(8))
    assert g.attrs[g.op_ids == 0].max() < 50


@pytest.mark.parametrize("cls", [TreeLSTM, TreeGRU, MVRNN])
def test_unknown_granularity_and_split(cls: type) -> None:
    with pytest.raises(UnknownNameError, match="granularity"):
        cls(granularity="blocks")
    with pytest.raises(UnknownNameError, match="split"):
        cls(hidden_dim=4).load("validation")


def test_mvrnn_embed_dim_must_match_hidden_dim() -> None:
    with pytest.raises(ValueError, match="embed_dim must equal hidden_dim"):
        MVRNN(embed_dim=128, hidden_dim=32)


def _data_dir(tmp_path: Path, dev: str) -> Path:
    (tmp_path / "trees").mkdir()
    (tmp_path / "trees" / "train.txt").write_text("(2 (2 a) (3 b))\n")
    (tmp_path / "trees" / "dev.txt").write_text(dev)
    (tmp_path / "trees" / "test.txt").write_text("(2 (2 a) (3 b))\n")
    return tmp_path


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_unary_node_passes_its_child_state_through(tmp_path: Path, granularity: str) -> None:
    wl = TreeLSTM(granularity, hidden_dim=4, embed_dim=4,
                  data_dir=_data_dir(tmp_path, "(3 (4 (2 a) (1 zebra)))\n"))
    (inst,) = wl.load("dev")
    assert (inst.num_nodes, inst.num_leaves, inst.num_binary, inst.num_unary) == (4, 2, 1, 1)
    g = wl.build_graph([inst])
    # 2 leaves + 1 binary node + 4 losses + the sum
    assert g.num_nodes == (8 if granularity == "cell" else 2 * 11 + 19 + 4 * 2 + 1)
    losses = g.operands(g.num_nodes - 1)
    assert g.attrs[losses].tolist() == [2, 1, 4, 3]

    def state_of(loss: int) -> int:  # cell: loss(state); primitive: pick_nll(affine(h))
        u = int(g.operands(loss)[0])
        return u if granularity == "cell" else int(g.operands(u)[0])

    # The unary root's loss reads the same state as its child's loss.
    assert state_of(int(losses[3])) == state_of(int(losses[2]))
    assert set(g.attrs[g.op_ids == 0].tolist()) == {1, 0}  # "zebra" is unknown


@pytest.mark.parametrize("dev, found", [
    ("(2 (2 a) (2 b))\n\n(1 (2 a) (2 b) (3 a))\n", "3 children"),
    ("(2 (7 a) (2 b))\n", "label 7"),
])
def test_bad_trees_are_reported_with_their_line(tmp_path: Path, dev: str, found: str) -> None:
    wl = TreeGRU(hidden_dim=4, embed_dim=4, data_dir=_data_dir(tmp_path, dev))
    line = dev.count("\n")
    with pytest.raises(DataFormatError, match=rf"dev\.txt:{line}: found .*{found}"):
        wl.load("dev")


@pytest.mark.parametrize("name", ["tree_lstm", "tree_gru", "mvrnn"])
@pytest.mark.parametrize("loss_sum", [True, False])
def test_vectorised_cell_build_equals_the_builder(name: str, loss_sum: bool) -> None:
    from edbatch.workloads.base import Workload

    wl = make_workload(name, granularity="cell", embed_dim=4, hidden_dim=4)
    dev = wl.load("dev")
    for chunk in (dev[:1], dev[:64], dev[200:300]):
        fast = wl.build_graph(chunk, loss_sum=loss_sum)
        slow = Workload.build_graph(wl, chunk, loss_sum=loss_sum)
        for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "outputs",
                      "depth"):
            assert np.array_equal(getattr(fast, field), getattr(slow, field)), field
