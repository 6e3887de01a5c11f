"""The recorder's C calls (``edbatch/api/_fastrec.c`` through :mod:`edbatch.api._fast`)
against its Python functions (their twin, and their fallback for everything else): the same
recording, list for list, on the benchmark's user models and on a run of odd and bad calls
(each bad one raising the same error and recording nothing)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.recording_speed import make_recorder
from edbatch import api
from edbatch.api import DynamicBatch, _fast, _handles
from edbatch.errors import GraphError
from edbatch.executor import init_params
from edbatch.workloads import make_workload

FIELDS = ("ops", "operands", "attrs", "counts", "losses", "marks", "blocks", "block_firsts")
W = 3


def _lists(batch: DynamicBatch) -> dict[str, list[Any]]:
    rec = batch._rec
    return {f: [(type(v), v) for v in getattr(rec, f)] for f in FIELDS}


def _paths(monkeypatch: pytest.MonkeyPatch, make: Callable[[], Any]) -> list[Any]:
    """``make()`` with the C calls (where built) and with the Python functions only."""
    out = [make()]
    monkeypatch.setattr(_fast, "ENABLED", False)
    out.append(make())
    return out


def test_the_c_calls_are_taken_where_built() -> None:
    batch = DynamicBatch.from_workload(make_workload("tree_lstm_sick", embed_dim=4,
                                                     hidden_dim=W))
    calls = (batch.op("tree_lstm_sick.embed"), batch.op("tree_lstm_sick.node"),
             batch.cell(nn.Linear(W, W), "lin", [W], W),
             batch.cell(_Sum(), "sum", [W, W], W, variadic=True), batch.add_loss, batch.lookup)
    if _fast._fastrec is None:
        pytest.skip("edbatch.api._fastrec not loaded (not built, or EDBATCH_PURE_RECORDING=1)")
    assert _fast.ENABLED
    assert [type(c).__name__ for c in calls] == ["OpCall"] * 4 + ["AddLoss", "Lookup"]
    assert all(callable(c.fallback) and type(c.fallback) is not type(c) for c in calls)


@pytest.mark.parametrize("model", ["tree_lstm", "lattice_lstm", "bilstm_tagger", "tree_cells",
                                   "childsum_cells"])
def test_c_and_python_calls_record_the_same_lists(model: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wl = make_workload("tree_lstm" if model.endswith("cells") else model, embed_dim=4,
                       hidden_dim=4)
    data = list(wl.load("dev")[:12])

    def record() -> dict[str, list[Any]]:
        torch.manual_seed(0)
        batch, rec = make_recorder(api, model, wl, 4)
        rec(data)
        return _lists(batch)

    fast, slow = _paths(monkeypatch, record)
    assert len(fast["ops"]) > 100
    assert fast == slow


class _Sum(nn.Module):
    """A variadic cell's module: its fixed operand plus the sum of the repeated ones."""

    def forward(self, x: torch.Tensor, rows: torch.Tensor, segment: torch.Tensor,
                size: int) -> torch.Tensor:
        return x + rows.new_zeros((size, W)).index_add(0, segment, rows)


class _Label(nn.Module):
    def forward(self, x: torch.Tensor, attrs: torch.Tensor) -> torch.Tensor:
        return x.sum(1) * attrs


