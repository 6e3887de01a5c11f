"""Compatibility re-export: :class:`ExecutionError` lives in :mod:`edbatch.errors`."""

from __future__ import annotations

from edbatch.errors import ExecutionError

__all__ = ["ExecutionError"]
