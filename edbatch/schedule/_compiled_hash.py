"""The FSM state keys' hash, in Python and in compiled code (the two must agree).

FNV-1a over the key's entries as 64-bit words, then the key's length, as a signed int64:
FSM tables travel to the core as sorted hashes (``edbatch.schedule.compiled.FsmTable``) and
the core hashes the key it encodes with :func:`_hash`. Re-exported by
:mod:`edbatch.schedule._compiled`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["key_hash", "key_hash_numba"]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def key_hash(key: tuple[int, ...]) -> int:
    """FNV-1a over the key's entries as 64-bit words, then its length; a signed int64."""
    h = _FNV_OFFSET
    for x in key:
        h = ((h ^ (int(x) & _MASK)) * _FNV_PRIME) & _MASK
    h = ((h ^ len(key)) * _FNV_PRIME) & _MASK
    return h - (1 << 64) if h >= (1 << 63) else h


@njit(cache=True)
def _hash(out, n):  # type: ignore[no-untyped-def]
    h = np.uint64(_FNV_OFFSET)
    prime = np.uint64(_FNV_PRIME)
    for i in range(n):
        h = (h ^ np.uint64(out[i])) * prime
    h = (h ^ np.uint64(n)) * prime
    return np.int64(h)


@njit(cache=True)
def key_hash_numba(key):  # type: ignore[no-untyped-def]
    """:func:`key_hash` in compiled code (for tests: the two must agree)."""
    return _hash(key, len(key))
