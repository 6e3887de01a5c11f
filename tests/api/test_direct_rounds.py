"""Direct rounds (:mod:`edbatch.api._direct`): a repeated one-cell round of ``run_programs``
run as one gather and one kernel call, or a repeated chain of cells per instance (a greedy
decoder's ``dec`` then ``logits``) as one per chain position, gives what the long path gives
(returns, segment graphs and schedules), is refused where the long path's segment differs
(shared reads, loss terms, mixed op types, new inputs, repetitions wired otherwise,
gradients) and is never taken when its first direct computation differs."""

from __future__ import annotations

import importlib.util
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from edbatch.api import DynamicBatch, _direct, argmax
from edbatch.executor.cells_parser import side_by_side
from experiments.parser_model import ApiParser, reference_parse
from tests.workloads.test_transition_parser import fp64_params, small

__all__: list[str] = []


def _direct_count(out: Any) -> int:
    return sum(isinstance(s, _direct.DirectSegment) for s in out.segments)


def _same_segments(a: Any, b: Any) -> None:
    assert len(a.segments) == len(b.segments)
    for s, t in zip(a.segments, b.segments, strict=True):
        g, h = s.graph, t.graph
        for name in ("op_ids", "operand_ids", "operand_ptr", "attrs", "instance", "outputs"):
            assert np.array_equal(getattr(g, name), getattr(h, name)), name
        assert [g.vocab[o].name for o in g.op_ids] == [h.vocab[o].name for o in h.op_ids]
        assert [(x.op_id, x.node_ids.tolist()) for x in s.schedule.batches] == \
            [(x.op_id, x.node_ids.tolist()) for x in t.schedule.batches]
        assert s.run.num_kernel_calls == t.run.num_kernel_calls
        counts = ("exec/num_views", "exec/num_gathers", "exec/num_kernel_calls")
        assert [s.run.stats[k] for k in counts] == [t.run.stats[k] for k in counts]


def test_parser_rounds_run_directly_with_the_long_paths_trees_and_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wl = small()
    params = fp64_params(wl, seed=3)
    sentences = [inst.embed_attrs for inst in wl.load("dev")[:12]]
    refs = [reference_parse(wl, params, a) for a in sentences]
    model = ApiParser(wl, params, dtype=torch.float64)
    monkeypatch.setattr(_direct, "DIRECT", False)
    plain, off = model.parse(sentences)
    assert _direct_count(off) == 0
    monkeypatch.setattr(_direct, "DIRECT", True)
    for _ in range(2):  # the first learns each round size, the second runs them directly
        parses, on = model.parse(sentences)
        assert parses == plain == refs
        assert on.syncs == off.syncs
        _same_segments(on, off)
    assert _direct_count(on) == len(on.segments) - 1  # every decision round (not the encoder)


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4).double()

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.lin(torch.cat([a, b], dim=1))


