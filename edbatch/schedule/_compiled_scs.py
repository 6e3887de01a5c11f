"""Shortest common supersequence lengths of two and three int sequences, compiled.

The kernels behind :func:`~edbatch.schedule.path_bound.path_lower_bound`; the Python twin
(the oracle in tests) is :func:`~edbatch.schedule.path_bound.scs_length`.

The recurrence over prefixes: the last symbol of a shortest supersequence of ``a[:i]``,
``b[:j]`` (and ``c[:k]``) is the last symbol of one of them, and every prefix ending in
that symbol loses it (consuming more never hurts). ``scs3`` keeps two ``(m+1) x (l+1)``
layers, so its memory is ``O(m l)`` and its time ``O(n m l)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["scs2", "scs3"]


@njit(cache=True)
def scs2(a, b):  # type: ignore[no-untyped-def]
    """Length of a shortest common supersequence of the int arrays ``a`` and ``b``."""
    n, m = len(a), len(b)
    prev = np.arange(m + 1).astype(np.int32)
    cur = np.empty(m + 1, np.int32)
    for i in range(1, n + 1):
        cur[0] = i
        for j in range(1, m + 1):
            if a[i - 1] == b[j - 1]:
                cur[j] = prev[j - 1] + 1
            else:
                cur[j] = min(prev[j], cur[j - 1]) + 1
        prev, cur = cur, prev
    return int(prev[m])


@njit(cache=True)
def scs3(a, b, c):  # type: ignore[no-untyped-def]
    """Length of a shortest common supersequence of the int arrays ``a``, ``b``, ``c``."""
    n, m, q = len(a), len(b), len(c)
    prev = np.empty((m + 1, q + 1), np.int32)
    cur = np.empty((m + 1, q + 1), np.int32)
    for i in range(n + 1):
        for j in range(m + 1):
            for k in range(q + 1):
                best = 0 if i == 0 and j == 0 and k == 0 else 1 << 30
                for w in range(3):  # the last symbol: the last of a's, b's or c's prefix
                    if (w == 0 and i == 0) or (w == 1 and j == 0) or (w == 2 and k == 0):
                        continue
                    s = a[i - 1] if w == 0 else (b[j - 1] if w == 1 else c[k - 1])
                    jj = j - 1 if (j > 0 and b[j - 1] == s) else j
                    kk = k - 1 if (k > 0 and c[k - 1] == s) else k
                    v = (prev[jj, kk] if i > 0 and a[i - 1] == s else cur[jj, kk]) + 1
                    if v < best:
                        best = v
                cur[j, k] = best
        prev, cur = cur, prev
    return int(prev[m, q])
