"""Transposes kept across executor runs (``executor/_weights.py``: :class:`Kept`): reused
only while the weight is bit for bit the one they were made from, whatever moved it (an
in-place op, a write through ``.data`` that leaves the version alone, a zero's sign); gone
with their weight; never copied for weights that change every run."""

from __future__ import annotations

import gc

import pytest
import torch

from edbatch.executor._weights import KEEP, TRANSPOSED

torch.set_num_threads(1)


def _weight(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(3), dtype=dtype)


def _run(w: torch.Tensor, start: int = 0) -> torch.Tensor:
    with torch.no_grad(), TRANSPOSED.run():
        return TRANSPOSED(w, start)


def _kept(w: torch.Tensor) -> bool:
    return any(k[0] == id(w) for k in TRANSPOSED.kept.entries)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_unchanged_weight_gets_the_same_transpose_from_its_third_run(
        dtype: torch.dtype) -> None:
    w = _weight(dtype)
    first = _run(w)
    assert not _kept(w)  # seen once
    second = _run(w)
    assert second is not first and _kept(w)  # seen unchanged again: kept
    third = _run(w)
    assert third is second and _kept(w)
    assert torch.equal(third, w.t()) and third.is_contiguous()
    assert _run(w, 1) is not third and torch.equal(_run(w, 1), w[:, 1:].t())


def test_a_write_through_data_that_keeps_the_version_is_seen() -> None:
    w = _weight()
    for _ in range(3):
        _run(w)
    assert _kept(w)
    version = w._version
    w.data[2, 1] += 1.0  # as fused Adam: the values move, the version does not
    assert w._version == version
    got = _run(w)
    assert torch.equal(got, w.t())
    assert got[1, 2] == w[2, 1]


def test_a_zero_that_changes_sign_is_a_change() -> None:
    w = _weight()
    w[0, 0] = 0.0
    for _ in range(3):
        _run(w)
    w.data[0, 0] = -0.0  # equal as a float, not as bits
    got = _run(w)
    assert torch.signbit(got[0, 0]) and torch.equal(got, w.t())


def test_an_in_place_update_is_seen_and_training_keeps_no_copy() -> None:
    w = _weight()
    for step in range(4):
        w.add_(0.5)  # a new version every run, as a training loop's optimizer step
        assert torch.equal(_run(w), w.t())
        assert not _kept(w), step


def test_an_entry_goes_with_its_weight() -> None:
    w = _weight()
    for _ in range(3):
        _run(w)
    key = id(w)
    assert _kept(w)
    del w
    gc.collect()
    assert not any(k[0] == key for k in TRANSPOSED.kept.entries)
    assert not any(k[0] == key for k in TRANSPOSED.kept.seen)


def test_no_weight_is_kept_when_switched_off_or_not_contiguous() -> None:
    w = _weight()
    strided = torch.randn(4, 6, generator=torch.Generator().manual_seed(4)).t()
    KEEP[0] = False
    try:
        for _ in range(3):
            assert torch.equal(_run(w), w.t())
    finally:
        KEEP[0] = True
    assert not _kept(w)
    for _ in range(3):
        assert torch.equal(_run(strided), strided.t())
    assert not _kept(strided)


def test_outside_a_run_every_call_is_a_fresh_copy() -> None:
    w = _weight()
    for _ in range(3):
        _run(w)
    with torch.no_grad():
        assert TRANSPOSED(w) is not TRANSPOSED(w)
        assert torch.equal(TRANSPOSED(w), w.t())
