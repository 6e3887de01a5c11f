"""Hoisted programs' reads: consumers of LSTM states that use only ``h`` gather only the ``h``
columns (the BiLSTM's layer-2 projections and loss), and the projection groups' readiness
computed in one numpy pass equals the per-batch definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edbatch.api import DynamicBatch, take_graph
from edbatch.executor import _fast_pair, init_params
from edbatch.executor._hoist import HeadPairRead, HeadRowsRead, HeadSliceRead
from edbatch.executor._hoist_ready import ready as _ready
from edbatch.executor._reads import RowLocator, RowsRead, SliceRead
from edbatch.executor.cells_hoist import HEAD_READS, HOISTS, l2_project
from edbatch.executor.cells_seq import bilstm_l2, bilstm_loss
from edbatch.executor.kernels import KERNELS
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph
from edbatch.memory import Strategy, plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import make_workload

HIDDEN = 5


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _bilstm_graph(api: bool) -> Graph:
    wl = make_workload("bilstm_tagger", embed_dim=6, hidden_dim=HIDDEN)
    if not api:
        return wl.minibatch(wl.default_eval_split, range(5))
    from benchmarks.peers.bilstm_tagger import record as record_bilstm_tagger

    batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    record_bilstm_tagger(batch, wl, wl.load(wl.default_eval_split)[:5])
    return take_graph(batch)[0]


@pytest.mark.parametrize("hoist", [False, True])
@pytest.mark.parametrize("api", [False, True])
@pytest.mark.parametrize("strategy", ["naive", "planned", "aligned"])
def test_state_consumers_gather_only_h_columns(strategy: Strategy, api: bool, hoist: bool
                                               ) -> None:
    graph = _bilstm_graph(api)
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)
    program, _ = TorchExecutor(hoist=hoist)._program(graph, schedule, plan)
    gen = torch.Generator().manual_seed(1)
    arenas = [torch.randn(rows, width, generator=gen) for rows, width in program.arenas]
    heads = 0
    for step in program.steps:
        kind = step.op.kind
        spec = HOISTS.get(kind.removesuffix(".projection"))
        registered = step.kernel is KERNELS.get(kind) if kind in KERNELS else False
        slots = HEAD_READS.get(kind, ()) if registered else ()
        if kind.endswith(".projection") and spec is not None and spec.heads:
            slots = tuple(range(len(step.reads)))
        for slot, read in enumerate(step.reads):
            expect = slot in slots
            assert isinstance(read, HeadRowsRead | HeadSliceRead) == expect, (
                kind, type(read).__name__)
            full: RowsRead | SliceRead
            if isinstance(read, HeadPairRead):  # both h operands of a projection at once
                heads += 2
                got = read(arenas)
                assert read.cols == HIDDEN and got.shape == (step.size, 2 * HIDDEN)
                rows = RowsRead(read.b, read.idx)(arenas)[:, :HIDDEN]
                torch.testing.assert_close(got, torch.cat([rows[0::2], rows[1::2]], 1),
                                           rtol=0, atol=0)
                continue
            if isinstance(read, HeadRowsRead):
                full = RowsRead(read.b, read.idx)
            elif isinstance(read, HeadSliceRead):
                full = SliceRead(read.b, read.lo, read.hi)
            else:
                continue
            heads += 1
            assert read.cols == HIDDEN
            got = read(arenas)
            assert got.shape == (step.size, HIDDEN)
            torch.testing.assert_close(got, full(arenas)[:, :HIDDEN], rtol=0, atol=0)
    l2_batches = sum(1 for s in schedule.batches
                     if graph.vocab[s.op_id].kind in ("bilstm.l2_fwd", "bilstm.l2_bwd"))
    # hoisted: both operands of the two layer-2 projections (one group each) and the loss;
    # plain: the two layer-1 operands of every layer-2 batch and the loss
    assert heads == (2 * 2 + 2 if hoist else 2 * l2_batches + 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_pair_read_is_one_gather_and_bit_identical(dtype: torch.dtype,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """In inference the BiLSTM loss reads ``[h(f2); h(b2)]`` as one :class:`HeadPairRead`
    under the naive plan (its two gathers of one arena), and every output equals the run
    that gathers the two and concatenates them, bit for bit."""
    graph = _bilstm_graph(False)
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "naive")
    wl = make_workload("bilstm_tagger", embed_dim=6, hidden_dim=HIDDEN)
    params = init_params(wl, torch.Generator().manual_seed(4), dtype=dtype)

    def run() -> tuple[list[str], dict[int, torch.Tensor]]:
        ex = TorchExecutor(dtype=dtype)
        program, _ = ex._program(graph, schedule, plan)
        loss = [type(e.read).__name__ for e in program.short
                if type(e) is _fast_pair.PairStep]
        return loss, ex.run(graph, schedule, plan, params).outputs

    paired, got = run()
    monkeypatch.setattr(_fast_pair, "PAIRED", frozenset())
    apart, want = run()
    assert paired == ["HeadPairRead"] and apart == []
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("grad", [False, True])
def test_head_kernels_accept_full_states_or_h_columns(grad: bool) -> None:
    wl = make_workload("bilstm_tagger", embed_dim=6, hidden_dim=HIDDEN)
    params = init_params(wl, torch.Generator().manual_seed(2), dtype=torch.float64)
    op = next(t for t in wl.vocab if t.kind == "bilstm.l2_fwd")
    loss_op = next(t for t in wl.vocab if t.kind == "bilstm.loss")
    gen = torch.Generator().manual_seed(3)
    states = [torch.randn(7, 2 * HIDDEN, generator=gen, dtype=torch.float64) for _ in range(2)]
    h_only = [s[:, :HIDDEN] for s in states]
    tags = torch.randint(0, params["bilstm.out"].shape[0], (7,), generator=gen)
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(l2_project(op, h_only, params, tags),
                                   l2_project(op, states, params, tags), rtol=0, atol=0)
        torch.testing.assert_close(bilstm_loss(loss_op, h_only, params, tags),
                                   bilstm_loss(loss_op, states, params, tags), rtol=0, atol=0)
        torch.testing.assert_close(bilstm_loss(loss_op, [torch.cat(h_only, 1)], params, tags),
                                   bilstm_loss(loss_op, states, params, tags), rtol=0, atol=0)
        prev = torch.randn(7, 2 * HIDDEN, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(bilstm_l2(op, [*h_only, prev], params, tags),
                                   bilstm_l2(op, [*states, prev], params, tags), rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["naive", "planned", "aligned"])
@pytest.mark.parametrize("name", ["bilstm_tagger", "lattice_lstm", "seq2seq"])
def test_ready_equals_the_per_batch_definition(name: str, strategy: Strategy) -> None:
    wl = make_workload(name, embed_dim=6, hidden_dim=HIDDEN)
    graph = wl.minibatch(wl.default_eval_split, range(8))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)
    batch_of = RowLocator(plan).batch_of
    by_type: dict[int, list[int]] = {}
    for b, batch in enumerate(schedule.batches):
        if graph.vocab[batch.op_id].kind in HOISTS:
            by_type.setdefault(batch.op_id, []).append(b)
    assert by_type
    for op_id, batches in by_type.items():
        slots = HOISTS[graph.vocab[op_id].kind].hoisted
        expected = {b: max((int(np.max(batch_of[o.arena][o.rows()], initial=-1))
                            for o in (plan.operands[b][k] for k in slots)), default=-1)
                    for b in batches}
        assert _ready(plan, batch_of, batches, slots) == expected
