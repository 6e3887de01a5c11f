"""One compiled pass over a graph's arrays: every per-node and per-edge check of
:func:`~edbatch.graph._validate.validate_arrays`, and the node depths.

Imported on first use by :func:`~edbatch.graph._validate.validated_depth` (importing
:mod:`edbatch.graph` does not load numba). It only answers "all good" or "something is
wrong"; the numpy checks then find the first problem and raise its message.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["scan"]


@njit(cache=True, nogil=True)
def scan(op_ids, ptr, ids, outputs, arity_of, out_sid, in_sid):  # type: ignore[no-untyped-def]
    """``(depth int32[N], ok)``: ``ok`` when every op id is known, every operand an earlier
    node, every fixed arity and operand shape as declared and every output a node; ``depth``
    is the longest path from a source (in edges), valid only when ``ok``."""
    n, k = len(op_ids), len(arity_of)
    depth = np.zeros(n, np.int32)
    for v in range(n):
        t = op_ids[v]
        if t < 0 or t >= k:
            return depth, False
        a, b = ptr[v], ptr[v + 1]
        if b < a or b > len(ids):
            return depth, False
        want = arity_of[t]
        if want >= 0 and b - a != want:
            return depth, False
        d = 0
        for e in range(a, b):
            u = ids[e]
            if u < 0 or u >= v:
                return depth, False
            if want >= 0 and in_sid[t, e - a] != out_sid[op_ids[u]]:
                return depth, False
            if depth[u] + 1 > d:
                d = depth[u] + 1
        depth[v] = d
    for i in range(len(outputs)):
        if outputs[i] < 0 or outputs[i] >= n:
            return depth, False
    return depth, True
