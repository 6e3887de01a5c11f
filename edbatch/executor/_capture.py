"""CUDA-graph capture of inference runs whose schedule shape repeats.

What a batched run launches (its kernels, operand slices and gathers, arena layout) depends
only on the graph's structure, the schedule and the memory plan; the per-instance data is
the graph's ``attrs`` (token ids, child positions), which a compiled program reads from one
flat device tensor in plan row order. So inference runs of graphs with equal
:func:`~edbatch.memory.plan_key` (and outputs) can replay one captured CUDA graph after one
copy of the new ``attrs`` into that tensor: a single graph launch instead of one launch
per kernel, gather and copy (on a GPU the per-batch launches, not the arithmetic, bound the
small batches of dynamic networks).

:class:`GraphCache` counts how often each shape is seen and captures it the ``capture_after``-th
time it reappears (one-off shapes are never captured); it keeps up to ``size`` captured graphs
(LRU), each with its own arenas, and a pinned staging buffer for ``attrs``. A captured graph
reads the parameter tensors it was captured with, by address: parameters updated in place
(an optimizer step) are seen by the next replay, and other parameter tensors trigger a new
capture. A program that cannot be captured (e.g. a custom kernel that synchronises with the
host) is run eagerly from then on, with a warning naming the error.

Training runs (dense gradients, registered kernels) are captured the same way, forward and
backward, with :func:`torch.cuda.make_graphed_callables` over the run's autograd function
(the hand-written backwards or ``BatchedRun``): the forward graph replays when the run is
called, the backward graph when the loss is back-propagated. Parameter gradients come back
as fresh tensors (cloned from the graph's static buffers, so accumulating into ``.grad``
behaves as in an eager run); the run's outputs and saved activations are the graphs' static
buffers, so a replayed run's outputs are overwritten, and its backward is no longer valid,
once the next run of that shape starts: back-propagate each run before the next (as any
training loop does).
"""

from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from edbatch.graph import Graph
from edbatch.memory.plan import MemoryPlan
from edbatch.memory.planner import plan_key
from edbatch.schedule.schedule import Schedule

__all__ = ["Captured", "CapturedTraining", "GraphCache", "params_key"]


def params_key(params: Mapping[str, Tensor]) -> tuple[tuple[str, int, tuple[int, ...]], ...]:
    """Name, address and shape of every parameter tensor (what a captured graph reads)."""
    return tuple((name, p.data_ptr(), tuple(p.shape)) for name, p in params.items())


@dataclass
class _Entry:
    """What every captured run holds.

    Attributes:
        program: the program compiled for this capture alone (its ``attrs`` tensor is the
            graphs' input, overwritten before every replay).
        params: the parameter tensors the graphs read, kept alive so their memory is never
            reused while the graphs may replay.
        params_key: :func:`params_key` of ``params``.
        host: pinned staging buffer for ``attrs``.
        replays: how often it was replayed.
    """

    program: Any
    params: tuple[Tensor, ...]
    params_key: tuple[tuple[str, int, tuple[int, ...]], ...]
    host: Tensor = field(init=False)
    replays: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.host = torch.empty(len(self.program.attr_nodes), dtype=torch.int64).pin_memory()

    def _load(self, graph: Graph) -> None:
        """Copy ``graph``'s attrs into the program's attrs tensor (through ``host``; the
        caller synchronises before the next replay, which rewrites it)."""
        self.host.numpy()[:] = graph.attrs[self.program.attr_nodes]
        self.program.attrs.copy_(self.host, non_blocking=True)
        self.replays += 1


@dataclass(kw_only=True)
class Captured(_Entry):
    """One captured inference run: ``cuda_graph`` writes ``arenas``."""

    cuda_graph: Any
    arenas: list[Tensor]

    def replay(self, graph: Graph) -> list[Tensor]:
        """Load ``graph``'s attrs and replay; returns the arenas (valid until the next
        replay)."""
        self._load(graph)
        self.cuda_graph.replay()
        return self.arenas


