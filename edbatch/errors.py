"""Exception hierarchy of edbatch.

Every error message follows one pattern: what was wrong, the offending value, what was
expected, and how to fix it. Each class also inherits the matching builtin so callers can
catch ``ValueError`` / ``KeyError`` as usual.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ConfigError",
    "DataFormatError",
    "DeviceError",
    "EdbatchError",
    "ExecutionError",
    "GraphError",
    "InvalidActionError",
    "PolicyFileError",
    "RunDirError",
    "ScheduleError",
    "UnknownNameError",
    "did_you_mean",
    "is_integer",
]


class EdbatchError(Exception):
    """Base class of every error raised by edbatch."""


class GraphError(EdbatchError, ValueError):
    """A dataflow graph is malformed (forward reference, cycle, arity, shape, unknown op)."""


class ScheduleError(EdbatchError, ValueError):
    """A schedule does not execute its graph correctly (missing node, dependency order)."""


class InvalidActionError(EdbatchError, ValueError):
    """A policy chose an op type that has no ready node (a masked action)."""


class UnknownNameError(EdbatchError, KeyError):
    """A name (op type, workload, scheduler) is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class ExecutionError(EdbatchError, RuntimeError):
    """A kernel failed while running a graph; the message names the node or batch, its op
    type and the original exception (which is also chained as ``__cause__``)."""


class PolicyFileError(EdbatchError, ValueError):
    """A saved policy file is missing, corrupt, or does not match the workload."""

    def __init__(self, path: str | Path, problem: str, fix: str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {problem}. Fix: {fix}")


class DataFormatError(EdbatchError, ValueError):
    """A data file is malformed; the message names ``file:line``, what was found and expected."""

    def __init__(self, path: str | Path, line: int, found: str, expected: str,
                 fix: str = "") -> None:
        self.path = str(path)
        self.line = line
        self.found = found
        self.expected = expected
        msg = f"{self.path}:{line}: found {found}; expected {expected}"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


class ConfigError(EdbatchError, ValueError):
    """A configuration value is out of range or inconsistent; names the key, the value, what
    was expected and the fix."""

    def __init__(self, key: str, value: object, expected: str, fix: str) -> None:
        self.key, self.value = key, value
        super().__init__(f"config key {key}={value!r}: expected {expected}. Fix: {fix}")


class RunDirError(EdbatchError, ValueError):
    """A run folder holds a run made with another configuration (or is otherwise unusable)."""


class DeviceError(EdbatchError, ValueError):
    """A device string is malformed or names a device this machine does not have."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return a ``" Did you mean 'x'?"`` hint (or ``""``) for an unknown ``name``."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def is_integer(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer and not a bool (the checks that refuse
    ``True``, ``1.5`` or ``"3"`` where an index, count or action is expected)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
