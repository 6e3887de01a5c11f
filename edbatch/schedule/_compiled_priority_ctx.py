"""The priority policy's *context* features: what a ready type looks like beside the others.

The features 0-22 of :mod:`edbatch.schedule._compiled_priority` describe one ready type; a
linear (or per-row MLP) score of them cannot say "run ``a`` although it is not critical
path's choice, *because the others are all incomplete*". The context columns (23-31, no
lookahead) give every row what the decision's other ready types look like, still
equivariant to the order of types (maxima over the others, indicators):

====================  ==========================================================
``is_cp``             1 if ``a`` is critical path's choice (a residual over it)
``last2``             1 if ``a`` was the decision before the previous one
``n_types``           ``log1p(ready batchable types - 1) / 4``
``o_fill``            most ``fill`` among the other ready types (0 if none)
``o_complete``        1 if another ready type is complete
``o_ready``           most ``log_ready`` among the others
``o_join``            most ``rel_join`` among the others
``o_wait``            most ``wait_gain`` among the others
``o_feed``            most ``cp_feed`` among the others
====================  ==========================================================

The ``o_*`` maxima are read in O(ready types) per column (the highest value, how many rows
hold it and the highest below it). Called after the rows' own features, release ones
included (``o_join``, ``o_wait``, ``o_feed`` read them).
"""

from __future__ import annotations

import math

from numba import njit

__all__ = ["CONTEXT_FEATURES", "CONTEXT_SOURCES", "FIRST_CONTEXT", "context_rows"]

CONTEXT_FEATURES = ("is_cp", "last2", "n_types", "o_fill", "o_complete", "o_ready", "o_join",
                    "o_wait", "o_feed")
#: Column of the first context feature in the full row.
FIRST_CONTEXT = 23
#: The row columns whose maximum over the other ready types ``o_*`` is: fill, complete,
#: log_ready, rel_join, wait_gain, cp_feed.
CONTEXT_SOURCES = (1, 2, 3, 16, 18, 19)


@njit(cache=True)
def context_rows(r, ids, out, cp, last2):  # type: ignore[no-untyped-def]
    """Write the context columns of the ``r`` rows of ``out`` (op ids ``ids``; critical
    path's choice ``cp``, the decision before the previous one ``last2``)."""
    c0 = FIRST_CONTEXT
    nt = math.log1p(r - 1) / 4.0
    for i in range(r):
        row = out[i]
        row[c0] = 1.0 if ids[i] == cp else 0.0
        row[c0 + 1] = 1.0 if ids[i] == last2 else 0.0
        row[c0 + 2] = nt
    for k in range(len(CONTEXT_SOURCES)):
        j = CONTEXT_SOURCES[k]
        top, second, ntop = -1e300, -1e300, 0
        for i in range(r):
            v = out[i, j]
            if v > top:
                top, second, ntop = v, top, 1
            elif v == top:
                ntop += 1
            elif v > second:
                second = v
        for i in range(r):
            if r == 1:
                o = 0.0
            elif out[i, j] == top and ntop == 1:
                o = second
            else:
                o = top
            out[i, c0 + 3 + k] = o