class _Pair(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def _odd_calls() -> tuple[dict[str, list[Any]], list[str]]:
    """A mini-batch of odd calls (each allowed one recorded, each bad one's error kept),
    the node ids handed out, and the errors."""
    batch = DynamicBatch.from_workload(make_workload("tree_lstm", embed_dim=4, hidden_dim=W))
    leaf, internal, loss = (batch.op(f"tree_lstm.{n}") for n in ("leaf", "internal", "loss"))
    sick = DynamicBatch.from_workload(make_workload("tree_lstm_sick", embed_dim=4,
                                                    hidden_dim=W))
    pair = batch.cell(_Pair(), "pair", [W, W], W)
    add = batch.cell(_Sum(), "add", [W, W], W, variadic=True)
    embed, other = nn.Embedding(5, W), nn.Embedding(4, W)
    batch.lookup(embed, 0)  # (registered, in the stale mini-batch)
    lab = batch.cell(_Label(), "lab", [W], (), takes_attr=True)
    stale = leaf(attr=0)
    batch.discard()
    node = sick.op("tree_lstm_sick.node")
    e = sick.op("tree_lstm_sick.embed")(attr=1)
    errors, ids = [], []
    with batch.instance():
        x, wide = batch.input(torch.ones(W)), batch.input(torch.ones(W + 1))
        a, b = leaf(attr=1), leaf(attr=np.int64(2))
        calls: list[Callable[[], Any]] = [
            lambda: internal(a, b), lambda: internal(a), lambda: internal(a, b, a),
            lambda: internal(a, stale), lambda: internal(a, 5), lambda: leaf(attr="w"),
            lambda: leaf(a), lambda: leaf(), lambda: internal(a, b, attr=7),
            lambda: internal(a, b, bad=1), lambda: loss(a, attr=True),
            lambda: pair(x, x), lambda: pair(x, wide), lambda: pair(x, x, attr=None),
            lambda: pair(x, x, attr=1), lambda: pair(x), lambda: pair(x, stale),
            lambda: lab(x, attr=3), lambda: lab(x, attr=True), lambda: lab(x, attr=np.int64(4)),
            lambda: lab(x), lambda: lab(x, attr=None), lambda: lab(wide, attr=1),
            lambda: batch.add_loss(lab(x, attr=5)), lambda: batch.add_loss(a),
            lambda: batch.add_loss(stale), lambda: batch.add_loss(7),
            lambda: batch.add_loss(loss(internal(a, b), attr=1)),
            lambda: batch.add_loss(loss(a, attr=2), 3),
            lambda: add(x), lambda: add(x, x, x), lambda: add(x, x, wide), lambda: add(wide),
            lambda: add(x, stale), lambda: add(x, 5), lambda: add(x, x, attr=1),
            lambda: add(x=x), lambda: add(),
            lambda: batch.lookup(embed, 4), lambda: batch.lookup(embed, 5),
            lambda: batch.lookup(embed, -1), lambda: batch.lookup(embed, True),
            lambda: batch.lookup(embed, np.int64(1)), lambda: batch.lookup(embed, 2**70),
            lambda: batch.lookup(embed, 1, name="x"), lambda: batch.lookup(other, 3),
            lambda: batch.lookup(other, 1), lambda: batch.lookup([], 1),
            lambda: batch.lookup(embed), lambda: pair(batch.lookup(embed, 1), x),
            lambda: node(), lambda: node(e, e, attr=3), lambda: node(e, x), lambda: node(e, 1),
        ]
        for call in calls:
            try:
                h = call()
            except Exception as err:  # (an AttributeError from lookup([], 1) too)
                errors.append(f"{type(err).__name__}: {err}")
            else:
                ids.append(getattr(h, "node_id", h))
    return {**_lists(batch), "ids": ids, "sick": _lists(sick)}, errors


def test_odd_and_bad_calls_record_and_raise_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    (fast, fast_errors), (slow, slow_errors) = _paths(monkeypatch, _odd_calls)
    assert fast_errors == slow_errors and len(fast_errors) >= 14
    assert fast == slow


def test_current_follows_every_new_recording() -> None:
    """The C calls read the batch's recording from ``_current``: it is ``_rec`` after a
    discard, a run, a failed run and run_programs."""
    wl = make_workload("tree_lstm", embed_dim=4, hidden_dim=W)
    batch = DynamicBatch.from_workload(wl, init_params(wl, torch.Generator().manual_seed(0)))
    leaf, loss = batch.op("tree_lstm.leaf"), batch.op("tree_lstm.loss")

    def program() -> Any:
        h = leaf(attr=1)
        yield h
        batch.add_loss(loss(h, attr=1))

    assert batch._current.rec is batch._rec
    for record_first, step in ((True, batch.discard),
                               (True, lambda: batch.run("depth", grad=False)),
                               (False, lambda: batch.run_programs([program()], grad=False))):
        if record_first:
            with batch.instance():
                batch.add_loss(loss(leaf(attr=2), attr=0))
        old = batch._rec
        step()
        assert batch._rec is not old and batch._current.rec is batch._rec
    with pytest.raises(GraphError, match="empty"):
        batch.run("depth")
    assert batch._current.rec is batch._rec
    with batch.instance():
        h = leaf(attr=3)
    assert h._rec is batch._rec and batch._rec.ops == [0]


def test_held_handles_in_c_equal_the_python_twin() -> None:
    """``_fastrec.held`` (what ``recycle`` asks where built) finds the handles held besides
    the pool exactly as ``held_handles`` does, none held or some."""
    if _handles._fastrec is None:
        pytest.skip("edbatch.api._fastrec is not built (no C compiler at install time)")
    pool: list[Any] = []
    _handles.grow_pool(pool, 2999)  # (made in C, as _fresh makes them)
    twin = [_handles._fresh(7)]
    assert [h.node_id for h in pool] == list(range(len(pool))) and len(pool) >= 3000
    assert type(pool[7]) is type(twin[0]) and sys.getrefcount(pool[7]) == sys.getrefcount(twin[0])
    with pytest.raises(AttributeError):
        pool[7]._rec  # noqa: B018
    rng = np.random.default_rng(0)
    for held_count in (0, 1, 7, 300):
        kept = [pool[int(v)] for v in rng.choice(3000, held_count, replace=False)]
        kept += kept[:2]  # (held twice)
        for used in (0, 1, 1500, 3000, 3500):
            used = min(used, len(pool))
            want = _handles.held_handles(pool, used) if used else []
            assert _handles._fastrec.held(pool, used, _handles._FREE - 1) == want
            assert sorted(want) == sorted({h.node_id for h in kept if h.node_id < used})
        del kept


def test_pack_in_c_gives_structs_bytes_or_leaves_it_to_struct() -> None:
    """``_fastrec.pack`` (graph assembly's packer where built) gives ``struct.pack``'s bytes
    for exact ints in range and ``None`` (struct decides) for anything else."""
    if _handles._fastrec is None:
        pytest.skip("edbatch.api._fastrec is not built (no C compiler at install time)")
    pack = _handles._fastrec.pack
    edge = [0, -1, 1, 2**31 - 1, -(2**31), 255, 256, 10**6]
    for code, size, extra in (("i", 4, []), ("q", 8, [2**63 - 1, -(2**63), 2**40])):
        values = edge + extra
        for more in ([], [7], values[::-1]):
            want = struct.pack(f"{len(values) + len(more)}{code}", *values, *more)
            assert pack(values, size, more) == want
        assert pack([], size, []) == b""
        for odd in (True, np.int64(3), 2.0, "1", None, 2**64, -(2**64)):
            assert pack([1, odd, 2], size, []) is None and pack([1], size, [odd]) is None
    assert pack([2**31], 4, []) is None and pack([-(2**31) - 1], 4, []) is None


def test_pure_recording_switch_leaves_the_c_module_unloaded() -> None:
    """``EDBATCH_PURE_RECORDING=1``: no C call anywhere (op and cell calls, pool growth, held
    handles, packing all read ``_handles._fastrec``), not only in the op and cell calls."""
    code = ("from edbatch.api import _fast, _handles, _assemble; "
            "print(_handles._fastrec is None, _assemble._fastrec is None, _fast.ENABLED)")
    env = {**os.environ, "EDBATCH_PURE_RECORDING": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]