class _CloneGrads(torch.autograd.Function):
    """Identity whose backward clones the gradients (the graphed backward returns views of
    its static buffers, which autograd would otherwise install as ``.grad``)."""

    @staticmethod
    def forward(ctx: Any, *values: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        return values

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        return tuple(None if g is None else g.clone() for g in grads)


@dataclass(kw_only=True)
class CapturedTraining(_Entry):
    """One captured training run: ``graphed(*param_values) -> output rows`` replays the
    forward graph, and back-propagating its outputs the backward graph."""

    graphed: Callable[..., Any]

    def replay(self, graph: Graph, values: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Load ``graph``'s attrs and run the graphed forward; returns the output rows."""
        self._load(graph)
        outputs = self.graphed(*_CloneGrads.apply(*values))
        return (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)


class GraphCache:
    """Captured CUDA graphs of runs (inference, training), keyed by the run's shape.

    Args:
        capture_after: capture a shape the ``capture_after``-th time it is seen again (1:
            on its second run; 0: on its first).
        size: captured graphs kept (least recently used dropped first).
    """

    def __init__(self, capture_after: int = 1, size: int = 16) -> None:
        if capture_after < 0 or size < 1:
            raise ValueError(f"capture_after={capture_after} must be >= 0 and size={size} "
                             f">= 1")
        self.capture_after, self.size = capture_after, size
        self.captured: OrderedDict[bytes, Captured | CapturedTraining] = OrderedDict()
        self._seen: OrderedDict[bytes, int] = OrderedDict()
        self._failed: set[bytes] = set()
        self._stream: Any = None

    @staticmethod
    def key(graph: Graph, schedule: Schedule, plan: MemoryPlan) -> bytes:
        """The run's shape: structure, schedule and strategy (:func:`plan_key`), outputs."""
        h = hashlib.blake2b(plan_key(graph, schedule, plan.strategy), digest_size=16)
        h.update(graph.outputs.tobytes())
        return h.digest()

    def lookup(self, key: bytes, params: Mapping[str, Tensor]
               ) -> Captured | CapturedTraining | None:
        """The graph captured for ``key`` with these parameter tensors, if any."""
        hit = self.captured.get(key)
        if hit is None or hit.params_key != params_key(params):
            return None
        self.captured.move_to_end(key)
        return hit

    def due(self, key: bytes) -> bool:
        """Count one eager run of shape ``key``; whether to capture it now."""
        if key in self._failed:
            return False
        n = self._seen.pop(key, 0)
        self._seen[key] = n + 1
        while len(self._seen) > 64 * self.size:
            self._seen.popitem(last=False)
        return n >= self.capture_after

    def capture(self, key: bytes, program: Any,
                run: Callable[[Any, Mapping[str, Tensor]], list[Tensor]],
                params: Mapping[str, Tensor]) -> Captured | None:
        """Capture the inference ``run(program, params)`` (one warm-up run first, on the
        capture stream).

        ``program`` must be compiled for this capture alone; returns ``None`` (and never
        tries ``key`` again) if the run cannot be captured.
        """
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        cuda_graph = torch.cuda.CUDAGraph()
        try:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(stream):
                run(program, params)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.no_grad(), torch.cuda.graph(cuda_graph, stream=stream):
                arenas = run(program, params)
        except Exception as e:
            self._failure(key, e)
            return None
        return self._store(key, Captured(program, tuple(params.values()), params_key(params),
                                         cuda_graph=cuda_graph, arenas=arenas))

    def capture_training(self, key: bytes, program: Any,
                         fn: Callable[..., Any], params: Mapping[str, Tensor]
                         ) -> CapturedTraining | None:
        """Capture the training run ``fn(*param_values)`` (output rows), forward and
        backward, with :func:`torch.cuda.make_graphed_callables`; ``None`` if it fails."""
        # capture on fresh leaves aliasing the parameters: the parameters' own autograd
        # accumulators (alive while any earlier loss is, on the default stream) must not
        # take part in the capture, where they would invalidate it
        aliases = tuple(p.detach().requires_grad_(p.requires_grad) for p in params.values())
        try:
            with torch.enable_grad():
                graphed = torch.cuda.make_graphed_callables(
                    fn, aliases, num_warmup_iters=2, allow_unused_input=True)
        except Exception as e:
            self._failure(key, e)
            return None
        return self._store(key, CapturedTraining(program, tuple(params.values()),
                                                 params_key(params), graphed=graphed))

    def _store(self, key: bytes, entry: Any) -> Any:
        self.captured[key] = entry
        while len(self.captured) > self.size:
            self.captured.popitem(last=False)
        return entry

    def _failure(self, key: bytes, error: Exception) -> None:
        self._failed.add(key)
        torch.cuda.synchronize()
        warnings.warn(f"CUDA-graph capture failed ({type(error).__name__}: {error}); this "
                      f"shape runs eagerly (kernels that synchronise with the host, e.g. "
                      f"`.item()` or data-dependent shapes, cannot be captured)",
                      RuntimeWarning, stacklevel=4)
