"""Cell kinds as classes (:mod:`edbatch.executor.cell_kind`): a new kind defined here runs
batched and node by node with equal results and a hand backward equal to autograd (fp64);
declarations are checked by name; the built-in kinds keep their kernels' contract, their
hoisting table and, bit for bit, today's parameter initialisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.errors import ExecutionError, GraphError, UnknownNameError
from edbatch.executor import KERNELS, CellKind, Param, TorchExecutor, init_params, run_reference
from edbatch.executor._analytic import analytic
from edbatch.executor.cell_kind import (
    CELL_KINDS,
    HEAD_READS,
    HOISTS,
    RoleGrads,
    cell_kind_of,
)
from edbatch.executor.cells_seq import BiLSTML2
from edbatch.executor.params import declared_inits, embedding_params, is_embedding
from edbatch.graph import Graph, GraphBuilder, OpType, Vocab
from edbatch.memory import plan_memory
from edbatch.registry import Registry
from edbatch.schedule import make_scheduler
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS, Workload, loss_sum_op, make_workload
from tests.conftest import digest

torch.set_num_threads(1)

X, H, C = 3, 4, 5  # input width, hidden size, classes of the demo below


class Elman(CellKind, registry=None):  # registry=None: the tests pass it as an override
    """``h' = tanh(W [x; h] + b)`` with a hand-written backward (the docstring example)."""

    kind = "demo.elman"
    inputs = ("x", "h")
    params = (Param("W", "H, X+H"), Param("b", "H"))
    saves = ("xh", "y")

    @staticmethod
    def dims(op: OpType) -> dict[str, int]:
        assert op.in_shapes is not None
        return {"H": op.out_shape[0], "X": op.in_shapes[0][0]}

    def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                save: dict[str, Tensor] | None = None) -> Tensor:
        xh = torch.cat(list(inputs), dim=1)
        y = torch.tanh(F.linear(xh, p.W, p.b))
        if save is not None:
            save.update(xh=xh, y=y)
        return y

    def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                 grads: RoleGrads) -> list[Tensor | None]:
        dz = grad * (1 - saved.y * saved.y)
        grads.linear(("W", "b"), dz, saved.xh)
        dxh = dz @ p.W
        return [dxh[:, :X], dxh[:, X:]]


def demo_vocab() -> Vocab:
    return Vocab([
        OpType("demo.x", "lookup", (), (X,), ("demo.E",)),
        OpType("demo.h0", "lookup", (), (H,), ("demo.H0",)),
        Elman.op_type("demo.elman", ((X,), (H,)), (H,), b="demo.b", W="demo.W"),
        OpType("demo.loss", "tree_gru.loss", ((H,),), (1,), ("demo.out", "demo.out.b")),
        loss_sum_op()])


def demo_graph(lengths: Sequence[int], seed: int = 0) -> Graph:
    gen = torch.Generator().manual_seed(seed)
    builder = GraphBuilder(demo_vocab())
    losses = []
    for i, n in enumerate(lengths):
        builder.instance = i
        h = builder.add("demo.h0", attr=0)
        for _ in range(n):
            x = builder.add("demo.x", attr=int(torch.randint(0, 7, (1,), generator=gen)))
            h = builder.add("demo.elman", x, h)
            losses.append(builder.add("demo.loss", h,
                                      attr=int(torch.randint(0, C, (1,), generator=gen))))
    builder.instance = 0
    return builder.build([builder.add("loss_sum", *losses)])


def demo_params(dtype: torch.dtype) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(1)
    shapes = {"demo.E": (7, X), "demo.H0": (1, H), "demo.W": (H, X + H), "demo.b": (H,),
              "demo.out": (C, H), "demo.out.b": (C,)}
    return {k: torch.randn(s, generator=gen, dtype=dtype).requires_grad_()
            for k, s in shapes.items()}


def test_a_new_kind_runs_batched_equal_to_the_reference() -> None:
    graph = demo_graph([3, 1, 4, 2])
    params = demo_params(torch.float32)
    kernels = {"demo.elman": Elman.kernel}
    (ref,) = run_reference(graph, params, kernels=kernels).values()
    schedule = make_scheduler("depth")(graph)
    result = TorchExecutor(kernels=kernels).run(graph, schedule, plan_memory(graph, schedule),
                                                params)
    assert result.loss is not None
    torch.testing.assert_close(result.loss, ref.reshape(()), rtol=1e-6, atol=1e-6)
    # the same batch of nodes at once equals them one at a time
    op = demo_vocab()[2]
    x, h = torch.randn(5, X), torch.randn(5, H)
    whole = Elman.kernel(op, [x, h], params, torch.full((5,), -1))
    rows = torch.cat([Elman.kernel(op, [x[i:i + 1], h[i:i + 1]], params, torch.full((1,), -1))
                      for i in range(5)])
    torch.testing.assert_close(whole, rows)