class _SumSq(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return (x * x).sum(1)


def _model() -> tuple[DynamicBatch, Any, Any, Any]:
    torch.manual_seed(0)
    batch = DynamicBatch(dtype=torch.float64)
    emb = batch.cell(nn.Linear(3, 3).double(), "emb", [3], 3)
    pair = batch.cell(_Pair(), "pair", [3, 3], 4)
    return batch, emb, pair, batch.cell(_SumSq(), "sumsq", [4], ())


def _program(batch: DynamicBatch, emb: Any, pair: Any, sumsq: Any, x: Tensor, rounds: int,
             shared: bool, loss_at: int) -> Generator[Any, Any, list[int]]:
    """Reads the argmax of ``pair`` over two earlier nodes per round, picked by the last
    argmax (both the same node when ``shared``: the long path then makes one value node per
    node read); a loss term recorded in round ``loss_at``."""
    hs = [emb(batch.input(x[k])) for k in range(len(x))]
    got, best = [], 0
    for r in range(rounds):
        a = hs[(r + best) % len(hs)]
        s = pair(a, a if shared else hs[(r + best + 1) % len(hs)])
        if r == loss_at:
            batch.add_loss(sumsq(s))
        best = yield argmax(s)
        got.append(best)
    return got


@pytest.mark.parametrize("shared, loss_at", [(False, -1), (True, -1), (False, 2)])
def test_direct_rounds_equal_the_long_path(monkeypatch: pytest.MonkeyPatch, shared: bool,
                                           loss_at: int) -> None:
    xs = [torch.randn(4, 3, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
          for k in range(6)]
    rounds = [5, 7, 5, 6, 7, 7]  # rounds of 6, then 5 (and 3) programs: sizes repeat
    outs = {}
    for flag in (False, True, True):
        monkeypatch.setattr(_direct, "DIRECT", flag)
        batch, emb, pair, sumsq = _model()
        for _ in range(2):  # (the second mini-batch finds the first's plans)
            out = batch.run_programs([_program(batch, emb, pair, sumsq, x, r, shared,
                                               loss_at)
                                      for x, r in zip(xs, rounds, strict=True)], grad=False)
        outs[flag] = out
        assert out.returns == outs[False].returns
        _same_segments(out, outs[False])
        if loss_at >= 0:
            assert out.loss is not None and torch.equal(out.loss, outs[False].loss)
    direct = _direct_count(outs[True])
    if shared:
        assert direct == 0  # (the long path's segment has one value node per node read)
    else:
        # every round but the first (with the inputs) and the one with the loss term
        assert direct == len(outs[True].segments) - (2 if loss_at >= 0 else 1)


def test_a_direct_computation_that_differs_is_never_taken(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    compute = _direct._compute

    def off_by_a_bit(*args: Any) -> tuple[list[Tensor], float]:
        outs, seconds = compute(*args)
        return [o + 1e-12 for o in outs], seconds

    monkeypatch.setattr(_direct, "_compute", off_by_a_bit)
    wl = small()
    params = fp64_params(wl, seed=4)
    sentences = [inst.embed_attrs for inst in wl.load("dev")[12:20]]
    model = ApiParser(wl, params, dtype=torch.float64)
    for _ in range(2):
        parses, out = model.parse(sentences)
        assert parses == [reference_parse(wl, params, a) for a in sentences]
        assert _direct_count(out) == 0


def test_side_by_side_is_cat_and_joins_column_blocks_without_a_copy() -> None:
    rows = torch.randn(6 * 4, 5, dtype=torch.float64)  # 6 instances x 4 slots, in that order
    joined = rows.view(6, 20)
    blocks = [joined[:, 5 * s:5 * (s + 1)] for s in range(4)]
    got = side_by_side(blocks)
    assert torch.equal(got, torch.cat(blocks, dim=1)) and got.data_ptr() == rows.data_ptr()
    slot_major = [rows[6 * s:6 * (s + 1)] for s in range(4)]  # (the long path's slot views)
    assert torch.equal(side_by_side(slot_major), torch.cat(slot_major, dim=1))
    shuffled = [blocks[1], blocks[0], *blocks[2:]]
    assert torch.equal(side_by_side(shuffled), torch.cat(shuffled, dim=1))
    assert side_by_side(shuffled).data_ptr() != rows.data_ptr()
    some = blocks[:3]  # (consecutive, but not whole rows)
    assert torch.equal(side_by_side(some), torch.cat(some, dim=1))
    assert side_by_side(some).data_ptr() != rows.data_ptr()


# ---------------------------------------------------------------------- chains
def _chain_model() -> tuple[DynamicBatch, Any, Any, Any, Any]:
    batch, emb, pair, sumsq = _model()
    head = batch.cell(nn.Linear(4, 3).double(), "head", [4], 3)
    return batch, emb, pair, head, sumsq


def _chain_program(batch: DynamicBatch, cells: tuple[Any, ...], x: Tensor, rounds: int,
                   kind: str, loss_at: int, me: int, last: list[Any]
                   ) -> Generator[Any, Any, list[int]]:
    """Per round a chain reading earlier rounds' nodes: ``pair(a, b)`` then ``head`` of it
    (``chain2``; ``chain3`` then ``pair(head, a)`` too, a slot of each kind); ``shared``:
    ``a`` is ``b``; from the fourth round (after rounds of the same size ran directly),
    ``cross``: ``head`` reads the ``pair`` the program before recorded in this round,
    ``odd``: the odd programs' ``head`` reads an earlier node; ``input``: the chain takes a
    new input row. The next round reads the ``head`` node."""
    emb, pair, head, sumsq = cells
    hs = [emb(batch.input(x[k])) for k in range(len(x))]
    got, best, ps = [], 0, []
    for r in range(rounds):
        a = hs[(r + best) % len(hs)]
        b = a if kind == "shared" else hs[(r + best + 1) % len(hs)]
        s = pair(a, b)
        into = s
        if kind == "cross" and last[0] is not None and r >= 3:
            into = last[0]
        last[0] = s
        if kind == "odd" and me % 2 and r >= 3:
            into = ps[-1]  # (the same op types, another wiring)
        ps.append(s)
        t = head(into)
        end = t
        if kind == "chain3":
            end = pair(t, a)
        if kind == "input":
            end = pair(t, emb(batch.input(x[r % len(x)])))
        if r == loss_at:
            batch.add_loss(sumsq(end if end.shape == (4,) else pair(t, t)))
        best = yield argmax(end)
        got.append(best)
        hs.append(t)
    return got


def _chain_run(kind: str, loss_at: int = -1, grad: bool = False, runs: int = 3) -> Any:
    xs = [torch.randn(3, 3, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
          for k in range(6)]
    rounds = [5, 7, 5, 6, 7, 7]
    batch, *cells = _chain_model()
    for _ in range(runs):  # (the last mini-batch finds the earlier ones' plans)
        last: list[Any] = [None]
        out = batch.run_programs([_chain_program(batch, tuple(cells), x, r, kind, loss_at, i,
                                                 last)
                                  for i, (x, r) in enumerate(zip(xs, rounds, strict=True))],
                                 grad=grad)
    return out


@pytest.mark.parametrize("kind, loss_at, direct", [
    ("chain2", -1, "all"), ("chain3", -1, "all"), ("chain2", 2, "all but the loss"),
    ("shared", -1, "none"), ("cross", -1, "two"), ("odd", -1, "two"), ("input", -1, "none")])
def test_chain_rounds_equal_the_long_path(monkeypatch: pytest.MonkeyPatch, kind: str,
                                          loss_at: int, direct: str) -> None:
    monkeypatch.setattr(_direct, "DIRECT", False)
    off = _chain_run(kind, loss_at)
    assert _direct_count(off) == 0
    monkeypatch.setattr(_direct, "DIRECT", True)
    on = _chain_run(kind, loss_at)
    assert on.returns == off.returns and on.syncs == off.syncs
    _same_segments(on, off)
    if loss_at >= 0:
        assert on.loss is not None and torch.equal(on.loss, off.loss)
    want = {"all": len(on.segments) - 1,  # (every round but the first, with the inputs)
            "all but the loss": len(on.segments) - 2, "none": 0,
            "two": 2}[direct]  # (rounds 2 and 3, wired as the first)
    assert _direct_count(on) == want


def test_chain_rounds_are_not_taken_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_direct, "DIRECT", True)
    out = _chain_run("chain2", loss_at=2, grad=True)
    assert _direct_count(out) == 0 and out.loss is not None
    out.loss.backward()


def test_a_chain_whose_later_position_differs_is_never_taken(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    compute = _direct._compute

    def last_off(*args: Any) -> tuple[list[Tensor], float]:
        outs, seconds = compute(*args)
        return [*outs[:-1], outs[-1] * (1 + 1e-12) if len(outs) > 1 else outs[-1]], seconds

    monkeypatch.setattr(_direct, "DIRECT", False)
    off = _chain_run("chain3")
    monkeypatch.setattr(_direct, "DIRECT", True)
    monkeypatch.setattr(_direct, "_compute", last_off)
    on = _chain_run("chain3")
    assert on.returns == off.returns
    assert _direct_count(on) == 0


def test_chain_values_are_registered_where_the_long_path_puts_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new node's value (read with ``result.stack``) is the long path's."""
    monkeypatch.setattr(_direct, "DIRECT", True)
    on = _chain_run("chain3")
    monkeypatch.setattr(_direct, "DIRECT", False)
    off = _chain_run("chain3")
    n = len(on.values.batch[on.values.batch >= 0])
    assert n == len(off.values.batch[off.values.batch >= 0])
    nodes = np.arange(n)
    for width in {o.shape[1] for o in off.values.outputs}:  # (one gather per row width)
        ids = nodes[[off.values.outputs[b].shape[1] == width
                     for b in off.values.batch[:n]]]
        assert torch.equal(on.values.gather(ids), off.values.gather(ids))


def _decoder() -> Any:
    path = Path(__file__).resolve().parents[2] / "examples" / "greedy_decode.py"
    spec = importlib.util.spec_from_file_location("greedy_decode_direct", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Decoder


@pytest.mark.parametrize("scheduler", ["typewise_greedy", "depth"])
def test_greedy_decoding_rounds_run_directly(monkeypatch: pytest.MonkeyPatch,
                                             scheduler: str) -> None:
    model = _decoder()(hidden=8, vocab_size=64, dtype=torch.float64)
    sources = [inst.source_ids for inst in model.wl.load("test")[:10]]
    limits = [3 + i % 5 for i in range(len(sources))]  # (the rounds shrink)

    def decode() -> Any:
        return model.batch.run_programs([model.program(s, n) for s, n in
                                         zip(sources, limits, strict=True)], scheduler,
                                        grad=False)

    monkeypatch.setattr(_direct, "DIRECT", False)
    off = decode()
    monkeypatch.setattr(_direct, "DIRECT", True)
    for _ in range(2):  # the first learns each round size, the second runs them directly
        on = decode()
        assert on.returns == off.returns and on.syncs == off.syncs
        _same_segments(on, off)
    assert _direct_count(on) == len(on.segments) - 1  # every decoding round (not the encoder)
