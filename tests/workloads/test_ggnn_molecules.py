"""GGNN on ESOL: graphs match the molecules, schedules, batched == reference == peers (fp64)."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from edbatch.data.molecules import Molecule, parse_smiles
from edbatch.errors import EdbatchError, GraphError, UnknownNameError
from edbatch.executor import init_params, reference_loss
from edbatch.executor._analytic import analytic
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import STRATEGIES, plan_memory
from edbatch.schedule import HEURISTICS, lower_bound, make_scheduler
from edbatch.workloads import make_workload
from edbatch.workloads.ggnn_molecules import (
    EMBED_ROWS,
    FEATURE_RANGES,
    TARGET_SCALE,
    GGNNMolecules,
    pack_atom,
    unpack_atom,
    update_attr,
)

H, T = 6, 2
TOL = {"atol": 1e-6, "rtol": 1e-6}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@functools.cache
def workload(granularity: str = "cell") -> GGNNMolecules:
    wl = make_workload("ggnn_molecules", granularity=granularity, hidden_dim=H, rounds=T)
    assert isinstance(wl, GGNNMolecules)
    return wl


@functools.cache
def case_indices() -> tuple[int, ...]:
    """Train molecules covering every bond type and the isolated atom (methane)."""
    train = workload().load("train")
    methane = next(i for i, m in enumerate(train) if m.molecule.smiles == "C")
    triple = next(i for i, m in enumerate(train) if 2 in m.molecule.bond_types.tolist())
    return tuple(sorted({0, 1, 2, 3, methane, triple}))


@functools.cache
def params64(seed: int = 0) -> dict[str, Tensor]:
    p = init_params(workload(), torch.Generator().manual_seed(seed), dtype=torch.float64)
    with torch.no_grad():  # non-zero biases, so that every parameter is exercised
        for value in p.values():
            if value.dim() == 1:
                value.copy_(torch.linspace(-0.3, 0.3, value.numel(), dtype=torch.float64))
    return dict(p)


def grads(loss: Tensor, params: dict[str, Tensor]) -> list[Tensor]:
    out = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(out, params.values(),
                                                                     strict=True)]


# ---------------------------------------------------------------------- graphs
def check_split(split: str, heuristics: tuple[str, ...], first_only: bool) -> None:
    """Every molecule of ``split`` in mini-batches of 64: node counts from the molecules,
    schedules valid and at or above the lower bound (``heuristics`` on every mini-batch, or
    every heuristic on the first one and ``depth`` on the rest)."""
    wl = workload()
    mols = [inst.molecule for inst in wl.load(split)]
    counts: Counter[str] = Counter()
    neighbours = 0
    for k, graph in enumerate(wl.batches(split, 64)):
        bound = lower_bound(graph)
        assert bound >= 1
        for name in (heuristics if k == 0 or not first_only else ("depth",)):
            schedule = make_scheduler(name)(graph)
            schedule.validate(graph)
            assert schedule.num_batches >= bound, name
        counts.update({wl.vocab[k].name: int(c) for k, c in enumerate(graph.type_counts)})
        updates = graph.op_ids == wl.vocab.id("ggnn.update")
        neighbours += int(graph.arity[updates].sum()) - int(updates.sum())
        assert np.array_equal(graph.attrs[updates] & 7, graph.arity[updates] - 1)
    atoms = sum(m.n_atoms for m in mols)
    assert counts["ggnn.embed"] == atoms
    assert counts["ggnn.update"] == T * atoms
    assert neighbours == T * sum(len(m.edges) for m in mols)  # one operand per in-edge
    assert counts["ggnn.readout"] == counts["ggnn.loss"] == len(mols)


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_every_molecule_builds_and_schedules_at_or_above_the_bound(split: str) -> None:
    check_split(split, tuple(HEURISTICS), first_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_every_heuristic_on_every_minibatch(split: str) -> None:
    check_split(split, tuple(HEURISTICS), first_only=False)


def test_cell_graph_of_one_molecule_wires_neighbour_states_and_bond_types() -> None:
    wl = workload()
    inst = wl.load("train")[0]
    graph = wl.instance_graph("train", 0)
    upd = np.flatnonzero(graph.op_ids == wl.vocab.id("ggnn.update"))
    prev, last = upd[-2 * inst.n_atoms:-inst.n_atoms], upd[-inst.n_atoms:]
    edges, bonds = inst.molecule.edges, inst.molecule.bond_types
    for v, node in enumerate(last.tolist()):
        ops = graph.operand_ids[graph.operand_ptr[node]:graph.operand_ptr[node + 1]]
        into = edges[:, 1] == v
        assert ops[0] == prev[v]  # its own state, then its neighbours' in edge order
        assert ops[1:].tolist() == prev[edges[into, 0]].tolist()
        attr = int(graph.attrs[node])
        assert attr == update_attr(bonds[into].tolist())
        assert attr & 7 == len(ops) - 1
        assert [(attr >> (3 + 2 * k)) & 3 for k in range(len(ops) - 1)] == bonds[into].tolist()
    loss = np.flatnonzero(graph.op_ids == wl.vocab.id("ggnn.loss"))
    mean, std = wl.target_stats()
    assert graph.attrs[loss[0]] / TARGET_SCALE == pytest.approx((inst.molecule.y - mean) / std,
                                                                abs=1e-6)


def test_cell_schedules_reach_the_lower_bound_and_primitive_ones_exceed_it() -> None:
    cell = workload().minibatch("valid", range(16))
    prim = workload("primitive").minibatch("valid", range(16))
    assert make_scheduler("depth")(cell).num_batches == lower_bound(cell)
    assert make_scheduler("depth")(prim).num_batches > lower_bound(prim)


def test_pack_unpack_round_trip() -> None:
    feats = [hi for _, hi in FEATURE_RANGES]
    rows = unpack_atom(pack_atom(feats))
    assert rows[-1] == EMBED_ROWS - 1 and len(set(rows)) == len(FEATURE_RANGES)
    assert unpack_atom(pack_atom([lo for lo, _ in FEATURE_RANGES]))[0] == 0


# ---------------------------------------------------------------------- execution
@functools.cache
def reference(granularity: str) -> tuple[Graph, Tensor, list[Tensor]]:
    graph = workload(granularity).minibatch("train", case_indices())
    params = params64()
    loss = reference_loss(graph, params)
    return graph, loss.detach(), grads(loss, params)


@pytest.mark.parametrize("granularity", ["cell", "primitive"])
@pytest.mark.parametrize("scheduler", ["depth", "dynet_agenda", "typewise_greedy",
                                       "critical_path"])
def test_batched_equals_reference_fp64(granularity: str, scheduler: str) -> None:
    graph, ref_loss, ref_grads = reference(granularity)
    params = params64()
    schedule = make_scheduler(scheduler)(graph)
    for strategy in STRATEGIES:
        plan = plan_memory(graph, schedule, strategy)
        executor = TorchExecutor(dtype=torch.float64)
        plain = executor.run(graph, schedule, plan, params)
        assert plain.loss is not None
        torch.testing.assert_close(plain.loss, ref_loss, **TOL)
        trained = executor.run(graph, schedule, plan, params, grad=True)
        assert trained.loss is not None
        torch.testing.assert_close(trained.loss.detach(), ref_loss, **TOL)
        for name, g, r in zip(params, grads(trained.loss, params), ref_grads, strict=True):
            torch.testing.assert_close(g, r, **TOL, msg=f"gradient of {name} ({strategy})")


@pytest.mark.parametrize("granularity", ["cell", "primitive"])
@pytest.mark.parametrize("scheduler", ["depth", "dynet_agenda"])
def test_cell_programs_train_with_hand_written_backwards(granularity: str, scheduler: str
                                                          ) -> None:
    graph, _, _ = reference(granularity)
    schedule = make_scheduler(scheduler)(graph)
    program, _ = TorchExecutor()._program(graph, schedule, plan_memory(graph, schedule,
                                                                       "aligned"))
    # the equivalence test above then checks the hand-written gradients (cell) and
    # autograd's (primitive: affines, slices ... have no hand-written backward). At cell
    # granularity every molecule has the same depth (embed, T updates, readout, loss), so
    # no variadic batch holds one node (such a batch is read operand by operand: autograd;
    # loss_sum is stacked, not split).
    lone = sorted((s.op.name, s.size) for s in program.steps if s.split and not s.stacked)
    if granularity == "cell":
        assert lone == []
    assert analytic(program) == (granularity == "cell" and not lone)


def test_cell_and_primitive_granularities_compute_the_same_loss() -> None:
    _, cell_loss, cell_grads = reference("cell")
    _, prim_loss, prim_grads = reference("primitive")
    assert workload().param_shapes() == workload("primitive").param_shapes()
    torch.testing.assert_close(cell_loss, prim_loss, **TOL)
    for g, r in zip(cell_grads, prim_grads, strict=True):
        torch.testing.assert_close(g, r, **TOL)
    assert all(g.abs().sum() > 0 for g in cell_grads)  # every parameter is used


def test_loss_is_the_squared_error_of_the_standardised_target() -> None:
    wl = workload()
    params = {k: torch.zeros_like(v) for k, v in params64().items()}  # prediction = 0
    inst = wl.load("test")[5]
    loss = reference_loss(wl.minibatch("test", [5]), params)
    mean, std = wl.target_stats()
    assert float(loss) == pytest.approx(((inst.molecule.y - mean) / std) ** 2, abs=1e-5)


@pytest.mark.parametrize("peer", ["unbatched", "pyg"])
def test_peers_compute_the_same_loss_and_gradients(peer: str) -> None:
    if peer == "pyg":
        pytest.importorskip("torch_geometric")
    from benchmarks.peers.ggnn_molecules import pyg_loss, unbatched_loss

    fn = pyg_loss if peer == "pyg" else unbatched_loss
    _, ref_loss, ref_grads = reference("cell")
    params = params64()
    insts = [workload().load("train")[i] for i in case_indices()]
    loss = fn(workload(), insts, params)
    torch.testing.assert_close(loss.detach(), ref_loss, **TOL)
    for g, r in zip(grads(loss, params), ref_grads, strict=True):
        torch.testing.assert_close(g.to_dense() if g.is_sparse else g, r, **TOL)


FUSED = ("gru_gates", "gru_output", "gru_backward_c", "gru_backward_r", "gate_forward",
         "gate_backward", "embed_forward", "embed_backward")


def fused_and_unfused(graph: Graph, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
                      ) -> tuple[dict[bool, list[Tensor]], Counter[str]]:
    """Inference loss, training loss and gradients with the compiled element-wise bodies
    (``fused``) and with the torch code of the same kernels, and the compiled calls made."""
    from edbatch.executor import cells_ggnn, cells_ggnn_head

    calls: Counter[str] = Counter()

    def counting(name: str, real: Any) -> Any:
        def counted(*args: Any) -> Any:
            calls[name] += 1
            return real(*args)
        return counted

    for name in FUSED:  # in the module that calls it (the update's or the head's)
        where = cells_ggnn if hasattr(cells_ggnn, name) else cells_ggnn_head
        monkeypatch.setattr(where, name, counting(name, getattr(where, name)))
    params = {k: v.to(dtype) for k, v in params64().items()}
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    out: dict[bool, list[Tensor]] = {}
    for fused in (False, True):
        executor = TorchExecutor(dtype=dtype, fused=fused)
        infer = executor.run(graph, schedule, plan, params).loss
        trainable = {k: v.clone().requires_grad_() for k, v in params.items()}
        trained = executor.run(graph, schedule, plan, trainable, grad=True).loss
        assert infer is not None and trained is not None
        out[fused] = [infer, trained.detach(), *grads(trained, trainable)]
        if not fused:
            assert not calls  # the torch path ran no compiled body
    return out, calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_gru_and_readout_bodies_equal_the_torch_path(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp64: to rounding (loss, inference, every gradient); fp32: within the rational
    ``tanh``'s error; every compiled body ran (forward and backward)."""
    out, calls = fused_and_unfused(reference("cell")[0], dtype, monkeypatch)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else \
        {"atol": 2e-5, "rtol": 1e-4}
    for k, (a, b) in enumerate(zip(out[True], out[False], strict=True)):
        torch.testing.assert_close(a, b, **tol, msg=f"output {k}")
    assert set(calls) == set(FUSED)