@pytest.mark.parametrize("strategy", ["naive", "planned"])
def test_a_new_kinds_hand_backward_equals_autograd_in_fp64(strategy: str) -> None:
    graph = demo_graph([2, 5, 3], seed=2)
    kernels = {"demo.elman": Elman.kernel}
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    hand = TorchExecutor(dtype=torch.float64, kernels=kernels)
    program, _ = hand._program(graph, schedule, plan)
    assert analytic(program)  # every kernel, the new kind's included, has a backward
    params = demo_params(torch.float64)
    loss = hand.run(graph, schedule, plan, params, grad=True).loss
    assert loss is not None
    got = torch.autograd.grad(loss, list(params.values()))
    (ref,) = run_reference(graph, params, kernels=kernels).values()
    want = torch.autograd.grad(ref.sum(), list(params.values()))
    torch.testing.assert_close(loss, ref.reshape(()), rtol=1e-12, atol=1e-12)
    for name, g, w in zip(params, got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)


def test_defining_a_kind_registers_it() -> None:
    reg: Registry[Any] = Registry("op kind")

    class Twice(CellKind, registry=reg):
        kind = ("demo.twice", "demo.twice2")

        def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                    out: Tensor | None = None) -> Tensor:
            return torch.mul(inputs[0], 2.0, out=out)

    assert reg.names() == ("demo.twice", "demo.twice2")
    kernel = reg.get("demo.twice")
    assert kernel is Twice.kernel and cell_kind_of(kernel) is Twice
    assert kernel.writes_out and not hasattr(kernel, "backward")
    op = OpType("t", "demo.twice", ((2,),), (2,))
    out = torch.zeros(3, 2)
    assert kernel(op, [torch.ones(3, 2)], {}, torch.full((3,), -1), out=out) is out
    assert torch.equal(out, torch.full((3, 2), 2.0))
    with pytest.raises(ValueError, match="already registered"):
        class Again(CellKind, registry=reg):
            kind = "demo.twice"

            def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any,
                        attrs: Tensor) -> Tensor:
                return inputs[0]


def test_parameters_are_matched_by_name_with_clear_errors() -> None:
    op = Elman.op_type("e", ((X,), (H,)), (H,), W="d.W", b="d.b")
    assert op.params == ("d.W", "d.b") and op.kind == "demo.elman"
    with pytest.raises(GraphError, match=r"op type 'e' \(Elman\): parameter 'b' is not given"):
        Elman.op_type("e", ((X,), (H,)), (H,), W="d.W")
    with pytest.raises(GraphError, match="parameter 'bias' is not declared.*'b'"):
        Elman.op_type("e", ((X,), (H,)), (H,), W="d.W", b="d.b", bias="d.c")
    attrs, inputs = torch.full((2,), -1), [torch.randn(2, X), torch.randn(2, H)]
    params = {"d.W": torch.randn(H, X + H), "d.b": torch.randn(H), "d.c": torch.randn(H)}
    short = OpType("short", "demo.elman", ((X,), (H,)), (H,), ("d.W",))
    with pytest.raises(GraphError, match="'short'.*declared parameter 'b' has no name"):
        Elman.kernel(short, inputs, params, attrs)
    long = OpType("long", "demo.elman", ((X,), (H,)), (H,), ("d.W", "d.b", "d.c"))
    with pytest.raises(GraphError, match="'long'.*parameter 'd.c' is not declared"):
        Elman.kernel(long, inputs, params, attrs)
    swapped = OpType("swapped", "demo.elman", ((X,), (H,)), (H,), ("d.b", "d.W"))
    with pytest.raises(GraphError, match=r"'swapped'.*parameter 'W' \('d.b'\) has shape"):
        Elman.kernel(swapped, inputs, params, attrs)
    with pytest.raises(UnknownNameError, match="'d.b' of op type 'e' is missing"):
        Elman.kernel(op, inputs, {"d.W": params["d.W"]}, attrs)
    torch.testing.assert_close(Elman.kernel(op, inputs, params, attrs),
                               torch.tanh(torch.cat(inputs, 1) @ params["d.W"].T
                                          + params["d.b"]))


