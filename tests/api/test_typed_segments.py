"""Typed segments (:mod:`edbatch.api._typed`): segments whose op types read each other
without cycles run one batch per op type, planned without the scheduler or memory planner;
values and gradients equal the general path's and a per-instance reference, in fp64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, _typed, switch
from edbatch.api._typed import typed_program
from edbatch.graph import Graph, OpType, Vocab
from edbatch.schedule.bounds import lower_bound

D = 3


class Routed:
    """Per instance: a projection of each input row, a read of its values, each row sent to
    one of two experts by the sign of its first value, a combination and a loss."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.proj = nn.Linear(D, D).double()
        self.experts = [nn.Linear(D, D).double() for _ in range(2)]
        self.mix = nn.Linear(2 * D, D).double()
        b = self.batch = DynamicBatch(dtype=torch.float64)
        self.c_proj = b.cell(lambda x: torch.tanh(self.proj(x)), "proj", [D], D)
        self.c_exp = [b.cell(e, f"exp{i}", [D], D) for i, e in enumerate(self.experts)]
        self.c_mix = b.cell(lambda a, e: self.mix(torch.cat([a, e], 1)), "mix", [D, D], D)
        self.c_loss = b.cell(lambda h: h.pow(2).sum(1), "sq", [D], ())

    def modules(self) -> list[nn.Module]:
        return [self.proj, *self.experts, self.mix]

    def program(self, rows: torch.Tensor):  # type: ignore[no-untyped-def]
        xs = self.batch.inputs(rows)
        hs = self.c_proj.map(xs)
        values = yield hs
        choice = [int(v[0] > 0) for v in values]
        outs = switch(self.c_exp, choice, hs)
        mixed = self.c_mix.map(hs, outs)
        again = yield mixed  # a second round: value nodes of the first segment's rows
        self.batch.add_loss(self.c_loss.map(mixed))
        return [int(v[0] > 0) for v in again], choice

    def reference(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        h = torch.tanh(self.proj(rows))
        choice = [int(v[0] > 0) for v in h]
        e = torch.cat([self.experts[c](h[i:i + 1]) for i, c in enumerate(choice)])
        return self.mix(torch.cat([h, e], 1)).pow(2).sum(), choice


def _data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(n, D, generator=g, dtype=torch.float64) for n in (4, 1, 6, 3)]


def _run(model: Routed, typed: bool, monkeypatch: pytest.MonkeyPatch, grad: bool = True
         ) -> tuple[object, dict[str, torch.Tensor]]:
    monkeypatch.setattr(_typed, "TYPED", typed)
    for m in model.modules():
        m.zero_grad()
    out = model.batch.run_programs([model.program(r) for r in _data()], "typewise_greedy",
                                   grad=grad)
    grads: dict[str, torch.Tensor] = {}
    if grad:
        out.loss.backward()
        grads = {f"{i}.{n}": p.grad.clone() for i, m in enumerate(model.modules())
                 for n, p in m.named_parameters()}
    return out, grads


def test_typed_equals_general_path_and_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Routed()
    typed, g_typed = _run(model, True, monkeypatch)
    plain, g_plain = _run(model, False, monkeypatch)
    assert [s.schedule.scheduler for s in typed.segments] == ["typed"] * 3
    assert all(s.schedule.scheduler != "typed" for s in plain.segments)
    assert typed.syncs == plain.syncs == 2
    assert typed.returns == plain.returns
    # one batch per op type of each segment (no scheduler does fewer)
    for seg in typed.segments:
        assert seg.schedule.num_batches == len(np.unique(seg.graph.op_ids))
        seg.schedule.validate(seg.graph)
    assert typed.loss.item() == pytest.approx(plain.loss.item(), rel=1e-12)
    for name, g in g_typed.items():
        torch.testing.assert_close(g, g_plain[name], rtol=1e-9, atol=1e-12, msg=name)
    ref = torch.zeros((), dtype=torch.float64)
    for m in model.modules():
        m.zero_grad()
    for rows, (_, choice) in zip(_data(), typed.returns, strict=True):
        loss, want = model.reference(rows)
        assert choice == want
        ref = ref + loss
    ref.backward()
    assert typed.loss.item() == pytest.approx(ref.item(), rel=1e-9)
    for i, m in enumerate(model.modules()):
        for n, p in m.named_parameters():
            torch.testing.assert_close(g_typed[f"{i}.{n}"], p.grad, rtol=1e-6, atol=1e-9)


