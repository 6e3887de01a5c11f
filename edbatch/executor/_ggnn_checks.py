"""The GGNN cells' attr checks (CPU), run before the compiled loops of
:mod:`~edbatch.executor._fused_ggnn` read the attrs: counts of repeated operands
(``ggnn.update``, ``ggnn.readout``) that do not add up to the rows, or would leave rows
unassigned (read as garbage indices), and atom codes outside what
:func:`~edbatch.workloads.ggnn_molecules.pack_atom` makes (they would wrap into other
atoms' rows). Each is a ``ValueError`` naming the batch row and the value; the executor
names the batch and op type around it. The loops' Python twins (``.py_func``) are their
oracles in ``tests/executor/test_attr_checks.py``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from edbatch.executor._attr_checks import check_range
from edbatch.executor._fused import _jit

__all__ = ["check_codes", "check_counts"]


@_jit
def _count_check(counts, rows):  # type: ignore[no-untyped-def]
    total = 0  # (first node whose count is negative or above rows, or -1; the counts' sum)
    for v in range(counts.shape[0]):
        c = counts[v]
        if c < 0 or c > rows:
            return v, total
        total += c
    return -1, total


@_jit
def _code_check(attrs, count_bits):  # type: ignore[no-untyped-def]
    mask = (1 << count_bits) - 1  # (first node with bits above its bond types, or -1)
    for v in range(attrs.shape[0]):
        a = attrs[v]
        if a < 0 or (a >> (count_bits + 2 * (a & mask))) != 0:
            return v
    return -1


def check_counts(attrs: Any, rows: int, count_bits: int = 0) -> None:
    """Raise ``ValueError`` unless the nodes' attrs (``int64[B]``, CPU) count ``rows``
    repeated operand rows in all: ``ggnn.readout``'s attr is its atom count (``count_bits``
    0), ``ggnn.update``'s the count in its low ``count_bits`` bits, then 2 bits per bond type
    and nothing above (:func:`~edbatch.workloads.ggnn_molecules.update_attr`). A wrong count
    would misassign rows, or leave some unassigned, read as garbage by the loops here."""
    if count_bits:
        v = int(_code_check(attrs, count_bits))
        if v >= 0:
            raise ValueError(
                f"row {v} of the batch has attr {int(attrs[v])}, which is not a neighbour "
                f"count in the low {count_bits} bits followed by 2 bits per bond type; make "
                "it with edbatch.workloads.ggnn_molecules.update_attr(bond_types)")
        counts = attrs & ((1 << count_bits) - 1)
    else:
        counts = attrs
    v, total = (int(x) for x in _count_check(counts, rows))
    if v >= 0 or total != rows:
        what = f"row {v}'s attr {int(attrs[v])} counts {int(counts[v])}, outside 0..{rows}" \
            if v >= 0 else f"the nodes' attrs count {total} in all, the batch has {rows}"
        raise ValueError(
            f"the attrs do not count the nodes' repeated operands ({what}); give each node "
            "the count of its own operands after the fixed ones (ggnn.readout: its number "
            "of atom states; ggnn.update: update_attr(its neighbours' bond types))")


def check_codes(codes: Tensor, mixed: tuple[Tensor, Tensor, Tensor]) -> None:
    """``ValueError`` naming the first of ``codes`` outside ``0 .. prod(size) - 1``, the
    atoms :func:`~edbatch.workloads.ggnn_molecules.pack_atom` can pack (larger codes would
    wrap around into other atoms' rows); CPU only, as :func:`check_range`."""
    check_range(codes, int(mixed[1][-1] * mixed[2][-1]), "atom code", "the codes pack_atom "
                "makes", "make it with edbatch.workloads.ggnn_molecules.pack_atom(features)")
