"""The data modes of ``benchmarks/throughput.py`` and running it as README writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._throughput_data import minibatch_plan
from edbatch.workloads import make_workload

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_reshuffled_mode_never_repeats_a_structure_within_a_run(name: str) -> None:
    wl = make_workload(name, granularity="cell", embed_dim=4, hidden_dim=3)
    n = len(wl.load("train"))
    train = wl.load("train")
    keys = []
    for seed in (0, 1):  # the two modes of a run use seeds s and s + 1
        plan = minibatch_plan("reshuffled", n, 100, 64, 2, 3, seed)
        assert len(plan) == 3 and all(len(p) == 2 for p in plan)
        assert all(len(b) == 64 and len(set(b)) == 64 for p in plan for b in p)
        keys += [wl.build_graph([train[i] for i in b]).structure_key() for p in plan for b in p]
    assert len(set(keys)) == len(keys) == 12
    again = minibatch_plan("reshuffled", n, 100, 64, 2, 3, 0)
    assert again == minibatch_plan("reshuffled", n, 100, 64, 2, 3, 0)  # seeded


def test_repeated_mode_repeats_the_first_eval_minibatches() -> None:
    plan = minibatch_plan("repeated", 1000, 130, 64, 0, 2)
    assert plan[0] == plan[1] == [list(range(64)), list(range(64, 128)), [128, 129]]
    with pytest.raises(ValueError, match="shuffled"):
        minibatch_plan("shuffled", 1000, 130, 64, 0, 2)


def test_reshuffled_epochs_continue_past_one_permutation() -> None:
    plan = minibatch_plan("reshuffled", 100, 10, 10, 6, 3)  # 180 draws from 100 instances
    flat = [b for p in plan for b in p]
    assert len(flat) == 18 and len({tuple(b) for b in flat}) == 18


def test_the_script_runs_from_another_folder_without_pythonpath(tmp_path: Path) -> None:
    """``python benchmarks/throughput.py`` as README writes it (it once failed with
    ``ModuleNotFoundError: No module named 'benchmarks'``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "t.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--workloads",
           "tree_lstm", "--sizes", "8x6", "--minibatches", "1", "--repeats", "1", "--warmup",
           "0", "--modes", "infer", "--contenders", "depth", "pytorch_hand", "floor",
           "--no-dynet", "--out", str(out), "--plot", str(tmp_path / "t.png")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["contender"] for r in rows} == {"depth", "pytorch_hand", "floor"}
    assert all(r["data"] == "reshuffled" for r in rows)
    assert "reshuffled mini-batches" in proc.stdout


@pytest.mark.parametrize("name, hoisted", [("tree_lstm", False), ("lattice_lstm", True),
                                           ("bilstm_tagger", True)])
def test_the_floor_lists_the_hoisted_programs_gemms_with_the_same_multiply_adds(
        name: str, hoisted: bool) -> None:
    """Hoisting regroups an LSTM cell's products (one ``W_x`` projection over many batches,
    one ``W_h`` per batch), it adds none: the floor's multiply-adds stay those of the
    per-batch cells; Tree-LSTM has no hoisted cell, so its list is unchanged."""
    from benchmarks._throughput_data import Gemm, gemm_shapes
    from edbatch.schedule import make_scheduler

    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    graph = wl.build_graph(wl.load(wl.default_eval_split)[:6])
    schedule = make_scheduler("critical_path")(graph)
    default = gemm_shapes(graph, schedule, wl.param_shapes())
    cells = gemm_shapes(graph, schedule, wl.param_shapes(), hoist=False)
    assert len(cells) == sum(1 for b in schedule.batches
                             for p in graph.vocab[b.op_id].params
                             if len(wl.param_shapes()[p]) == 2 and not p.endswith((".E", "emb")))

    def macs(shapes: list[Gemm]) -> int:
        return sum(g.rows * g.inputs * g.outputs for g in shapes)

    assert macs(default) == macs(cells)
    assert (default != cells) == hoisted
    if hoisted:  # the projections come on top of one (narrower) product per batch
        assert len(default) > len(cells)


def _cell_macs(graph: object, schedule: object, shapes: dict) -> int:
    """The multiply-adds of the schedule's per-batch cells, counted from its batches."""
    return sum(len(b.node_ids) * shapes[p][0] * shapes[p][1]
               for b in schedule.batches for p in graph.vocab[b.op_id].params  # type: ignore
               if len(shapes[p]) == 2 and not p.endswith((".E", "emb")))


