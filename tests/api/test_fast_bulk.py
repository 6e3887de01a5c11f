"""``cell.map`` and ``route`` in C (``edbatch/api/_fastrec_map.h``) against their Python
twins: the same recording, list for list, the same blocks handed back and the same errors,
on the common case and on odd calls that the C path hands to Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from edbatch.api import DynamicBatch, _bulk, _fast, _handles, _route, route
from edbatch.api._bulk import Handles, Routed

FIELDS = ("ops", "operands", "attrs", "counts", "losses", "blocks", "block_firsts")
D = 3


def _lists(batch: DynamicBatch) -> dict[str, list[Any]]:
    return {f: [(type(v), v) for v in getattr(batch._rec, f)] for f in FIELDS}


def _seen(got: Any) -> Any:
    """What a call handed back: each block's nodes, kinds and shape."""
    if type(got) is Handles:
        kinds = got.kinds
        return ("block", got.first, got.n, got.shape,
                ("routed", list(kinds.choices), type(kinds.choices))
                if type(kinds) is Routed else kinds.op_id)
    return [_seen(g) for g in got]


def _calls() -> tuple[dict[str, list[Any]], list[Any]]:
    """A recording of common and odd ``map`` / ``route`` calls: the lists and, per call, what
    it handed back or the error it raised."""
    torch.manual_seed(0)
    b = DynamicBatch()
    embed = b.cell(nn.Embedding(10, D), "embed", [], D, takes_attr=True)
    lin = b.cell(nn.Linear(D, D), "lin", [D], D)
    pair = b.cell(lambda x, y: x + y, "pair", [D, D], D)
    experts = [b.cell(nn.Linear(D, D), f"e{a}", [D], D) for a in range(3)]
    wide = b.cell(nn.Linear(D + 1, D), "wide", [D + 1], D)
    other = DynamicBatch()
    o_embed = other.cell(nn.Embedding(10, D), "embed", [], D, takes_attr=True)
    outside = o_embed.map(attrs=[1, 2, 3])
    seen: list[Any] = []
    with b.instance():
        xs = embed.map(attrs=[1, 2, 3])
        ys = lin.map(xs)
        calls: list[Callable[[], Any]] = [
            lambda: embed.map(attrs=(4, 5, 6)), lambda: embed.map(attrs=[]),
            lambda: embed.map(attrs=[np.int64(1), 2, 3]), lambda: embed.map(attrs=[True, 2, 0]),
            lambda: embed.map(attrs=[2 ** 63, 1, 1]), lambda: embed.map(attrs=None),
            lambda: embed.map(), lambda: lin.map(xs, attrs=[1, 2, 3]), lambda: lin.map(),
            lambda: pair.map(xs, ys), lambda: pair.map(xs, ys[:2]), lambda: pair.map(xs),
            lambda: pair.map(xs, list(ys)), lambda: pair.map(xs, outside),
            lambda: wide.map(xs), lambda: lin.map(xs, bad=1),
            lambda: route(experts, [[0, 2], [1, 0], [2, 2]], xs),
            lambda: route(experts, [(1, 0), (0, 1), (2, 1)], ys),
            lambda: route(experts, [[0], [1], [2]], xs),
            lambda: route(experts, [[0, 3], [1, 0], [2, 2]], xs),
            lambda: route(experts, [[0, -1], [1, 0], [2, 2]], xs),
            lambda: route(experts, [[0, 1], [1], [2, 2]], xs),
            lambda: route(experts, [[0, 1], [1, 0]], xs),
            lambda: route(experts, [[np.int64(0), 1], [1, 0], [2, 2]], xs),
            lambda: route(experts, [[True, 1], [1, 0], [2, 2]], xs),
            lambda: route(experts, ([0, 1], [1, 0], [2, 2]), xs),
            lambda: route(experts, [[0, 1], [1, 0], [2, 2]], outside),
            lambda: route(experts, [[0, 1], [1, 0], [2, 2]], list(xs)),
            lambda: route(experts, [[], [], []], xs),
        ]
        for call in calls:
            try:
                seen.append(_seen(call()))
            except Exception as e:  # (every error is compared)
                seen.append((type(e).__name__, str(e)))
    return _lists(b), seen


def test_c_map_and_route_record_what_the_python_functions_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if _handles._fastrec is None or not _fast._BULK_READY:
        pytest.skip("edbatch.api._fastrec not loaded or built without MapCall")
    fast, fast_seen = _calls()
    monkeypatch.setattr(_fast, "ENABLED", False)
    monkeypatch.setattr(_route, "_fast_route", None)
    slow, slow_seen = _calls()
    assert len(fast["ops"]) > 40 and sum(type(s) is tuple for s in fast_seen) >= 8
    assert fast_seen == slow_seen
    assert fast == slow


def test_the_c_map_and_route_are_taken_where_built() -> None:
    if _handles._fastrec is None or not _fast._BULK_READY:
        pytest.skip("edbatch.api._fastrec not loaded or built without MapCall")
    b = DynamicBatch()
    lin = b.cell(nn.Linear(D, D), "lin", [D], D)
    assert type(lin.map).__name__ == "MapCall" and lin.map.fallback is not lin.map
    assert _route._fast_route is _handles._fastrec.route


@pytest.mark.parametrize("code", ["q", "i"])
def test_int_array_packs_in_c_what_fromiter_makes(code: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``int_array`` (segment attrs and loss terms) through ``_fastrec.pack`` equals its
    ``np.fromiter`` twin: values, dtype, a writable copy, and the same errors; entries that
    are not exact ints (numpy ints, bools) take the twin."""
    big = 2 ** 63 - 1 if code == "q" else 2 ** 31 - 1
    cases: list[list[Any]] = [[5, -1, 0, big, -big - 1, 7] * 50, [], [np.int64(3), 1, 2],
                              [True, 4], [1, big + 1], [1, "x"]]

    def made() -> list[Any]:
        out: list[Any] = []
        for values in cases:
            try:
                a = _bulk.int_array([*values, 9, 9], 0, len(values), code)
                out.append((a.dtype, a.flags.writeable, a.tolist()))
                a[:] = 0  # (a copy: the recording's list is untouched)
            except (OverflowError, ValueError, TypeError) as e:
                out.append(type(e).__name__)
        out.append(_bulk.int_array(cases[0], 3, 9, code).tolist())
        return out

    if _bulk._pack is None:
        pytest.skip("edbatch.api._fastrec not loaded")
    fast = made()
    monkeypatch.setattr(_bulk, "_pack", None)
    assert fast == made()
    assert fast[0][2][:6] == [5, -1, 0, big, -big - 1, 7]
    assert fast[-1] == [big, -big - 1, 7, 5, -1, 0]
