"""Parts of ``benchmarks/throughput.py``: the mini-batch sequence of a run (the data modes),
the GEMM floor and the peak-memory probe.

* :func:`minibatch_plan`: ``plan[r][k]``, the instance indices that pass ``r`` runs as its
  ``k``-th mini-batch. ``reshuffled`` (default): every pass draws new mini-batches of 64 from
  a seeded permutation of the *training* split (a new permutation when one is used up), so
  no mini-batch repeats within a run; ``repeated``: every pass runs the same first mini-batches
  of the evaluation split (what memoisation by structure profits from).
* :class:`GemmFloor`: the matrix products a schedule issues (one per weight per batch, with
  the batch's real row count; in training also the two backward products ``dY W`` and
  ``dY^T X``), pre-allocated and timed alone: the floor no batching scheme can go under.
  :func:`gemm_shapes` lists them for the executor's default program: with input-projection
  hoisting (:mod:`edbatch.executor._hoist`) an LSTM cell's weight ``[W_x W_h]`` is one
  projection GEMM ``W_x`` over many batches' rows plus one ``W_h`` GEMM per batch, the same
  multiply-adds in fewer, larger products; ``hoist=False`` lists the per-batch cells'.
* :func:`peak_rss_mb`: the resident-set growth while a function runs (sampled every 0.5 ms
  from ``/proc/self/statm`` after returning freed heap to the system with ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.executor.cell_kind import CELL_KINDS
from edbatch.executor.cells_hoist import HOISTS
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, OpType
from edbatch.memory import plan_memory
from edbatch.schedule import Schedule

__all__ = ["DATA_MODES", "GemmFloor", "gemm_shapes", "minibatch_plan", "peak_rss_mb",
           "structure_hash"]

DATA_MODES = ("reshuffled", "repeated")
_EMBEDDING_SUFFIXES = (".E", "emb")  # tables read by lookups, not multiplied


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


def gemm_shapes(graph: Graph, schedule: Schedule, param_shapes: Mapping[str, tuple[int, ...]],
                hoist: bool = True) -> list[tuple[int, int, int]]:
    """``(rows, in, out)`` of every matrix product the executor's program for ``schedule``
    issues: one per 2-D weight of a batch's op type (embedding tables excluded), rows =
    batch size; with ``hoist`` (the executor's default), a hoisted LSTM cell's weight
    ``(4H, in + H)`` as its projection steps' ``W_x`` products and its batches' ``W_h``."""
    if not hoist:
        return [shape for batch in schedule.batches
                for shape in _weights(graph.vocab[batch.op_id], len(batch.node_ids),
                                      param_shapes)]
    program, _ = TorchExecutor("cpu", hoist=True)._program(
        graph, schedule, plan_memory(graph, schedule, "naive"))
    shapes: list[tuple[int, int, int]] = []
    for step in program.steps:
        op = step.op
        kind = op.kind.removesuffix(".projection")
        spec = HOISTS.get(kind)
        if spec is None or (op.kind == kind and step.kernel is not spec.cell):
            shapes += _weights(op, step.size, param_shapes)  # not hoisted
            continue
        gates, inputs = param_shapes[op.params[spec.weight]]
        hidden = gates // 4
        if op.kind != kind:  # the projection: W_x over the group's rows
            shapes.append((step.size, inputs - hidden, gates))
        else:  # the hoisted cell: W_h, and any other weight of the op
            shapes.append((step.size, hidden, gates))
            shapes += _weights(op, step.size, param_shapes, skip=op.params[spec.weight])
    return shapes


def _weights(op: OpType, rows: int, param_shapes: Mapping[str, tuple[int, ...]],
             skip: str = "") -> list[tuple[int, int, int]]:
    out = []
    cell = CELL_KINDS.get(op.kind)  # tables a cell kind declares (e.g. parser.E_w) are read
    tables = {name for name, q in zip(op.params, cell.params, strict=False)
              if q.init == "embedding"} if cell is not None else set()
    for name in op.params:
        shape = param_shapes.get(name)
        if name != skip and shape is not None and len(shape) == 2 and \
                not name.endswith(_EMBEDDING_SUFFIXES) and name not in tables:
            out.append((rows, shape[1], shape[0]))
    return out


class GemmFloor:
    """Pre-allocated operands of the GEMMs of one mini-batch; :meth:`run` times them alone."""

    def __init__(self, shapes: Sequence[tuple[int, int, int]], train: bool,
                 generator: torch.Generator) -> None:
        def rand(*size: int) -> Tensor:
            return torch.rand(size, generator=generator)

        self.train = train
        self.forward = [(rand(b, i), rand(o, i)) for b, i, o in shapes]
        self.backward = [(rand(b, o), rand(o, i), rand(b, i)) for b, i, o in shapes] \
            if train else []
        self.num_gemms = len(shapes) * (3 if train else 1)

    def run(self) -> dict[str, float]:
        """Seconds of the forward products (``execution``) and backward ones (``backward``)."""
        clock = time.perf_counter
        t0 = clock()
        for x, w in self.forward:
            torch.mm(x, w.t())
        t1 = clock()
        for dy, w, x in self.backward:
            torch.mm(dy, w)
            torch.mm(dy.t(), x)
        return {"execution": t1 - t0, **({"backward": clock() - t1} if self.train else {})}


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