@pytest.mark.parametrize("name", ["tree_lstm", "lattice_lstm", "bilstm_tagger"])
def test_the_floor_times_every_product_of_the_schedule_on_the_models_weights(
        name: str) -> None:
    """The floor's forward products are the listed GEMMs (shape for shape), their
    multiply-adds those of the schedule's batches; in training ``dY W`` per product and one
    ``dY^T X`` per weight block, the same multiply-adds again; both layouts of a pair give one
    product; the weights are the model's tensors. A floor missing one GEMM fails the count."""
    import torch

    from benchmarks._throughput_data import gemm_shapes, make_floors
    from edbatch.executor import init_params
    from edbatch.schedule import make_scheduler

    wl = make_workload(name, embed_dim=6, hidden_dim=5)
    shapes = wl.param_shapes()
    data = wl.load(wl.default_eval_split)
    graphs = [wl.build_graph(data[:6]), wl.build_graph(data[6:9])]
    schedules = [make_scheduler("critical_path")(g) for g in graphs]
    lists = [gemm_shapes(g, s, shapes) for g, s in zip(graphs, schedules, strict=True)]
    params = init_params(wl, torch.Generator().manual_seed(0))
    floors = make_floors(lists, True, params, torch.Generator().manual_seed(1))
    for graph, schedule, gemms, floor in zip(graphs, schedules, lists, floors, strict=True):
        macs = _cell_macs(graph, schedule, shapes)
        products = floor.products()
        by_phase = {p: [(m, k, n) for q, m, k, n in products if q == p]
                    for p in ("forward", "input_grad", "weight_grad")}
        assert by_phase["forward"] == [(g.rows, g.inputs, g.outputs) for g in gemms]
        assert sum(m * k * n for m, k, n in by_phase["forward"]) == macs > 0
        assert sum(m * k * n for m, k, n in by_phase["input_grad"]) == macs
        assert sum(m * k * n for m, k, n in by_phase["weight_grad"]) == macs
        assert len(by_phase["weight_grad"]) == len({(g.param, g.start) for g in gemms})
        assert floor.num_gemms == len(products)
        for pairs, transposed in ((floor.forward, False), (floor.input_grads, False),
                                  (floor.weight_grads, True)):
            for (a, b, _), (c, d, _) in pairs:  # the two layouts: one product
                other = c @ d
                assert torch.allclose(a @ b, other.t() if transposed else other, atol=1e-5)
        for ((_, wt, _), _), g in zip(floor.forward, gemms, strict=True):
            assert wt.untyped_storage().data_ptr() == params[g.param].untyped_storage().data_ptr()
        seconds = floor.run()
        assert set(seconds) == {"execution", "backward"} and min(seconds.values()) > 0
        short = make_floors([gemms[:-1]], False, params, torch.Generator().manual_seed(1))[0]
        assert sum(m * k * n for _, m, k, n in short.products()) < macs  # a dropped GEMM shows
    assert floors[0].forward[0][0][0].data_ptr() == floors[1].forward[0][0][0].data_ptr() \
        or lists[0][0].inputs != lists[1][0].inputs  # operands shared across mini-batches


def test_the_floor_names_a_product_that_does_not_fit_its_weight() -> None:
    import torch

    from benchmarks._throughput_data import Gemm, GemmFloor

    params = {"W": torch.zeros(8, 4)}
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="'V'"):
        GemmFloor([Gemm(3, 4, 8, "V")], False, params, gen)
    with pytest.raises(ValueError, match=r"\(8, 4\)"):
        GemmFloor([Gemm(3, 4, 8, "W", 2)], False, params, gen)
    floor = GemmFloor([Gemm(3, 4, 8, "W"), Gemm(2, 2, 8, "W", 2)], False, params, gen)
    assert [p[1:] for p in floor.products()] == [(3, 4, 8), (2, 2, 8)]
    assert set(floor.run()) == {"execution"}


def test_the_floors_operands_live_on_the_weights_device() -> None:
    """On CUDA the floor multiplied CPU buffers by CUDA weights (a device-mismatch error at its
    first product, 2026-11-28 on an H200): every operand and output follows the weights.
    ``meta`` tensors stand in for a second device here; a ``gpu`` test runs it on CUDA."""
    import torch

    from benchmarks._throughput_data import Gemm, make_floors

    params = {"W": torch.zeros(8, 6, device="meta"), "U": torch.zeros(4, 8, device="meta")}
    gemms = [Gemm(3, 6, 8, "W"), Gemm(5, 2, 8, "W", 4), Gemm(3, 8, 4, "U")]
    floor = make_floors([gemms], True, params, torch.Generator().manual_seed(0))[0]
    tensors = [t for pairs in (floor.forward, floor.input_grads, floor.weight_grads)
               for pair in pairs for layout in pair for t in layout]
    assert len(tensors) == 2 * 3 * (3 + 3 + 3) and {t.device.type for t in tensors} == {"meta"}
    assert set(floor.run()) == {"execution", "backward"}


@pytest.mark.gpu
def test_the_floor_runs_on_cuda() -> None:
    import torch

    from benchmarks._throughput_data import Gemm, make_floors

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    params = {"W": torch.randn(8, 6, device="cuda")}
    floor = make_floors([[Gemm(3, 6, 8, "W")]], True, params,
                        torch.Generator().manual_seed(0))[0]
    (x, wt, y), _ = floor.forward[0]
    assert y.is_cuda and min(floor.run().values()) > 0
    torch.testing.assert_close(x @ wt, y)