def test_a_batch_of_isolated_atoms_runs_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Methane alone: every update batch has no neighbour operand (no message GEMM)."""
    methane = next(i for i, m in enumerate(workload().load("train"))
                   if m.molecule.smiles == "C")
    graph = workload().minibatch("train", [methane])
    out, _ = fused_and_unfused(graph, torch.float64, monkeypatch)
    loss = reference_loss(graph, params64())
    torch.testing.assert_close(out[True][0], loss, **TOL)
    for a, b in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_compact_messages_and_merged_reads_equal_the_dense_per_slot_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fp64, compiled kernels on: the compact message form with the repeated slots read as
    one operand (summed where they lie in the arena, or gathered first) gives the dense
    form's loss and gradients (every parameter), and the program does read an update's
    neighbours (as arena rows, an ``IndexedRead``) and the readout's atoms as one operand.
    ``per-batch`` (``REUSE`` off: per-batch weight gradients and buckets) gives the same,
    and with ``REUSE`` on the rounds' equal attrs make their buckets once."""
    from edbatch.executor import cells_ggnn
    from edbatch.executor._program import compile_program

    graph, loss, ref = reference("cell")
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    out = {}
    made: Counter[str] = Counter()
    make = cells_ggnn.compact_buckets

    def counted(*args: Any) -> Any:
        made[form] += 1
        return make(*args)

    monkeypatch.setattr(cells_ggnn, "compact_buckets", counted)
    for form in ("compact", "per-batch", "gathered", "dense"):
        on = form != "dense"
        monkeypatch.setattr(cells_ggnn.GGNNUpdate, "indexed_reads",
                            (1,) if form in ("compact", "per-batch") else ())
        monkeypatch.setattr(cells_ggnn, "COMPACT", on)
        monkeypatch.setattr(cells_ggnn, "REUSE", form != "per-batch")
        monkeypatch.setattr(cells_ggnn.GGNNUpdate, "merge_repeated", 1 if on else None)
        monkeypatch.setattr(cells_ggnn.GGNNReadout, "merge_repeated", 0 if on else None)
        steps = compile_program(graph, schedule, plan, torch.device("cpu"), None).steps
        reads = {s.op.kind: len(s.reads) for s in steps if s.size > 1}
        if on:  # (the dense form: one read per slot, here 5 and 32)
            assert (reads["ggnn.update"], reads["ggnn.readout"]) == (2, 1)
            kinds = {type(s.reads[1]).__name__ for s in steps
                     if s.op.kind == "ggnn.update" and s.size > 1}
            assert kinds == {"IndexedRead" if form != "gathered" else "RowsRead"}
        else:
            assert reads["ggnn.update"] > 2 and reads["ggnn.readout"] > 1
        trainable = {k: v.clone().requires_grad_() for k, v in params64().items()}
        trained = TorchExecutor(dtype=torch.float64, fused=True).run(
            graph, schedule, plan, trainable, grad=True).loss
        assert trained is not None
        out[form] = [trained.detach(), *grads(trained, trainable)]
    torch.testing.assert_close(out["compact"][0], loss, **TOL)
    updates = sum(s.op.kind == "ggnn.update" and s.size > 1 for s in steps)
    assert made["per-batch"] == updates and made["dense"] == 0
    assert made["compact"] == made["gathered"] == updates // T  # T rounds, the same attrs
    for other in ("per-batch", "gathered", "dense"):
        for k, (a, b) in enumerate(zip(out["compact"], out[other], strict=True)):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"{other} {k}")
    for k, (a, b) in enumerate(zip(out["compact"][1:], ref, strict=True)):
        torch.testing.assert_close(a, b, **TOL, msg=f"gradient {k}")