def test_saved_tensors_are_checked_against_the_declaration() -> None:
    class Forgetful(CellKind, registry=None):
        kind = "demo.forgetful"
        saves = ("x", "y")

        def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any, attrs: Tensor,
                    save: dict[str, Tensor] | None = None) -> Tensor:
            if save is not None:
                save.update(x=inputs[0], z=inputs[0])
            return inputs[0]

        def backward(self, op: OpType, saved: Any, grad: Tensor, p: Any, attrs: Tensor,
                     grads: RoleGrads) -> list[Tensor | None]:
            return [grad]

    op = OpType("f", "demo.forgetful", ((2,),), (2,))
    with pytest.raises(ExecutionError, match=r"missing \['y'\], undeclared \['z'\]"):
        Forgetful.kernel(op, [torch.ones(1, 2)], {}, torch.full((1,), -1), save=[])
    saved: list[Any] = []
    Elman.kernel(demo_vocab()[2], [torch.ones(1, X), torch.ones(1, H)], demo_params(
        torch.float32), torch.full((1,), -1), save=saved)
    (entry,) = saved
    assert entry._fields == ("xh", "y") and entry.xh.shape == (1, X + H)


def test_declarations_are_checked_when_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match="init 'glorotish'.*Did you mean 'glorot'"):
        class BadInit(CellKind, registry=None):
            params = (Param("W", init="glorotish"),)
    with pytest.raises(TypeError, match="defines backward, so its forward must take save="):
        class NoSave(CellKind, registry=None):
            def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any,
                        attrs: Tensor) -> Tensor:
                return inputs[0]

            def backward(self, *args: Any) -> list[Tensor | None]:
                return []
    with pytest.raises(TypeError, match="operand 'h' .* is not in inputs"):
        class BadHeads(CellKind, registry=None):
            inputs = ("x",)
            head_reads = ("h",)


def test_builtin_kernels_keep_the_kernel_contract() -> None:
    hand = {"tree_lstm.leaf", "tree_lstm.internal", "lattice_lstm.char_arc", "bilstm.l2_fwd",
            "bilstm.loss", "seq2seq.dec", "tree_gru.loss", "lookup", "bilstm.zero_state"}
    for kind in hand:
        assert hasattr(KERNELS.get(kind), "backward"), kind
    for kind in ("tree_gru.leaf", "tree_gru.internal", "mvrnn.internal",
                 "lattice_gru.word_arc"):
        assert not hasattr(KERNELS.get(kind), "backward"), kind
    assert KERNELS.get("tree_lstm.internal").writes_out  # type: ignore[attr-defined]
    assert not getattr(KERNELS.get("bilstm.loss"), "writes_out", False)
    assert set(CELL_KINDS) <= set(KERNELS.names())
    assert cell_kind_of(KERNELS.get("tanh")) is None  # primitives stay functions


def test_the_hoisting_table_comes_from_the_declarations() -> None:
    table = {k: (s.hoisted, s.state, s.weight, s.heads) for k, s in HOISTS.items()}
    hand = {  # the integer slots of the hand-written table this replaces
        "bilstm.l1_fwd": ((0,), 1, 0, False), "bilstm.l1_bwd": ((0,), 1, 0, False),
        "bilstm.l2_fwd": ((0, 1), 2, 0, True), "bilstm.l2_bwd": ((0, 1), 2, 0, True),
        "lattice_lstm.char_arc": ((), 0, 1, False), "lattice_lstm.word_arc": ((), 0, 1, False),
        "seq2seq.enc": ((), 0, 3, False), "seq2seq.dec": ((), 0, 3, False)}
    assert {k: table.get(k) for k in hand} == hand
    # kinds added since (e.g. the parser's LSTM steps) subclass one of these and keep its slots
    assert {k: v for k, v in table.items() if k not in hand and v not in hand.values()} == {}
    hand_heads = {"bilstm.l2_fwd": (0, 1), "bilstm.l2_bwd": (0, 1), "bilstm.loss": (0, 1)}
    assert {k: HEAD_READS.get(k) for k in hand_heads} == hand_heads
    # later kinds that read BiLSTM heads (parser features and steps, char composition)
    assert {"parser.feat", "parser.l2_fwd", "parser.l2_bwd", "char_tagger.compose"} <= \
        set(HEAD_READS)
    assert BiLSTML2.hoist is not None and BiLSTML2.hoist.hoisted == ("f1", "b1")
    assert HOISTS["bilstm.l2_fwd"].cell is not HOISTS["bilstm.l2_bwd"].cell


