"""Lattice-LSTM / Lattice-GRU: graphs match the lattice files, node for node.

Expected counts are derived from :func:`edbatch.data.lattices.load_lattices` directly, not
from the workload's pre-encoded instances.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import numpy as np
import pytest

from edbatch.data.lattices import Lattice, load_lattices
from edbatch.errors import DataFormatError, GraphError
from edbatch.graph import Graph
from edbatch.schedule import (
    DynetAgendaPolicy,
    PolicyScheduler,
    TypewiseGreedyPolicy,
    depth_schedule,
    lower_bound,
)
from edbatch.workloads import DATA_DIR, LOSS_SUM, make_workload
from edbatch.workloads.lattice import LatticeGRU, LatticeLSTM

SPLIT = "dev"
BATCH = 64
NAMES = ("lattice_lstm", "lattice_gru")
CASES = [(name, gran) for name in NAMES for gran in ("cell", "primitive")]
# Nodes of one primitive cell (see emit_lstm / emit_gru): LSTM = concat, affine, 4 slices,
# 3 sigmoid, 2 tanh, 3 cmult, 1 add; GRU = 2 concat, 2 affine, 2 slices, 2 sigmoid, 1 tanh,
# 3 cmult, 1 one_minus, 1 add.
CELL_NODES = {"lattice_lstm": 15, "lattice_gru": 14}
STATE_PARTS = {"lattice_lstm": 2, "lattice_gru": 1}


@functools.cache
def workload(name: str, granularity: str):  # type: ignore[no-untyped-def]
    return make_workload(name, granularity=granularity)


@functools.cache
def lattices(split: str) -> list[Lattice]:
    return load_lattices(DATA_DIR / "lattice" / f"{split}.txt")


@functools.cache
def graph(name: str, granularity: str) -> Graph:
    return workload(name, granularity).minibatch(SPLIT, range(BATCH))


def in_degrees(lat: Lattice) -> np.ndarray:
    return np.bincount(lat.arc_dst, minlength=lat.num_states)[1:]


def expected_type_counts(name: str, granularity: str, lats: list[Lattice]) -> Counter[str]:
    """Node count per op name, predicted from the parsed lattices."""
    want: Counter[str] = Counter({LOSS_SUM: 1})
    for lat in lats:
        char = int(lat.is_char_arc().sum())
        word = lat.num_arcs - char
        degree = in_degrees(lat)
        if granularity == "cell":
            want[f"{name}.start"] += 1
            want[f"{name}.char_arc"] += char
            want[f"{name}.word_arc"] += word
            for k, c in Counter(degree[degree >= 2].tolist()).items():
                want[f"{name}.sum{k}"] += c
            want[f"{name}.loss"] += lat.num_states - 1
        else:
            want["zero/128"] += STATE_PARTS[name]
            want[f"lookup.{name}.char_emb"] += char
            want[f"lookup.{name}.word_emb"] += word
            want[f"affine.{name}.out"] += lat.num_states - 1
            want["pick_nll/18"] += lat.num_states - 1
            want["<state sums>"] += STATE_PARTS[name] * int((degree - 1).sum())
            want["<arc cells>"] += CELL_NODES[name] * lat.num_arcs
    return want


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_minibatch_equals_build_graph(name: str, granularity: str) -> None:
    w = workload(name, granularity)
    merged = graph(name, granularity)
    direct = w.build_graph(w.load(SPLIT)[:BATCH])
    direct.validate()
    merged.validate()
    for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance", "outputs",
                  "depth"):
        np.testing.assert_array_equal(getattr(merged, field), getattr(direct, field), field)
    assert merged.vocab == direct.vocab == w.vocab


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_node_counts_follow_the_data(name: str, granularity: str) -> None:
    g = graph(name, granularity)
    want = expected_type_counts(name, granularity, lattices(SPLIT)[:BATCH])
    got = Counter({op.name: int(c) for op, c in zip(g.vocab, g.type_counts, strict=True) if c})
    if granularity == "primitive":
        # add/128 serves both the state sums and the LSTM/GRU cells; compare totals instead.
        cells = want.pop("<arc cells>") + want.pop("<state sums>")
        explicit = sum(want.values())
        assert g.num_nodes == explicit + cells
        got = Counter({k: v for k, v in got.items() if k in want})
    assert got == want
    assert g.num_instances == BATCH


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_attrs_outputs_and_params(name: str, granularity: str) -> None:
    w, g = workload(name, granularity), graph(name, granularity)
    lats = lattices(SPLIT)[:BATCH]
    names = np.array(g.vocab.names)[g.op_ids]
    loss = f"{name}.loss" if granularity == "cell" else "pick_nll/18"
    np.testing.assert_array_equal(g.attrs[names == loss],
                                  np.concatenate([lat.tags[1:] for lat in lats]))
    for kind, table in (("char", "char_arc"), ("word", "word_arc")):
        op = f"{name}.{table}" if granularity == "cell" else f"lookup.{name}.{kind}_emb"
        tokens = np.concatenate(
            [lat.arc_token[lat.is_char_arc() == (kind == "char")] for lat in lats]) % 256
        assert sorted(g.attrs[names == op].tolist()) == sorted(tokens.tolist())
    with_attr = np.isin(names, [loss, *(n for n in g.vocab.names if "arc" in n or "lookup" in n)])
    assert np.all(g.attrs[~with_attr] == -1)
    assert g.outputs.tolist() == [g.num_nodes - 1]
    assert g.vocab[int(g.op_ids[-1])].name == LOSS_SUM
    assert sorted(g.operands(g.num_nodes - 1).tolist()) == np.flatnonzero(names == loss).tolist()
    shapes = w.param_shapes()
    assert all(p in shapes and p.startswith(name + ".") for op in w.vocab for p in op.params)
    assert set(shapes) == {p for op in w.vocab for p in op.params}
    other = workload(name, "primitive" if granularity == "cell" else "cell")
    assert other.param_shapes() == shapes


@pytest.mark.parametrize("name", NAMES)
def test_cell_loss_depths_follow_the_lattice(name: str) -> None:
    # start: depth 0; an arc: its source state + 1; a state with k >= 2 arcs: its deepest
    # arc + 1 (the sum); a loss: its state + 1.
    g = graph(name, "cell")
    want: list[int] = []
    for lat in lattices(SPLIT)[:BATCH]:
        depth = [0] * lat.num_states
        for i in range(1, lat.num_states):
            arcs = lat.arc_src[lat.arc_dst == i]
            depth[i] = max(depth[j] + 1 for j in arcs.tolist()) + (len(arcs) >= 2)
        want.extend(d + 1 for d in depth[1:])
    losses = g.operands(int(g.outputs[0]))
    np.testing.assert_array_equal(g.depth[losses], want)


def longest_type_chains(lat: Lattice, max_in_degree: int) -> Counter[str]:
    """Per cell op type, the most nodes of that type on one path (lattice DP)."""
    kinds = ["char", "word", *(f"sum{k}" for k in range(2, max_in_degree + 1))]
    col = {k: i for i, k in enumerate(kinds)}
    best = np.zeros((lat.num_states, len(kinds)), dtype=np.int64)
    char = lat.is_char_arc()
    for i in range(1, lat.num_states):
        arcs = np.flatnonzero(lat.arc_dst == i)
        values = best[lat.arc_src[arcs]].copy()
        values[np.arange(len(arcs)), np.where(char[arcs], col["char"], col["word"])] += 1
        best[i] = values.max(axis=0)
        if len(arcs) >= 2:
            best[i, col[f"sum{len(arcs)}"]] += 1
    return Counter({k: int(best[:, col[k]].max()) for k in kinds})


@pytest.mark.parametrize("name", NAMES)
def test_cell_lower_bound_matches_the_lattice_dp(name: str) -> None:
    g = graph(name, "cell")
    chains: Counter[str] = Counter()
    for lat in lattices(SPLIT)[:BATCH]:
        chains |= longest_type_chains(lat, 16)
    # start 1 + loss 1 + the unbatchable final sum 1
    assert lower_bound(g) == 3 + sum(chains.values())


@pytest.mark.parametrize(("name", "granularity"), CASES)
def test_schedules_are_valid_and_above_the_lower_bound(name: str, granularity: str) -> None:
    g = graph(name, granularity)
    if granularity == "primitive":  # keep the type-wise frontier bookkeeping cheap
        g = workload(name, granularity).minibatch(SPLIT, range(BATCH // 4))
    lb = lower_bound(g)
    counts = []
    for scheduler in (depth_schedule, PolicyScheduler(DynetAgendaPolicy()),
                      PolicyScheduler(TypewiseGreedyPolicy())):
        schedule = scheduler(g)
        schedule.validate(g)
        counts.append(schedule.num_batches)
    assert min(counts) >= lb


def first_state_above(split: str, degree: int) -> tuple[int, int, int]:
    """(lattice index, state, in-degree) of the first state with more than ``degree`` arcs."""
    for index, lat in enumerate(lattices(split)):
        deg = in_degrees(lat)
        over = np.flatnonzero(deg > degree)
        if len(over):
            return index, int(over[0]) + 1, int(deg[over[0]])
    raise AssertionError("no such state")


@pytest.mark.parametrize("cls", [LatticeLSTM, LatticeGRU])
def test_too_many_incoming_arcs_name_the_lattice_and_state(cls: type) -> None:
    w = cls(max_in_degree=2)
    assert f"{w.name}.sum2" in w.vocab and f"{w.name}.sum3" not in w.vocab
    index, state, degree = first_state_above(SPLIT, 2)
    with pytest.raises(GraphError, match=re.escape(
            f"lattice #{index} of split '{SPLIT}': state {state} has {degree} incoming arcs")):
        w.minibatch(SPLIT, range(index + 1))
    w.minibatch(SPLIT, range(index))  # the lattices before it fit
    # Primitive granularity sums with binary adds and has no arity limit.
    cls(granularity="primitive", max_in_degree=2).minibatch(SPLIT, [index])


def test_bad_constructor_arguments() -> None:
    with pytest.raises(GraphError, match="hidden_dim must be a positive int"):
        LatticeLSTM(hidden_dim=0)
    with pytest.raises(KeyError, match="granularity"):
        LatticeGRU(granularity="cells")
    w = LatticeLSTM(num_tags=3)
    with pytest.raises(DataFormatError,
                       match=r"dev\.txt:\d+: found tag \d+ for state \d+ of lattice #0"):
        w.load("dev")


def test_vocab_size_caps_token_ids_and_table_rows() -> None:
    w = LatticeGRU(vocab_size=7)
    assert w.param_shapes()["lattice_gru.word_emb"] == (7, 128)
    g = w.minibatch(SPLIT, range(4))
    arcs = np.isin(g.op_ids, [w.vocab.id("lattice_gru.char_arc"),
                              w.vocab.id("lattice_gru.word_arc")])
    assert g.attrs[arcs].min() >= 0 and g.attrs[arcs].max() < 7