def test_weights_changed_through_data_between_runs_are_read_afresh() -> None:
    """The stacked weights a run reuses do not outlive it: a write through ``.data`` (no
    version bump) between two inference runs shows in the second."""
    graph = reference("cell")[0]
    params = params64()
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    executor = TorchExecutor(dtype=torch.float64)
    first = executor.run(graph, schedule, plan, params).loss
    for value in params.values():
        value.data.mul_(0.5)
    second = executor.run(graph, schedule, plan, params).loss
    assert first is not None and second is not None
    torch.testing.assert_close(second, reference_loss(graph, params), **TOL)
    assert not torch.allclose(first, second)


def test_slot_rows_in_one_nonzero_or_without_host_sync_equal_slot_nodes() -> None:
    from edbatch.executor.cells_ggnn import slot_rows
    from edbatch.executor.kernels import slot_nodes

    counts = torch.tensor([3, 0, 1, 5, 2, 2, 0, 4])
    sizes = [int((counts > k).sum()) for k in range(5)]
    expected = torch.cat(slot_nodes(counts, sizes)).tolist()
    for sync_free in (False, True):
        node, slot = slot_rows(counts, sizes, sync_free=sync_free)
        assert node.tolist() == expected
        assert slot.tolist() == [k for k, n in enumerate(sizes) for _ in range(n)]


