"""Bulk recording: ``Cell.map``, ``edbatch.api.switch`` and the ``Handles`` they return
record the same graph as calls node by node, and keep the checks and errors of a call."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, Handles, switch
from edbatch.errors import GraphError


def _batch():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    b = DynamicBatch(dtype=torch.float64)
    emb = nn.Embedding(10, 3).double()
    cells = {"embed": b.cell(emb, "embed", [], 3, takes_attr=True),
             "a": b.cell(nn.Linear(3, 3).double(), "a", [3], 3),
             "b": b.cell(nn.Linear(3, 3).double(), "b", [3], 3),
             "mix": b.cell(lambda x, y: x * y, "mix", [3, 3], 3),
             "sq": b.cell(lambda h: h.pow(2).sum(1), "sq", [3], ())}
    return b, cells


def _record(b, c, bulk: bool, words, choice):  # type: ignore[no-untyped-def]
    with b.instance():
        if bulk:
            xs = c["embed"].map(attrs=words)
            ys = switch([c["a"], c["b"]], choice, xs)
            zs = c["mix"].map(xs, ys)
        else:
            xs = [c["embed"](attr=w) for w in words]
            ys = [(c["a"], c["b"])[k](x) for k, x in zip(choice, xs, strict=True)]
            zs = [c["mix"](x, y) for x, y in zip(xs, ys, strict=True)]
        for z in zs:
            b.add_loss(c["sq"](z))


def test_map_and_switch_record_the_same_graph_as_single_calls() -> None:
    words, choice = [1, 4, 2, 7], [0, 1, 1, 0]
    b, c = _batch()
    _record(b, c, True, words, choice)
    bulk = b.graph()[0]
    got = b.run("depth").loss
    _record(b, c, False, words, choice)
    single = b.graph()[0]
    want = b.run("depth").loss
    assert bulk.op_ids.tolist() == single.op_ids.tolist()
    assert bulk.operand_ids.tolist() == single.operand_ids.tolist()
    assert bulk.attrs.tolist() == single.attrs.tolist()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_handles_index_like_a_list_and_yield_whole() -> None:
    b, c = _batch()

    def program(words):  # type: ignore[no-untyped-def]
        xs = c["embed"].map(attrs=words)
        assert isinstance(xs, Handles) and len(xs) == len(words)
        assert xs[-1].node_id == xs[len(words) - 1].node_id and len(xs[1:]) == len(words) - 1
        with pytest.raises(IndexError):
            xs[len(words)]
        values = yield xs                       # one check for the whole block
        ys = switch([c["a"], c["b"]], (values[:, 0] > 0).long().tolist(), xs)
        for y in c["sq"].map(ys):
            b.add_loss(y)
        return values.shape

    out = b.run_programs([program([1, 2, 3]), program([4, 5])])
    assert [tuple(s) for s in out.returns] == [(3, 3), (2, 3)] and out.syncs == 1


def test_bulk_calls_keep_the_errors_of_single_calls() -> None:
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2])
        with pytest.raises(GraphError, match="choice 2 is not a cell index 0..1"):
            switch([c["a"], c["b"]], [0, 2], xs)
        with pytest.raises(GraphError, match="2 choices but operand lists of lengths"):
            switch([c["a"], c["b"]], [0, 1], xs[:1])
        with pytest.raises(GraphError, match="has shape"):  # the single call's error
            c["a"].map(c["sq"].map(xs))
        with pytest.raises(GraphError, match="takes no attr"):
            c["a"].map(xs, attrs=[1, 2])
    b.discard()


def test_numpy_choices_and_attrs_and_whole_loss_blocks_record_the_same_graph() -> None:
    """``switch`` takes a numpy array of choices, ``map`` numpy attrs, and
    ``add_loss(handles)`` adds every node of a block: the graph of the calls one by one."""
    import numpy as np

    words, choice = [1, 4, 2, 7], [0, 1, 1, 0]
    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=np.array(words))
        zs = c["mix"].map(xs, switch([c["a"], c["b"]], np.array(choice), xs))
        b.add_loss(c["sq"].map(zs))
    bulk, got = b.graph()[0], b.run("depth").loss
    _record(b, c, False, words, choice)
    single, want = b.graph()[0], b.run("depth").loss
    assert bulk.op_ids.tolist() == single.op_ids.tolist()
    assert bulk.operand_ids.tolist() == single.operand_ids.tolist()
    assert bulk.attrs.tolist() == single.attrs.tolist()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_bulk_losses_and_numpy_inputs_are_checked() -> None:
    import numpy as np

    b, c = _batch()
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2])
        with pytest.raises(GraphError, match="not one number per row"):
            b.add_loss(xs)
        with pytest.raises(GraphError, match="attrs must be integers"):
            c["embed"].map(attrs=np.array([1.0, 2.0]))
        with pytest.raises(GraphError, match="choices must be integers"):
            switch([c["a"], c["b"]], np.array([0.0, 1.0]), xs)
        with pytest.raises(GraphError, match="choice 5 is not a cell index"):
            switch([c["a"], c["b"]], np.array([0, 5]), xs)
        n = len(b._rec.ops)
        old = c["sq"].map(xs)
    b.discard()
    with b.instance():
        with pytest.raises(GraphError, match="another mini-batch"):
            b.add_loss(old)  # the discarded mini-batch's
    assert n == 2 and not b._rec.losses
    b.discard()


def _mixed(b, c, bulk: bool, words, choice):  # type: ignore[no-untyped-def]
    """Bulk blocks with single calls between them (and a map over a plain handle list:
    the node-major path), or every node alone."""
    with b.instance():
        if bulk:
            xs = c["embed"].map(attrs=words)
            lone = c["a"](xs[0])  # a single call between blocks
            ys = switch([c["a"], c["b"]], choice, xs)
            zs = c["mix"].map(list(ys), xs)  # a plain list of handles: not a block
            ws = c["mix"].map(zs, ys)
        else:
            xs = [c["embed"](attr=w) for w in words]
            lone = c["a"](xs[0])
            ys = [(c["a"], c["b"])[k](x) for k, x in zip(choice, xs, strict=True)]
            zs = [c["mix"](y, x) for x, y in zip(xs, ys, strict=True)]
            ws = [c["mix"](z, y) for z, y in zip(zs, ys, strict=True)]
        b.add_loss(c["sq"](c["mix"](lone, ws[-1])))
        for w in ws:
            b.add_loss(c["sq"](w))


def test_blocks_between_single_calls_record_the_same_graph() -> None:
    """Operands of ``Handles`` blocks are kept as blocks (no int per operand) and merged
    in node order with the listed ones: the graph of the calls one by one."""
    from edbatch.api._bulk import operand_array

    words, choice = [3, 1, 4, 1, 5], [1, 0, 0, 1, 1]
    b, c = _batch()
    _mixed(b, c, True, words, choice)
    assert b._rec.blocks and b._rec.operands  # both kinds of record
    assert operand_array(b._rec, 0, 0).tolist() == b.graph()[0].operand_ids[
        :-len(b._rec.losses)].tolist()
    bulk, got = b.graph()[0], b.run("depth").loss
    _mixed(b, c, False, words, choice)
    assert not b._rec.blocks
    single, want = b.graph()[0], b.run("depth").loss
    assert bulk.op_ids.tolist() == single.op_ids.tolist()
    assert bulk.operand_ids.tolist() == single.operand_ids.tolist()
    assert bulk.attrs.tolist() == single.attrs.tolist()
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


@pytest.mark.parametrize("typed", [True, False])
def test_blocks_across_segments_equal_single_calls(typed: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Programs recording blocks and single calls over several segments (each segment's
    blocks merged from its first node on): loss and gradients of the calls one by one
    (fp64), on the typed and the general path."""
    from edbatch.api import _typed
    monkeypatch.setattr(_typed, "TYPED", typed)
    b, c = _batch()
    mods = [c[n].module for n in ("embed", "a", "b")]

    def program(words, bulk):  # type: ignore[no-untyped-def]
        xs = c["embed"].map(attrs=words) if bulk else [c["embed"](attr=w) for w in words]
        for _ in range(2):
            values = yield xs
            choice = (values[:, 0] > 0).long().tolist()
            if bulk:
                ys = switch([c["a"], c["b"]], choice, xs)
                xs = c["mix"].map(c["a"].map(xs), ys)
            else:
                ys = [(c["a"], c["b"])[k](x) for k, x in zip(choice, xs, strict=True)]
                xs = [c["mix"](c["a"](x), y) for x, y in zip(xs, ys, strict=True)]
            b.add_loss(c["sq"](xs[0]))
        b.add_loss(c["sq"].map(xs) if bulk else c["sq"].map(list(xs)))

    results = []
    for bulk in (True, False):
        for m in mods:
            m.zero_grad()
        out = b.run_programs([program(w, bulk) for w in ([1, 2, 3], [4, 5], [6])])
        out.loss.backward()
        results.append((out.loss.item(), [p.grad.clone() for m in mods
                                          for p in m.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    for g, want in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-12)


def test_switch_over_cells_of_other_output_shapes_records_node_by_node() -> None:
    b, c = _batch()
    wide = b.cell(nn.Linear(3, 4).double(), "wide", [3], 4)
    with b.instance():
        xs = c["embed"].map(attrs=[1, 2, 3])
        ys = switch([c["a"], wide], [0, 1, 0], xs)
        assert [y.shape for y in ys] == [(3,), (4,), (3,)]  # each node its own cell's
        zs = switch([c["a"], c["b"]], [1, 0, 1], xs)
        assert [z.op_name for z in zs] == ["user.b", "user.a", "user.b"]
    b.discard()


def test_run_programs_pauses_the_garbage_collector_and_resumes_it() -> None:
    import gc

    b, c = _batch()
    seen = []

    def program(words, fail):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        values = yield c["embed"].map(attrs=words)
        if fail:
            raise ValueError("a program's own error")
        b.add_loss(c["sq"].map(c["a"].map(c["embed"].map(attrs=words))))
        return values.shape

    assert gc.isenabled()
    out = b.run_programs([program([1, 2], False), program([3], False)])
    assert seen == [False, False] and gc.isenabled() and out.returns == [(2, 3), (1, 3)]
    with pytest.raises(ValueError, match="own error"):
        b.run_programs([program([1], True)])
    assert gc.isenabled()
    gc.disable()  # a caller's own pause is left as it was
    try:
        b.run_programs([program([4], False)])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_run_programs_frees_the_recording_before_the_collector_resumes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The recorded lists are dropped while the collector is still paused (freed by
    refcount, not traversed by the collection resuming sets off)."""
    import gc

    from edbatch.api import _programs

    b, c = _batch()
    at_enable = []

    class Gc:  # gc as _programs sees it: enable() notes what the batch still records
        isenabled, disable = staticmethod(gc.isenabled), staticmethod(gc.disable)

        @staticmethod
        def enable() -> None:
            at_enable.append(len(b._rec.ops))
            gc.enable()

    def program(words):  # type: ignore[no-untyped-def]
        yield c["embed"].map(attrs=words)
        b.add_loss(c["sq"].map(c["a"].map(c["embed"].map(attrs=words))))

    monkeypatch.setattr(_programs, "gc", Gc)
    out = b.run_programs([program([1, 2]), program([3])])
    assert at_enable == [0] and gc.isenabled() and out.loss is not None


def test_run_programs_result_is_freed_by_refcount() -> None:
    """No reference cycle through the result (a segment's graph maker kept the runner, its
    values and segments, alive until a collection of older objects)."""
    import gc
    import weakref

    b, c = _batch()

    def program(words):  # type: ignore[no-untyped-def]
        yield c["embed"].map(attrs=words)
        b.add_loss(c["sq"].map(c["a"].map(c["embed"].map(attrs=words))))

    gc.collect()
    gc.disable()
    try:
        out = b.run_programs([program([1, 2]), program([3])])
        loss = weakref.ref(out.loss)
        values = weakref.ref(out.values)  # (the forward's outputs)
        del out
        assert loss() is None and values() is None
    finally:
        gc.enable()


def test_map_attrs_of_numpy_ints_bools_and_floats_record_as_ints() -> None:
    """A list of ints is kept as it is; numpy integers and bools record their int value and
    floats their ``int()``, as before the C check; nothing is appended when one fails."""
    import numpy as np

    b, c = _batch()
    with b.instance():
        c["embed"].map(attrs=[np.int64(4), True, 3])
        c["embed"].map(attrs=(2.0, 5))
        n = len(b._rec.attrs)
        with pytest.raises(ValueError):
            c["embed"].map(attrs=[1, "x"])
        assert len(b._rec.attrs) == n
    graph, _ = b.graph()
    assert graph.attrs.tolist() == [4, 1, 3, 2, 5]
    b.discard()


def test_map_fast_path_records_what_the_general_path_records() -> None:
    """``cell.map`` (its inline common case) and ``_bulk.cell_map`` (every check) record
    the same lists: attrs as a list, a tuple, none, no nodes, operands as handle lists."""
    from edbatch.api._bulk import cell_map

    recorded = []
    for fast in (True, False):
        b, c = _batch()

        def call(cell, *operands, attrs=None, fast=fast):  # type: ignore[no-untyped-def]
            return cell.map(*operands, attrs=attrs) if fast else \
                cell_map(cell.cell, *operands, attrs=attrs)

        with b.instance():
            xs = call(c["embed"], attrs=[1, 2, 3])
            ys = call(c["embed"], attrs=(4, 5, 6))
            zs = call(c["mix"], xs, ys)
            call(c["a"], list(zs))
            call(c["embed"], attrs=[])
            b.add_loss(call(c["sq"], call(c["b"], zs)))
        rec = b._rec
        recorded.append([list(x) for x in (rec.ops, rec.operands, rec.blocks, rec.block_firsts,
                                           rec.attrs, rec.losses)])
        b.discard()
    assert recorded[0] == recorded[1]


def test_op_array_reads_ids_below_and_above_256() -> None:
    """``op_array`` (through ``bytes`` below 256, else ``np.fromiter``) gives the slice's
    ids as a writable int32 array either way."""
    import numpy as np

    from edbatch.api._rounds import op_array

    for ops in ([3, 0, 255, 7, 7], [3, 256, 7, 1000, 2]):
        got = op_array(ops, 1, 4)
        assert got.dtype == np.int32 and got.flags.writeable and got.tolist() == ops[1:4]
        assert op_array(ops, 0, len(ops)).tolist() == ops