def test_typed_inference_and_cache_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Routed()
    first, _ = _run(model, True, monkeypatch, grad=False)
    again, _ = _run(model, True, monkeypatch, grad=False)  # same structures: cache hits
    plain, _ = _run(model, False, monkeypatch, grad=False)
    assert first.returns == again.returns == plain.returns
    assert [s.schedule.scheduler for s in again.segments] == ["typed"] * 3
    assert first.loss.item() == again.loss.item() == pytest.approx(plain.loss.item(), rel=1e-12)


def _graph(ops: list[int], operands: list[list[int]]) -> Graph:
    vocab = Vocab([OpType("a", "abstract", ((D,),), (D,)), OpType("b", "abstract", ((D,),), (D,)),
                   OpType("x", "abstract", (), (D,))])
    ptr = np.cumsum([0] + [len(o) for o in operands])
    flat = np.array([v for o in operands for v in o], np.int32)
    return Graph.from_arrays(vocab, np.array(ops, np.int32), ptr, flat)


@pytest.mark.parametrize(("ops", "operands"), [
    ([2, 0, 0], [[], [0], [1]]),  # a reads a: a chain of one type
    ([2, 0, 1, 0], [[], [0], [1], [2]]),  # a -> b -> a: a cycle of types
])
def test_segments_that_do_not_qualify(ops: list[int], operands: list[list[int]]) -> None:
    assert typed_program(_graph(ops, operands), {}, torch.device("cpu")) is None


def test_type_order_is_topological() -> None:
    # b reads a, a reads x, nodes of the three types interleaved: one batch each, in order
    graph = _graph([2, 0, 2, 1, 0], [[], [0], [], [1], [2]])
    kernels = {"abstract": lambda op, inputs, params, attrs: inputs[0]}
    plan = typed_program(graph, kernels, torch.device("cpu"))
    assert plan is not None
    assert [b.op_id for b in plan.schedule.batches] == [2, 0, 1]
    plan.schedule.validate(graph)


def _random_qualifying(rng: np.random.Generator, k: int, n: int) -> Graph:
    """``n`` nodes over ``k`` op types ranked in a random order; a node reads only nodes of
    lower-ranked types (an acyclic type graph, no edge within a type)."""
    rank = rng.permutation(k)
    vocab = Vocab([OpType(f"t{t}", "abstract", () if rank[t] == 0 else ((D,),) * (1 + t % 2),
                          (D,)) for t in range(k)])
    ops: list[int] = []
    operands: list[list[int]] = []
    for _ in range(n):
        t = int(rng.integers(k))
        lower = [v for v, o in enumerate(ops) if rank[o] < rank[t]]
        if rank[t] and not lower:  # nothing to read yet: a source node
            t = int(np.flatnonzero(rank == 0)[0])
        ops.append(t)
        operands.append([] if rank[t] == 0 else
                        [int(rng.choice(lower)) for _ in range(1 + t % 2)])
    ptr = np.cumsum([0] + [len(o) for o in operands])
    flat = np.array([v for o in operands for v in o], np.int32)
    return Graph.from_arrays(vocab, np.array(ops, np.int32), ptr, flat)


@pytest.mark.parametrize("seed", range(6))
def test_typed_batches_are_the_distinct_op_types_and_the_lower_bound(seed: int) -> None:
    # the claim behind ignoring the user's scheduler (module docstring of _typed): a
    # qualifying segment has one batch per op type present, ED-Batch's lower bound
    rng = np.random.default_rng(seed)
    graph = _random_qualifying(rng, k=int(rng.integers(2, 7)), n=int(rng.integers(5, 40)))
    kernels = {"abstract": lambda op, inputs, params, attrs: inputs[0]}
    plan = typed_program(graph, kernels, torch.device("cpu"))
    assert plan is not None
    plan.schedule.validate(graph)
    assert plan.schedule.num_batches == len(np.unique(graph.op_ids)) == lower_bound(graph)