# ---------------------------------------------------------------------- errors
def test_atom_feature_outside_the_embedding_range_is_named() -> None:
    atoms, edges, types = parse_smiles("C[N+](C)(C)C")
    atoms[1, 1] = 9  # degree 9
    mol = Molecule("x", "C[N+](C)(C)C", -1.0, atoms, edges, types)
    with pytest.raises(GraphError, match=r"molecule #3 .*atom 1 has degree 9, outside .*0\.\.5"):
        workload().encode(mol, "train", 3)


def test_an_atom_with_too_many_bonds_for_the_update_attr_is_named() -> None:
    atoms, _, _ = parse_smiles("CCCCCCCCC")
    edges = np.array([[u, 0] for u in range(1, 9)] + [[0, u] for u in range(1, 9)])
    mol = Molecule("x", "C(C)(C)(C)(C)(C)(C)(C)C", -1.0, atoms, edges, np.zeros(16, np.int64))
    with pytest.raises(GraphError, match=r"molecule #4 .*atom 0 has 8 bonds.*at most 7"):
        workload().encode(mol, "train", 4)


def test_bad_arguments_and_splits_raise_clear_errors() -> None:
    with pytest.raises(EdbatchError, match="hidden_dim"):
        GGNNMolecules(hidden_dim=0)
    with pytest.raises(UnknownNameError, match="'valid'"):
        workload().load("dev")
    with pytest.raises(UnknownNameError, match="granularity"):
        GGNNMolecules(granularity="atoms")


