"""DyNet's memory for one mini-batch, measured so that it compares with edbatch's.

DyNet keeps every tensor of a computation graph in memory pools it allocates, and touches,
when it starts: a worker started with ``--mem 2048`` is 2.1 GB resident before its first
request, and its peak resident set *growth* afterwards counts only what lives outside the
pools (Python expression objects, the data), not the forward values, gradients and autobatch
copies that edbatch's row counts. The throughput benchmark reported that growth as DyNet's
``MB`` until 2026-11-24, comparing edbatch's whole working set with a part of DyNet's.

The probe measures the pools' use instead. A pool larger than its initial size is grown by
DyNet on demand, block by block, and those blocks show up in the resident set, except that
with autobatching DyNet refuses to grow the backward pool ("please pre-allocate enough
memory"). So :func:`dynet_peak_mb` starts a fresh worker per trial with a 1 MB forward pool
(grown as needed, so its growth is measured) and a backward pool of ``B`` MB, and searches
the smallest ``B`` (a multiple of ``step``) with which the mini-batch runs:

    DyNet's MB = peak RSS growth over the request + (B_min - step)   (training)
    DyNet's MB = peak RSS growth over the request                    (inference)

``B_min - step`` is the largest backward pool that is *not* enough, so the figure is a lower
bound of what DyNet needs (within ``step`` MB); the parameter and scratch pools (fixed, 256 MB
each) are not counted, as edbatch's parameters and gradients are not. The data of the split
is loaded before the worker reports ready (``--preload-split``), and a one-instance request
runs first (DyNet's lazy set-up), so neither is counted. The worker reports its own peak
(``VmHWM``, reset before each request): ``getrusage``'s ``ru_maxrss`` would carry the
harness's peak into the forked worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._dynet_server import DynetServer, PeerServerError

__all__ = ["OUT_OF_POOL", "DynetMemory", "dynet_peak_mb", "with_pools"]

#: What a DyNet worker's error says when the backward pool is too small under autobatching.
OUT_OF_POOL = "pre-allocate enough memory"
_FIXED_POOLS = 256  # MB each for the parameter and scratch pools (not counted)
_FORWARD_POOL = 1  # MB: the initial forward pool (DyNet grows it on demand)


@dataclass(frozen=True)
class DynetMemory:
    """One probe's result: ``peak_mb`` is DyNet's figure (see the module docstring)."""

    peak_mb: float
    grown_mb: float  # peak RSS growth over the request
    backward_pool_mb: int  # B_min (0 in inference)
    trials: int  # workers started


def with_pools(cmd: Sequence[str], forward: int, backward: int, split: str | None) -> list[str]:
    """``cmd`` (a ``--serve`` worker's command line) with ``--mem FOR,BACK,PARAM,SCRATCH``
    and ``--preload-split``, replacing any it had."""
    out: list[str] = []
    skip = False
    for arg in cmd:
        if skip:
            skip = False
            continue
        if arg in ("--mem", "--preload-split"):
            skip = True
            continue
        out.append(arg)
    out += ["--mem", f"{forward},{backward},{_FIXED_POOLS},{_FIXED_POOLS}"]
    return out + (["--preload-split", split] if split else [])


def _trial(server: DynetServer, cmd: list[str], mode: str, batch: int,
           indices: Sequence[int] | None, split: str | None) -> float | None:
    """Peak RSS growth (MB) over one request in a fresh worker, after a one-instance warm-up
    request when ``indices`` are given (DyNet's lazy set-up is not the mini-batch's, and
    edbatch's figure is taken warm too); ``None`` if the backward pool ran out (any other
    failure raises)."""
    try:
        with DynetServer(cmd, server.env, server.cwd) as worker:
            if indices is not None and len(indices) > 1:
                worker.run(mode, batch, indices[:1], split)
            phases, _ = worker.run(mode, batch, indices, split)
            before = phases.get("rss_before_mb", worker.ready_rss_mb)
            return max(0.0, phases["maxrss_mb"] - before)
    except PeerServerError as e:
        if OUT_OF_POOL in str(e):
            return None
        raise


def dynet_peak_mb(server: DynetServer, mode: str, batch: int = 0,
                  indices: Sequence[int] | None = None, split: str | None = None, *,
                  step: int = 8, limit: int = 8192) -> DynetMemory:
    """DyNet's memory for mini-batch ``batch`` (or the instances ``indices`` of ``split``)
    in ``mode``, by workers started like ``server`` (see the module docstring).

    Raises:
        PeerServerError: a worker failed for another reason than its backward pool, or no
            backward pool up to ``limit`` MB was enough.
        ValueError: ``step`` < 1 or ``limit`` < ``step``.
    """
    if step < 1 or limit < step:
        raise ValueError(f"dynet_peak_mb needs step >= 1 and limit >= step; got step={step}, "
                         f"limit={limit}")
    def trial(backward: int) -> float | None:
        cmd = with_pools(server.cmd, _FORWARD_POOL, backward, split)
        return _trial(server, cmd, mode, batch, indices, split)

    if mode != "train":
        grown = trial(step)
        if grown is None:  # inference does not use the backward pool
            raise PeerServerError(f"DyNet ran out of its backward pool in {mode}")
        return DynetMemory(grown, grown, 0, 1)
    trials, bad, good, grown_at_good = 0, 0, step, math.nan
    while True:  # doubling up to the first pool that is enough
        trials += 1
        grown = trial(good)
        if grown is not None:
            grown_at_good = grown
            break
        bad = good
        if good >= limit:
            raise PeerServerError(f"DyNet needs a backward pool over {limit} MB here")
        good = min(2 * good, limit)
    while good - bad > step:  # bisection in multiples of step
        mid = (bad + good) // 2 // step * step
        trials += 1
        grown = trial(mid)
        if grown is None:
            bad = mid
        else:
            good, grown_at_good = mid, grown
    return DynetMemory(grown_at_good + good - step, grown_at_good, good, trials)
