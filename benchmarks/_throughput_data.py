"""Parts of ``benchmarks/throughput.py``: the mini-batch sequence of a run (the data modes),
the GEMM floor and the peak-memory probe.

* :func:`minibatch_plan`: ``plan[r][k]``, the instance indices that pass ``r`` runs as its
  ``k``-th mini-batch. ``reshuffled`` (default): every pass draws new mini-batches of 64 from
  a seeded permutation of the *training* split (a new permutation when one is used up), so
  no mini-batch repeats within a run; ``repeated``: every pass runs the same first mini-batches
  of the evaluation split (what memoisation by structure profits from).
* :class:`GemmFloor`, :func:`gemm_shapes`, :func:`make_floors` (from
  :mod:`benchmarks._gemm_floor`): the matrix products a schedule issues, timed alone as a
  lower bound on their cost (what exactly: that module's docstring).
* :func:`peak_rss_mb`: the resident-set growth while a function runs (sampled every 0.5 ms
  from ``/proc/self/statm`` after returning freed heap to the system with ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._gemm_floor import Gemm, GemmFloor, gemm_shapes, make_floors
from edbatch.graph import Graph

__all__ = ["DATA_MODES", "Gemm", "GemmFloor", "gemm_shapes", "make_floors", "minibatch_plan",
           "peak_rss_mb", "structure_hash"]

DATA_MODES = ("reshuffled", "repeated")


def minibatch_plan(data: str, num_train: int, num_eval: int, batch_size: int,
                   num_minibatches: int, passes: int, seed: int = 0) -> list[list[list[int]]]:
    """``plan[r][k]``: instance indices of mini-batch ``k`` of pass ``r`` (see the module
    docstring); ``num_minibatches`` 0 means every full mini-batch of the split."""
    if data == "repeated":
        chunks = [list(range(i, min(i + batch_size, num_eval)))
                  for i in range(0, num_eval, batch_size)]
        chunks = chunks[:num_minibatches or len(chunks)]
        return [chunks for _ in range(passes)]
    if data != "reshuffled":
        raise ValueError(f"unknown data mode {data!r}; expected one of {DATA_MODES}")
    per_pass = num_minibatches or max(1, num_train // batch_size // passes)
    rng = np.random.default_rng(seed)
    stream: list[int] = []
    need = per_pass * passes * batch_size
    while len(stream) < need:  # epochs of fresh permutations
        stream += rng.permutation(num_train).tolist()
    take = iter(range(0, need, batch_size))
    return [[sorted(stream[s:s + batch_size]) for s in (next(take) for _ in range(per_pass))]
            for _ in range(passes)]


def structure_hash(graph: Graph) -> bytes:
    """The graph's structure key (op ids, operands, attrs: what memoisation keys on)."""
    return graph.structure_key()


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20
_LIBC: Any = None


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_MB


def _trim() -> None:
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        _LIBC = ctypes.CDLL(name) if name else False
    if _LIBC and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def peak_rss_mb(fn: Callable[[], Any]) -> float:
    """Peak resident-set growth (MB) while ``fn()`` runs (``nan`` without ``/proc``)."""
    if not os.path.exists("/proc/self/statm"):
        return float("nan")
    _trim()
    base = peak = _rss_mb()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_mb())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(0.0, max(peak, _rss_mb()) - base)