# ---------------------------------------------------------------------- training
def test_train_script_rejects_bad_arguments() -> None:
    from experiments.train_ggnn import main

    with pytest.raises(SystemExit):
        main(["--epochs", "0"])


@pytest.mark.slow
def test_one_epoch_through_the_batched_executor_beats_the_mean_predictor() -> None:
    from experiments.train_ggnn import train

    summary = train(epochs=1, hidden_dim=16, rounds=2, log=False)
    # predicting the train mean scores about the target's std (2.07 log units) on test
    assert 0.0 < summary["test_rmse"] < 0.9 * workload().target_stats()[1]


def test_compiled_embedding_gradient_is_one_sparse_row_per_table_row_read() -> None:
    """fp64, sparse gradients (as the throughput benchmark trains): the compiled embedding
    backward hands over each table row read once (not six rows per atom) and equals the
    torch path's ``6 B`` rows summed, and the dense gradient of a run without sparse rows."""
    graph = reference("cell")[0]
    schedule = make_scheduler("depth")(graph)
    plan = plan_memory(graph, schedule, "naive")
    out = {}
    for fused, sparse in ((True, True), (False, True), (True, False)):
        trainable = {k: v.detach().clone().requires_grad_() for k, v in params64().items()}
        loss = TorchExecutor(dtype=torch.float64, fused=fused, sparse_grads=sparse).run(
            graph, schedule, plan, trainable, grad=True).loss
        assert loss is not None
        loss.backward()
        out[fused, sparse] = trainable["ggnn.atom_emb"].grad
    fused, unfused, dense = out[True, True], out[False, True], out[True, False]
    assert fused.is_sparse and unfused.is_sparse and not dense.is_sparse
    rows = fused.coalesce().indices()[0]
    assert fused._nnz() == len(rows) < unfused._nnz()  # one row each, not six per atom
    assert bool(dense[rows].abs().sum(1).gt(0).all())  # every row handed over was read
    torch.testing.assert_close(fused.to_dense(), unfused.to_dense(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(fused.to_dense(), dense, atol=1e-10, rtol=1e-10)
