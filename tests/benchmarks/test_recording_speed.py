"""``benchmarks/recording_speed.py``: its user-cell models record what they say, and a second
copy of ``edbatch.api`` loads beside this one (nothing about speed is asserted)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import edbatch.api
from benchmarks import recording_speed as rs
from edbatch.workloads import make_workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trees() -> tuple[object, list]:  # type: ignore[type-arg]
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=4)
    return wl, list(wl.load("train")[:3])


@pytest.mark.parametrize("model", ["tree_cells", "childsum_cells"])
def test_user_cell_models_record_a_node_and_a_loss_per_tree_node(trees, model: str) -> None:
    wl, instances = trees
    batch, record = rs.make_recorder(edbatch.api, model, wl, 4)
    seconds, nodes = rs.time_recording(batch, record, [instances])
    tree_nodes = sum(inst.tree.num_nodes for inst in instances)
    # tree_cells: a state and a loss per tree node; childsum: also an input per tree node
    assert nodes == (3 if model == "childsum_cells" else 2) * tree_nodes
    assert seconds >= 0 and not batch._rec.ops  # discarded after timing


def test_a_baseline_api_loads_beside_this_one(tmp_path: Path, trees, capsys) -> None:
    shutil.copytree(ROOT / "edbatch" / "api", tmp_path / "edbatch" / "api")
    other = rs.load_api(tmp_path)
    assert other.__file__.startswith(str(tmp_path)) and other is not edbatch.api
    assert other.DynamicBatch is not edbatch.api.DynamicBatch
    import edbatch.api as again

    assert again is edbatch.api  # this checkout's stays in place
    wl, instances = trees
    batch, record = rs.make_recorder(other, "tree_lstm", wl, 4)
    assert rs.time_recording(batch, record, [instances])[1] > 0
    rs.main(["--models", "tree_lstm", "--minibatches", "1", "--rounds", "1", "--baseline",
             str(tmp_path)])
    assert "ratio" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="found no edbatch/api"):
        rs.load_api(tmp_path / "nowhere")


def test_assemble_times_the_graph_too(trees, monkeypatch, capsys) -> None:
    wl, instances = trees
    batch, record = rs.make_recorder(edbatch.api, "tree_lstm", wl, 4)
    built = []
    graph = batch.graph
    monkeypatch.setattr(batch, "graph", lambda: built.append(graph()[0]))
    for assemble in (False, True):
        _, nodes = rs.time_recording(batch, record, [instances], assemble)
        assert len(built) == assemble and nodes > 0 and not batch._rec.ops
    assert built[0].num_nodes == nodes + 1  # and the loss sum
    rs.main(["--models", "tree_lstm", "--minibatches", "1", "--rounds", "1", "--assemble"])
    assert "graph assembly included" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["tree_lstm", "tree_cells", "childsum_cells"])
def test_breakdown_times_each_phase_and_the_stub_records_nothing(trees, model: str,
                                                                 capsys) -> None:
    wl, instances = trees
    out = rs.time_breakdown(model, wl, 4, [instances])
    want = (3 if model == "childsum_cells" else 2) * sum(i.tree.num_nodes for i in instances)
    assert out["nodes"] == want
    assert all(out[k] >= 0 for k in ("record", "assemble", "end", "floor"))
    batch, _ = rs.make_recorder(edbatch.api, "tree_lstm", wl, 4)
    stub = rs.StubBatch(batch)
    from benchmarks.models_api import RECORDERS

    RECORDERS["tree_lstm"](stub, wl, instances)  # type: ignore[arg-type]
    assert not batch._rec.ops and len(batch._rec.marks) == 2 * len(instances)
    rs.main(["--models", model, "--minibatches", "1", "--rounds", "1", "--breakdown"])
    assert "floor" in capsys.readouterr().out
