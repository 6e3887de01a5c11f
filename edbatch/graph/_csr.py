"""The users (consumers) CSR of a graph in one counting pass, compiled with numba.

:attr:`Graph.users <edbatch.graph.ir.Graph.users>` imports this on first use (so importing
:mod:`edbatch.graph` does not load numba). Same result as a stable argsort of the operand
ids: each producer's users in edge order, i.e. ascending.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["users_csr"]


@njit(cache=True, nogil=True)
def users_csr(operand_ptr, operand_ids, n):  # type: ignore[no-untyped-def]
    """``(user_ptr int64[n+1], user_ids int32[E])`` from the operand CSR."""
    ptr = np.zeros(n + 1, np.int64)
    for e in range(len(operand_ids)):
        ptr[operand_ids[e] + 1] += 1
    for v in range(n):
        ptr[v + 1] += ptr[v]
    fill = ptr[:-1].copy()
    ids = np.empty(len(operand_ids), np.int32)
    for v in range(n):
        for e in range(operand_ptr[v], operand_ptr[v + 1]):
            u = operand_ids[e]
            ids[fill[u]] = v
            fill[u] += 1
    return ptr, ids
