"""CLEVR module network: graphs follow the programs, object rows decode, the per-question API
model equals its unbatched PyTorch reference in fp64, and bad input fails in one line."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from edbatch.data.clevr_programs import module_type
from edbatch.errors import DataFormatError, GraphError
from edbatch.executor.cells_module_net import Object
from edbatch.workloads import make_workload
from edbatch.workloads.base import DATA_DIR
from edbatch.workloads.module_net import (
    MAX_OBJECTS,
    ModuleNet,
    pack_object,
    unpack_object,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@functools.cache
def workload() -> ModuleNet:
    wl = make_workload("module_net", embed_dim=4, hidden_dim=5)
    assert isinstance(wl, ModuleNet)
    return wl


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "clevr_module_net", ROOT / "examples" / "clevr_module_net.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_op_type_per_module_type() -> None:
    wl = workload()
    names = set(wl.vocab.names)
    types = wl.meta.module_types()
    assert len(types) == 41 and len(set(types)) == 41
    assert {f"module_net.{t}" for t in types} <= names
    assert len(names) == 41 + 4  # object, objects, answer, loss_sum
    assert len(wl.answers) == 28 and wl.answers[:3] == ("no", "yes", "0")


def test_graph_follows_the_program() -> None:
    wl = workload()
    q = wl.load("val")[3]
    g = wl.instance_graph("val", 3)
    ops = [g.vocab[int(i)].name for i in g.op_ids]
    n = len(q.object_codes)
    assert ops[:n] == ["module_net.object"] * n and ops[n] == "module_net.objects"
    assert ops[n + 1:-1] == [f"module_net.{module_type(x)}" for x in q.question.program]
    assert ops[-1] == "module_net.answer" and int(g.attrs[-1]) == q.answer
    assert wl.answers[q.answer] == q.question.answer
    assert int(g.attrs[n]) == n


def test_a_minibatch_mixes_dozens_of_module_types() -> None:
    g = workload().minibatch("test", range(64))
    used = Counter(g.vocab[int(i)].name for i in g.op_ids)
    assert len(used) >= 30


def test_object_rows_decode_the_packed_attributes() -> None:
    code = pack_object([1, 7, 0, 2], -2.37, 3.0)
    assert unpack_object(code) == ([1, 7, 0, 2], -2.37, 3.0)
    op = next(o for o in workload().vocab if o.name == "module_net.object")
    table = torch.arange(15 * 4, dtype=torch.float64).reshape(15, 4)
    row = Object.kernel(op, [], {"module_net.object.E": table}, torch.tensor([code]))[0]
    hot = [1, 2 + 7, 10 + 0, 12 + 2]  # size, colour, material, shape blocks
    assert row[0] == 1 and row[1:16].nonzero().reshape(-1).tolist() == hot
    assert torch.equal(row[16:20], table[hot].sum(0))
    assert row[20:].tolist() == [-2.37, 3.0]
    with pytest.raises(GraphError, match="coordinates must lie in"):
        pack_object([0, 0, 0, 0], 3.5, 0.0)


@pytest.mark.parametrize("scheduler", ["critical_path", "depth"])
def test_api_model_equals_unbatched_reference_in_fp64(scheduler: str) -> None:
    ex = _example()
    wl = workload()
    questions = [wl.load("val")[i] for i in range(12)]
    torch.manual_seed(0)
    model = ex.ModuleNetModel(wl, embed=4, hidden=5, dtype=torch.float64)
    with torch.no_grad():  # non-zero biases, so that every parameter is exercised
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.record(questions)
    out = model.batch.run(scheduler)
    assert out.loss is not None
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref = sum(model.reference(q) for q in questions)
    ref.backward()
    torch.testing.assert_close(out.loss, ref, atol=1e-6, rtol=1e-6)
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and len(got) > 20
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-6, rtol=1e-6, msg=n)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(DATA_DIR / "clevr", tmp_path / "clevr")
    return tmp_path


def test_bad_program_names_file_and_line(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    path = data / "clevr" / "val_questions.jsonl"
    lines = path.read_text().splitlines()
    q = json.loads(lines[1])
    q["program"][0][0] = "scenery"
    lines[1] = json.dumps(q)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as err:
        ModuleNet(hidden_dim=4, data_dir=data).load("val")
    assert "val_questions.jsonl:2: found program node 0: unknown function 'scenery'" in \
        str(err.value) and "\n" not in str(err.value)
    q["program"][0][0] = "scene"
    q["program"][-1][1] = q["program"][-1][1] * 3
    lines[1] = json.dumps(q)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"val_questions.jsonl:2: .* input\(s\).*arity"):
        ModuleNet(hidden_dim=4, data_dir=data).load("val")


def test_scene_without_an_attribute_names_file_and_line(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    path = data / "clevr" / "val_scenes.jsonl"
    lines = path.read_text().splitlines()
    scene = json.loads(lines[2])
    del scene["objects"][1]["material"]
    lines[2] = json.dumps(scene)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="val_scenes.jsonl:3: found object 1 without "
                       "attribute 'material'"):
        ModuleNet(hidden_dim=4, data_dir=data).load("val")


def test_encode_rejects_what_the_network_cannot_take() -> None:
    wl = workload()
    q = wl.load("val")[0]
    scene = wl._scenes["val"][q.question.scene]
    big = type(scene).from_objects(tuple(scene.objects) * (MAX_OBJECTS // len(scene.objects)
                                                            + 1))
    with pytest.raises(GraphError, match=r"question #0 of split 'val' .* objects"):
        wl.encode(q.question, big, "val", 0)
    odd = type(q.question)(q.question.scene, q.question.family, q.question.template,
                           q.question.text, q.question.program, "maybe")
    with pytest.raises(GraphError, match="answer 'maybe' is not one of"):
        wl.encode(odd, scene, "val", 0)
    with pytest.raises(GraphError, match="only the 'cell' granularity"):
        ModuleNet(granularity="primitive")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_pairwise_bodies_equal_the_torch_bodies(dtype: torch.dtype) -> None:
    """The compiled ``relate`` (forward, saves, backward, weight gradients) equals the torch
    body it replaces, on padded scenes (zero mask rows) and a strided attention operand."""
    from edbatch.executor import KERNELS, _fused, init_params
    from edbatch.executor.param_grads import ParamGrads

    wl = workload()
    op = next(o for o in wl.vocab if o.kind == "module_net.relate")
    params = {k: v.detach().to(dtype) for k, v in init_params(
        wl, torch.Generator().manual_seed(1)).items() if k in op.params}
    gen = torch.Generator().manual_seed(3)
    width = op.in_shapes[1][0] // MAX_OBJECTS  # type: ignore[index]
    scene = torch.randn(7, MAX_OBJECTS, width, generator=gen, dtype=dtype)
    scene[:, 6:, 0], scene[:, :6, 0] = 0.0, 1.0  # six objects, four padded rows
    att = torch.rand(7, 2 * MAX_OBJECTS, generator=gen, dtype=dtype)[:, ::2]  # strided
    grad = torch.randn(7, MAX_OBJECTS, generator=gen, dtype=dtype)
    kernel, runs = KERNELS[op.kind], []
    for on in (False, True):
        with torch.no_grad(), _fused.use(on):
            saves: list = []
            y = kernel(op, [att, scene.reshape(7, -1)], params, torch.zeros(7), save=saves)
            acc = ParamGrads()
            got = kernel.backward(op, saves, grad, params, torch.zeros(7), acc)
            runs.append((y, saves[0].sg, saves[0].t, *got, *acc.result(params).values()))
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else \
        {"rtol": 1e-5, "atol": 2e-6}
    assert len(runs[0]) == len(runs[1]) == 7
    for want, have in zip(*runs, strict=True):
        torch.testing.assert_close(have, want, **tol)


def test_minibatch_from_the_packed_split_equals_merging_its_graphs() -> None:
    """Once every graph of a split is cached, ``minibatch`` merges from the split's pack: the
    graph ``merge_graphs`` makes of the same cached graphs; a cleared cache drops the pack
    (the graphs rebuilt are other objects) and a negative index merges without it."""
    import numpy as np

    from edbatch.graph import merge_graphs

    wl = ModuleNet(embed_dim=4, hidden_dim=5)
    rng = np.random.default_rng(1)
    idx = rng.permutation(500)[:16].tolist()
    assert isinstance(wl.minibatch("val", idx), type(wl.minibatch("val", [0])))
    assert "val" not in wl._packed  # not every graph cached yet
    for i in range(500):
        wl.instance_graph("val", i)
    for _ in range(2):  # packed once, then reused; then after a cleared cache
        for idx in ([3], [0, 0, 7], rng.permutation(500)[:64].tolist(), [499, -1]):
            have = wl.minibatch("val", idx)
            want = merge_graphs([wl.instance_graph("val", i) for i in idx],
                                reduce_op="loss_sum")
            for field in ("op_ids", "operand_ptr", "operand_ids", "attrs", "instance",
                          "depth", "outputs"):
                assert np.array_equal(getattr(have, field), getattr(want, field)), field
        assert "val" in wl._packed
        packed = wl._packed["val"]
        wl._cache.clear()
        for i in range(500):
            wl.instance_graph("val", i)
        wl.minibatch("val", [5])
        assert wl._packed["val"] is not packed
