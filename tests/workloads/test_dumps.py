"""DumpWorkload: loading ED-Batch's graph dumps, and the batch counts of
docs/architecture.md 3.11."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edbatch.data.dumps import load_dump
from edbatch.errors import DataFormatError, GraphError
from edbatch.graph import Graph
from edbatch.schedule import (
    DynetAgendaPolicy,
    PolicyScheduler,
    TypewiseGreedyPolicy,
    depth_schedule,
    lower_bound,
    run_policy,
    typewise_greedy_backward,
)
from edbatch.workloads import DATA_DIR, GraphSampler, make_workload
from edbatch.workloads.dumps import DumpWorkload, dump_vocab, graph_from_dump

FOLDERS = ("mvrnn_B1", "bilstm_B1")

#: docs/architecture.md 3.11, batch 1, mean over the test graphs G1..G9: (LB, DyNet agenda, depth).
EXPECTED = {"mvrnn_B1": (12.0, 19.7, 20.0), "bilstm_B1": (107.8, 121.1, 135.8)}


@pytest.fixture(scope="module", params=FOLDERS)
def workload(request: pytest.FixtureRequest) -> DumpWorkload:
    return DumpWorkload(request.param)


def _read_plain(path: Path) -> list[tuple[int, list[int]]]:
    """An independent reader: (type, args) per node line."""
    lines = path.read_text().split("\n")
    n = int(lines[0])
    out = []
    for line in lines[1:n + 1]:
        fields = [int(x) for x in line.split()]
        assert fields[1] == len(fields) - 2
        out.append((fields[0], fields[2:]))
    return out


def test_all_twenty_dumps_load_with_file_node_ids() -> None:
    count = 0
    for folder in FOLDERS:
        w = DumpWorkload(folder)
        assert len(w.load("all")) == 10
        for k, g in enumerate(w.graphs()):
            nodes = _read_plain(DATA_DIR / "graphs" / folder / f"G{k}.txt")
            assert g.num_nodes == len(nodes)
            assert g.op_ids.tolist() == [t for t, _ in nodes]
            assert all(g.operands(v).tolist() == args for v, (_, args) in enumerate(nodes))
            users = np.bincount(g.operand_ids, minlength=g.num_nodes)
            assert g.outputs.tolist() == np.flatnonzero(users == 0).tolist()
            g.validate()
            count += 1
    assert count == 20


def test_vocab_is_abstract_with_unbatchable_type0(workload: DumpWorkload) -> None:
    top = max(int(d.types.max()) for d in workload.dumps)
    assert len(workload.vocab) == top + 1
    assert workload.vocab.names[:2] == ("type0", "type1")
    assert not workload.vocab[0].batchable
    assert all(op.batchable and op.kind == "abstract" and op.in_shapes is None
               and op.out_shape == () for op in workload.vocab[1:])


@pytest.mark.parametrize("folder", FOLDERS)
def test_design_6_2_batch_counts_on_the_test_graphs(folder: str) -> None:
    _, test = DumpWorkload(folder).protocol_split(1)
    assert len(test) == 9
    agenda = PolicyScheduler(DynetAgendaPolicy())
    lb = [lower_bound(g) for g in test]
    means = (np.mean(lb), np.mean([agenda(g).num_batches for g in test]),
             np.mean([depth_schedule(g).num_batches for g in test]))
    assert tuple(round(float(m), 1) for m in means) == EXPECTED[folder]
    for g, bound in zip(test, lb, strict=True):
        assert run_policy(g, TypewiseGreedyPolicy()).num_batches == bound
        assert typewise_greedy_backward(g).num_batches == bound


def test_too_small_num_types_names_file_node_and_fix() -> None:
    with pytest.raises(DataFormatError,
                       match=r"G\d+\.txt:\d+: found type \d+ for node \d+.*raise num_types"):
        DumpWorkload("bilstm_B1", num_types=9)
    dump = load_dump(DATA_DIR / "graphs" / "mvrnn_B1" / "G1.txt")
    with pytest.raises(DataFormatError, match=r"G1\.txt:33: found type 5 for node 31"):
        graph_from_dump(dump, dump_vocab(5))
    with pytest.raises(GraphError, match="num_types must be >= 1"):
        dump_vocab(0)


def test_type_outside_the_vocabulary_names_file_line_value_and_fix(tmp_path) -> None:
    path = tmp_path / "G0.txt"
    path.write_text("3\n1 0\n2 0\n7 2 0 1\n", encoding="utf-8")  # node 2 (line 4): type 7
    dump = load_dump(path)
    assert graph_from_dump(dump, dump_vocab(8)).num_nodes == 3
    with pytest.raises(DataFormatError) as info:
        graph_from_dump(dump, dump_vocab(4))
    assert str(info.value).startswith(f"{path}:4: found type 7 for node 2; expected a type "
                                      f"id in 0..3")
    assert "raise num_types to at least 8" in str(info.value)


def test_shared_vocabulary_across_folders() -> None:
    a, b = DumpWorkload("mvrnn_B1", num_types=24), DumpWorkload("bilstm_B1", num_types=24)
    assert a.vocab == b.vocab and len(a.vocab) == 24


def test_splits_and_protocol(workload: DumpWorkload) -> None:
    assert workload.splits == ("all", "train", "test")
    assert workload.load("train") == workload.dumps[:1]
    assert workload.load("test") == workload.dumps[1:]
    assert workload.load("first:3") == workload.dumps[:3]
    assert workload.load("rest:3") == workload.dumps[3:]
    train, test = workload.protocol_split(2)
    assert [g.num_nodes for g in train + test] == [d.num_nodes for d in workload.dumps]
    with pytest.raises(GraphError, match="0 <= k <= 10"):
        workload.protocol_split(11)
    with pytest.raises(KeyError, match="no split 'dev'"):
        workload.load("dev")
    with pytest.raises(IndexError, match="out of range"):
        workload.instance_graph("train", 1)


def test_minibatch_merges_dumps_and_matches_emit(workload: DumpWorkload) -> None:
    graphs = workload.graphs()
    mb = workload.minibatch("all", [1, 2, 3])
    assert mb.num_nodes == sum(graphs[i].num_nodes for i in (1, 2, 3))
    assert mb.num_instances == 3 and len(mb.vocab) == len(workload.vocab)
    built = workload.build_graph(workload.load("all")[1:4])
    for field in ("op_ids", "operand_ptr", "operand_ids", "instance", "outputs", "depth"):
        assert np.array_equal(getattr(mb, field), getattr(built, field)), field
    assert lower_bound(mb) <= sum(lower_bound(graphs[i]) for i in (1, 2, 3))
    batches = list(workload.batches("all", 4))
    assert [g.num_instances for g in batches] == [4, 4, 2]


def test_instance_graph_is_cached_and_equals_single_emit(workload: DumpWorkload) -> None:
    g = workload.instance_graph("all", 4)
    assert workload.instance_graph("test", 3) is g
    built: Graph = workload.build_graph([workload.dumps[4]])
    assert np.array_equal(built.operand_ids, g.operand_ids)
    assert np.array_equal(built.depth, g.depth)


def test_registry_sampler_and_folder_lookup(tmp_path: Path) -> None:
    w = make_workload("dumps", folder=DATA_DIR / "graphs" / "mvrnn_B1")
    assert isinstance(w, DumpWorkload) and w.name == "dumps"
    sampler = GraphSampler(w, "all", 3)
    assert sampler(np.random.default_rng(0)).num_instances == 3
    with pytest.raises(FileNotFoundError, match="Did you mean 'mvrnn_B1'"):
        DumpWorkload("mvrnn_B2")
    with pytest.raises(KeyError, match="granularity"):
        DumpWorkload("mvrnn_B1", granularity="cells")
    (tmp_path / "G0.txt").write_text("2\n1 0\n2 1 0\n")
    own = DumpWorkload(tmp_path)
    assert own.graphs()[0].operand_ids.tolist() == [0] and len(own.vocab) == 3


def test_save_dump_round_trips_the_file_bytes(tmp_path: Path) -> None:
    from edbatch.data.dumps import save_dump

    src = DATA_DIR / "graphs" / "bilstm_B1" / "G3.txt"
    d = load_dump(src)
    out = save_dump(tmp_path / "G3.txt", d.types, d.arg_ptr, d.args)
    assert _read_plain(out) == _read_plain(src)
    with pytest.raises(ValueError, match="node 1 has argument 1, which is not an earlier"):
        save_dump(tmp_path / "bad.txt", np.array([1, 1]), np.array([0, 0, 1]), np.array([1]))
    assert not (tmp_path / "bad.txt").exists()


def test_export_dumps_keeps_structure_and_merges_types(tmp_path: Path) -> None:
    """A lattice mini-batch exported with ED-Batch's condensation (one sum type) reloads as
    the same DAG; the merged vocabulary keeps the other types apart."""
    from edbatch.workloads.dumps import export_dumps

    wl = make_workload("lattice_lstm")
    graphs = list(wl.batches("dev", 8, limit=2))
    export_dumps(graphs, tmp_path, merge=[(r".*\.sum[0-9]+", "sum")])
    back = DumpWorkload(tmp_path)
    assert len(back.dumps) == 2
    for g, d in zip(graphs, back.dumps):
        assert d.args.tolist() == g.operand_ids.tolist()
        names = np.array(g.vocab.names)[g.op_ids]
        sums = np.char.find(names.astype(str), ".sum") >= 0
        assert len(set(d.types[sums].tolist())) == 1  # every arity -> one signature
        others = {n: set(d.types[names == n].tolist()) for n in set(names[~sums].tolist())}
        assert all(len(t) == 1 for t in others.values())
        assert len({next(iter(t)) for t in others.values()}) == len(others)
    with pytest.raises(ValueError, match="one vocabulary"):
        export_dumps([graphs[0], next(iter(make_workload("tree_lstm").batches("dev", 2,
                                                                                limit=1)))],
                     tmp_path / "x")
