"""The one check that a trained policy fits a graph: the same op types in the same order.

A policy's table refers to op types by id, so a graph of other op types (another workload,
granularity, or the same cells registered in another order) would be scheduled by wrong
decisions. Every path that runs a saved or trained policy (loading a policy file, the
evaluation scheduler of a file, the user API's ``DynamicBatch.run(policy)``, the training
job's ``fsm=`` option) calls :func:`check_op_types`, so they refuse alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edbatch.errors import GraphError, PolicyFileError

__all__ = ["check_op_types", "op_types_mismatch"]

#: The fix named when a policy file meets a graph of other op types.
FILE_FIX = "evaluate the policy on the workload (and granularity) it was trained on"


def check_op_types(trained: Sequence[str], current: Sequence[str],
                   path: str | Path | None = None, fix: str = FILE_FIX) -> None:
    """Refuse ``current`` op-type names unless they are the policy's ``trained`` ones.

    Args:
        trained: the op-type names the policy was trained on, in id order.
        current: the graph's (or workload's) op-type names, in id order.
        path: the policy's file, when it came from one: the error names it.
        fix: what to do, for a policy file.

    Raises:
        PolicyFileError: with ``path``; the message names the first difference and ``fix``.
        GraphError: without ``path`` (a policy in memory, e.g. in ``DynamicBatch.run``).
    """
    trained, current = tuple(trained), tuple(current)
    if trained == current:
        return
    if path is not None:
        raise PolicyFileError(path, op_types_mismatch(trained, current), fix)
    raise GraphError(
        f"the policy was trained on op types {list(trained)}, but this mini-batch has "
        f"{list(current)}; register the same cells in the same order as when the policy's "
        f"graphs were recorded, or re-train it")


def op_types_mismatch(saved: tuple[str, ...], current: tuple[str, ...]) -> str:
    """Where two op-type lists differ, in words (the first difference)."""
    if len(saved) != len(current):
        return (f"trained on {len(saved)} op types, but the workload has {len(current)} "
                f"(first difference: {_first_diff(saved, current)})")
    return f"op types differ from the workload's: {_first_diff(saved, current)}"


def _first_diff(a: tuple[str, ...], b: tuple[str, ...]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"op {i} is {x!r} in the file but {y!r} in the workload"
    i = min(len(a), len(b))
    extra = a[i] if len(a) > i else b[i]
    return f"op {i} ({extra!r}) exists in only one of them"
