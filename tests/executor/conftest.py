"""Helpers shared by the executor tests."""

from __future__ import annotations

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[int]:
    """Patch ``cls.__call__`` to count its calls (a short path's batches); ``[count]``."""
    count = [0]
    real = cls.__call__

    def counted(self: object, *args: object) -> None:
        count[0] += 1
        real(self, *args)
    monkeypatch.setattr(cls, "__call__", counted)
    return count