# ---------------------------------------------------------------------- initialisation
def small(name: str, granularity: str) -> Workload:
    """The sizes the fixture hashes below were computed with."""
    kw: dict[str, int] = {"hidden_dim": 3} if name == "mvrnn" else {"embed_dim": 4,
                                                                   "hidden_dim": 3}
    if name in ("lattice_lstm", "lattice_gru", "seq2seq"):
        kw["vocab_size"] = 50
    return make_workload(name, granularity=granularity, **kw)


#: sha256 prefixes of init_params (seeds 0 and 7) computed with the naming-convention
#: initialisation this replaced (commit 912ae8a, before the cell kinds moved).
BEFORE = {
    ("tree_lstm", "cell"): ("4471e5d6a28e977a", "686313f65df4970b"),
    ("tree_lstm", "primitive"): ("049b37294c58ee6b", "be6b0fa2e9a66f88"),
    ("mvrnn", "cell"): ("a642bf7196d2cd25", "d305650f59d5031f"),
    ("lattice_lstm", "primitive"): ("88876aa4e3a06b19", "574bd69cbb713ac9"),
    ("lattice_gru", "cell"): ("9248f1af1e12d138", "f596c912bd281770"),
    ("seq2seq", "cell"): ("b4c119335ce473c6", "1dc399510eeecbfb"),
}


@pytest.mark.parametrize(("name", "granularity"), sorted(BEFORE))
def test_init_is_bit_identical_to_before(name: str, granularity: str) -> None:
    wl = small(name, granularity)
    got = tuple(digest(init_params(wl, torch.Generator().manual_seed(s))) for s in (0, 7))
    assert got == BEFORE[(name, granularity)]


@pytest.mark.parametrize(("name", "granularity"), [
    (name, g) for name in REAL_WORKLOADS for g in WORKLOADS[name].granularities])
def test_declared_initialisers_cover_every_table(name: str, granularity: str) -> None:
    wl = make_workload(name, granularity=granularity,
                       **WORKLOADS[name].test_kwargs(4, 3, short=True))
    tables = embedding_params(wl)
    assert tables and tables == {n for n in wl.param_shapes() if is_embedding(n)}
    assert set(declared_inits(wl).values()) == {"embedding"}
    params = init_params(wl, torch.Generator().manual_seed(3))
    for n, p in params.items():
        if p.dim() == 1:
            assert not p.any(), n
        elif n in tables:
            assert 0 < p.abs().max() <= 0.1, n
        else:
            assert 0 < p.abs().max() <= (6 / (p.shape[0] + p.shape[1])) ** 0.5, n


def test_conflicting_initialisers_are_an_error() -> None:
    class Other(CellKind, registry=None):
        kind = "demo.other_loss"
        params = (Param("W", "C, K", init="glorot"), Param("b", "C"))

        def forward(self, op: OpType, inputs: Sequence[Tensor], p: Any,
                    attrs: Tensor) -> Tensor:
            return inputs[0]

    wl = small("tree_gru", "cell")
    kernels = {"demo.other_loss": Other.kernel}
    wl.vocab = Vocab([*wl.vocab, OpType("other", "demo.other_loss", ((3,),), (1,),
                                        ("tree_gru.W_out", "tree_gru.W_out.b"))])
    assert declared_inits(wl, kernels) == {"tree_gru.E": "embedding",
                                           "tree_gru.W_out": "glorot"}
    wl.vocab = Vocab([*wl.vocab, OpType("clash", "demo.other_loss", ((3,),), (1,),
                                        ("tree_gru.E", "tree_gru.W_out.b"))])
    with pytest.raises(GraphError, match=r"'tree_gru.E' is declared init='embedding' by op "
                                         r"type 'tree_gru.leaf' but init='glorot' by op type "
                                         r"'clash' \(Other.W\)"):
        init_params(wl, kernels=kernels)


def test_bound_op_types_stay_bounded_and_tuple_kinds_need_kind() -> None:
    params = demo_params(torch.float32)
    for i in range(5000):  # e.g. projection op types made per compiled program
        Elman.kernel.names(Elman.op_type(f"e{i}", ((X,), (H,)), (H,), W="demo.W",
                                         b="demo.b"), params)
    assert 0 < len(Elman.kernel._bound) <= 4096
    with pytest.raises(GraphError, match="serves kinds .* pass kind="):
        BiLSTML2.op_type("l2", ((6,),) * 3, (6,), W="w", b="b")
    op = BiLSTML2.op_type("l2", ((6,),) * 3, (6,), kind="bilstm.l2_bwd", b="b", W="w")
    assert (op.kind, op.params) == ("bilstm.l2_bwd", ("w", "b"))