def test_unbatchable_type_with_several_nodes_does_not_qualify() -> None:
    vocab = Vocab([OpType("x", "abstract", (), (D,)),
                   OpType("solo", "abstract", ((D,),), (D,), batchable=False)])
    graph = Graph.from_arrays(vocab, np.array([0, 1, 1], np.int32), np.array([0, 0, 1, 2]),
                              np.array([0, 0], np.int32))
    assert typed_program(graph, {}, torch.device("cpu")) is None
    one = Graph.from_arrays(vocab, np.array([0, 1], np.int32), np.array([0, 0, 1]),
                            np.array([0], np.int32))
    kernels = {"abstract": lambda op, inputs, params, attrs: inputs[0]}
    plan = typed_program(one, kernels, torch.device("cpu"))
    assert plan is not None and plan.schedule.num_batches == 2 == lower_bound(one)


def _weighted(op, inputs, params, attrs):  # type: ignore[no-untyped-def]
    """A source row from its attr, else ``attr / 1000 + sum_j (j + 1) * operand_j``:
    every operand and its slot shows in the value."""
    out = attrs.double()[:, None].expand(-1, D) / 1000.0
    for j, x in enumerate(inputs):
        out = out + (j + 1) * x
    return out


@pytest.mark.parametrize("seed", range(6))
def test_typed_reads_deliver_every_operand(seed: int) -> None:
    """The reads of a typed program (slices, gathers, parts of a gather shared by several
    slots, each called alone) hand every node its operands: node values equal a per-node
    evaluation on random qualifying graphs."""
    from edbatch.api._typed import GroupPart
    rng = np.random.default_rng(100 + seed)
    g = _random_qualifying(rng, k=int(rng.integers(2, 7)), n=int(rng.integers(20, 80)))
    graph = Graph.from_arrays(g.vocab, g.op_ids, g.operand_ptr, g.operand_ids,
                              attrs=np.arange(g.num_nodes, dtype=np.int64))
    plan = typed_program(graph, {"abstract": _weighted}, torch.device("cpu"))
    assert plan is not None
    outs: list[torch.Tensor] = []
    for step in plan.program.steps:
        outs.append(step.kernel(step.op, [r(outs) for r in step.reads], {}, step.attrs))
    want: list[torch.Tensor] = []
    for v in range(graph.num_nodes):
        ins = [want[int(u)] for u in graph.operands(v)]
        want.append(_weighted(None, ins, {}, torch.tensor([v]))[0])
    got = torch.stack([outs[int(plan.batch_of[v])][int(plan.row_of[v])]
                       for v in range(graph.num_nodes)])
    torch.testing.assert_close(got, torch.stack(want), rtol=0, atol=1e-12)
    assert seed or any(type(r) is GroupPart for s in plan.program.steps for r in s.reads)


def test_value_nodes_are_their_table_and_expert_reads_one_gather(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A later segment's value nodes read their table's rows in order: the step is the
    table itself (no lookup); the two experts reading those rows share one gather."""
    from edbatch.api._segments import _STATES
    from edbatch.api._typed import GroupPart, value_rows
    model = Routed()
    _run(model, True, monkeypatch)
    entries = list(_STATES[model.batch].cache.entries.values())
    steps = [s for e in entries for s in e.program.steps]
    values = [s for s in steps if s.op.name.startswith("value/")]
    assert values and all(s.kernel is value_rows for s in values)
    experts = [s for s in steps if s.op.name.startswith("user.exp")]
    parts = [r for s in experts for r in s.reads]
    assert parts and all(type(r) is GroupPart for r in parts)
    assert len({id(r.group) for r in parts}) == len(entries) - 2  # one per expert segment


def test_a_read_of_every_row_of_a_batch_is_its_output_itself() -> None:
    # x -> a -> b, each of b's rows reads a's rows in order: the output, no narrowed view
    # (whose backward zero-fills and copies a gradient of the whole output); a part of
    # a's rows stays a slice
    graph = _graph([2, 2, 0, 0, 1, 1], [[], [], [0], [1], [2], [3]])
    kernels = {"abstract": lambda op, inputs, params, attrs: inputs[0] * 2}
    plan = typed_program(graph, kernels, torch.device("cpu"))
    assert plan is not None
    reads = [r for s in plan.program.steps for r in s.reads]
    assert [type(r).__name__ for r in reads] == ["WholeRead", "WholeRead"]
    outs = [torch.ones(2, D, requires_grad=True)]
    assert reads[0](outs) is outs[0]
    part = typed_program(_graph([2, 2, 0, 1], [[], [], [0], [2]]), kernels,
                         torch.device("cpu"))
    assert part is not None
    assert [type(r).__name__ for s in part.program.steps for r in s.reads] == \
        ["SliceRead", "WholeRead"]
