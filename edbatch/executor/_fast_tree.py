"""The in-place executor's short path for binary Tree-LSTM batches (inference).

A :class:`~edbatch.executor.cells_trees.TreeLSTMInternal` batch reads its two children's
states ``[h; c]`` (two gathers of ``[B, 2H]`` rows), concatenates their ``h`` halves into
``x = [h1; h2]`` (a third copy), runs its three GEMMs and the fused element-wise kernel,
which reads ``c1`` and ``c2`` from the gathered copies. Here, where a run qualifies
(:func:`~edbatch.executor._fast_lstm.qualifies`: fused kernels on, CPU float32/64 arenas,
nothing saved for a backward), such a batch gathers ``x = [h1; h2]`` (``[B, 2H]``, row ``b``
the ``h`` columns of rows ``left[b]`` and ``right[b]`` of the state arena) in **one**
compiled copy loop (:func:`gather_pairs`: 1.5 against 5.4 us for one node, 11 against
18 us for 284, where an ``index_select`` of the interleaved rows of the arena's ``h``
columns did it), and the compiled kernel (:func:`~edbatch.executor._fused.tree_forward_rows`)
reads each child's ``c`` in place from the arena by row index. The same GEMMs on operands of
the same values and layouts (``h1`` is ``x``'s leading columns with row stride ``2H``, as
the gathered state's was) and the same element-wise arithmetic: bit-identical outputs
(``tests/executor/test_fast_tree.py``), one gather of ``B x 2H`` values instead of three
copies of ``B x 2H``, and no cell adapter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numba import njit
from torch import Tensor

from edbatch.errors import ExecutionError
from edbatch.executor import _fused
from edbatch.executor._fast_lstm import install_short
from edbatch.executor._fast_sick import sick_short
from edbatch.executor._program import LazySteps, Step, compile_program, new_step
from edbatch.executor._reads import indexed_reads, inplace_reads, whole_rows
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.kernels import KERNELS, Kernel, kernel_for
from edbatch.graph import Graph
from edbatch.memory.plan import MemoryPlan
from edbatch.schedule.schedule import Schedule

__all__ = ["KIND", "FastTreeStep", "gather_pairs", "tree_program", "tree_short"]

#: The op kind this short path serves.
KIND = "tree_lstm.internal"


class FastTreeStep:
    """One Tree-LSTM internal batch of ``n`` nodes: children rows ``left``/``right``
    (``int64``) of state arena ``arena``, output
    rows ``os:os+n`` of arena ``oa``; ``names``: the parameters ``U_iou, b_iou, U_f1, U_f2,
    b_f``; ``hidden`` is ``H``."""

    __slots__ = ("arena", "hidden", "left", "n", "name", "names", "oa", "os", "right")

    def __init__(self, arena: int, left: np.ndarray, right: np.ndarray,  # type: ignore[type-arg]
                 oa: int, os: int, names: tuple[str, ...], hidden: int, name: str = "") -> None:
        self.arena, self.left, self.right, self.oa, self.os = arena, left, right, oa, os
        self.n, self.names, self.hidden, self.name = len(left), names, hidden, name

    def bind(self, params: Mapping[str, Tensor], into: dict[Any, Tensor]) -> None:
        """Put what :meth:`__call__` reads into ``into``: each weight's contiguous
        transpose under ``(name, 0)`` (made once per run, inside ``TRANSPOSED.run()``), each
        bias under its name; and the names under themselves, so a later batch of the run
        reading the same parameters (every internal batch of a Tree-LSTM) binds nothing."""
        if self.names in into:
            return
        into[self.names] = self.names  # type: ignore[index]
        for k, name in enumerate(self.names):
            if k in (1, 4):
                into[name] = params[name].detach()
            elif (name, 0) not in into:
                into[(name, 0)] = TRANSPOSED(params[name])

    def __call__(self, arenas: Sequence[Tensor], views: Sequence[np.ndarray],  # type: ignore[type-arg]
                 w: Mapping[Any, Tensor]) -> None:
        n, hidden = self.n, self.hidden
        u_iou, b_iou, u_f1, u_f2, b_f = self.names
        try:
            states = views[self.arena]
            xv = np.empty((n, 2 * hidden), states.dtype)
            gather_pairs(states, self.left, self.right, hidden, xv)
            x = torch.from_numpy(xv)
            g = torch.addmm(w[b_iou], x, w[(u_iou, 0)])
            f1 = torch.addmm(w[b_f], x.narrow(1, 0, hidden), w[(u_f1, 0)])
            f2 = torch.addmm(w[b_f], x.narrow(1, hidden, hidden), w[(u_f2, 0)])
            gv = g.numpy()
            _fused._tree_fwd_rows(gv, f1.numpy(), f2.numpy(), states, self.left,
                                  self.right, views[self.oa][self.os:self.os + n],
                                  np.empty((n, hidden), gv.dtype))
        except Exception as e:  # as the kernel path reports a failing batch
            raise ExecutionError(f"batch of op type {self.name!r} ({n} nodes, Tree-LSTM short "
                                 f"path) failed: {type(e).__name__}: {e}") from e


@njit(cache=True, nogil=True)
def gather_pairs(states, left, right, hidden, out):  # type: ignore[no-untyped-def]
    """``out[b] = [states[left[b], :hidden]; states[right[b], :hidden]]`` for every row ``b``
    of ``out`` (``[len(left), 2 * hidden]``): the children's ``h`` side by side (row indices
    in range: the program's reads)."""
    for b in range(left.shape[0]):
        lo, hi = left[b], right[b]
        for j in range(hidden):
            out[b, j] = states[lo, j]
        for j in range(hidden):
            out[b, hidden + j] = states[hi, j]


def tree_short(program: Any, device: torch.device) -> Any:
    """Give ``program``'s Tree-LSTM internal batches (the registered kernel, children read
    as whole rows of one state arena) a :class:`FastTreeStep` in ``program.short`` (its
    other entries are kept), and the child-sum Tree-LSTM's batches theirs
    (:func:`~edbatch.executor._fast_sick.sick_short`); returns ``program``. Nothing off
    the CPU."""
    return install_short(sick_short(program, device), device, KIND,
                         lambda step: _tree_step(step, program.arenas))


def _tree_step(step: Any, arenas: Sequence[tuple[int, int]]) -> FastTreeStep | None:
    """A binary internal batch's short step: its children whole rows of one state arena."""
    if len(step.reads) != 2 or len(step.op.params) != 5:
        return None
    left, right = whole_rows(step.reads[0]), whole_rows(step.reads[1])
    hidden = step.width // 2
    if left is None or right is None or left[0] != right[0] or \
            arenas[left[0]][1] != 2 * hidden or len(left[1]) != step.size or \
            len(right[1]) != step.size:
        return None
    return FastTreeStep(left[0], np.ascontiguousarray(left[1], np.int64),
                        np.ascontiguousarray(right[1], np.int64), step.out_arena,
                        step.out_start, tuple(step.op.params), hidden, step.op.name)


def tree_program(graph: Graph, schedule: Schedule, plan: MemoryPlan, device: torch.device,  # noqa: C901
                 kernels: Mapping[str, Kernel] | None, kinds: frozenset[str]) -> Any:
    """``compile_program``'s program with the :class:`FastTreeStep` of every qualifying
    internal batch (as :func:`tree_short` makes them) made from the plan's operands, their
    steps' reads compiled only if asked for (a :class:`~edbatch.executor._program.LazySteps`
    entry: a run that is not all short paths, e.g. unfused, profiled or training): no
    ``index_select`` read, index tensor and numpy view of them for the short path to undo.
    ``None`` where it does not apply (off the CPU, another kernel for the kind, a kind to
    hoist in the graph, no such batch, a program pass that merged steps): then compile the
    usual way. The same steps, reads (when built), counts and short steps as that way."""
    kernel = KERNELS.get(KIND)
    if device.type != "cpu" or kernel is None or not getattr(kernel, "writes_out", False):
        return None
    vocab = graph.vocab
    ops = {i: op for i, op in enumerate(vocab) if op.kind == KIND
           and kernel_for(op, kernels) is kernel and op.arity == 2 and len(op.params) == 5}
    if not ops or not kinds.isdisjoint(op.kind for op in vocab):
        return None
    op_ids, bptr = schedule.flat()[:2]
    # per op type: (H, parameter names, name); per batch one pass over its two operands
    # (their rows and their read counts), no call per batch but FastTreeStep's
    spec = {i: (math.prod(op.out_shape) // 2, tuple(op.params), op.name)
            for i, op in ops.items()}
    found: dict[int, FastTreeStep] = {}
    arenas, ptr, operands = plan.arenas, bptr.tolist(), plan.operands
    out_arena, out_start = plan.output_rows()  # (no Region object per batch)
    views = gathers = gathered = 0
    arange, array, int64 = np.arange, np.array, np.int64
    for b, op_id in enumerate(op_ids.tolist()):
        entry = spec.get(op_id)
        if entry is None:
            continue
        pair = operands[b]
        if len(pair) != 2:
            continue
        left, right = pair
        hidden, arena = entry[0], left.arena
        if right.arena != arena or arenas[arena][1] != 2 * hidden:
            continue
        lv, rv = left.view, right.view  # (row arrays writable: one compiled signature)
        lrows = array(left.gather, int64) if lv is None else arange(lv.start, lv.stop,
                                                                     dtype=int64)
        rrows = array(right.gather, int64) if rv is None else arange(rv.start, rv.stop,
                                                                      dtype=int64)
        size = ptr[b + 1] - ptr[b]
        if len(lrows) != size or len(rrows) != size:
            continue
        found[b] = FastTreeStep(arena, lrows, rrows, out_arena[b], out_start[b], entry[1],
                                hidden, entry[2])
        # the reads the general path would compile (and count) for it
        for o, rows in ((left, lrows), (right, rrows)):
            if o.view is None:
                gathers += 1
                gathered += len(rows)
            else:
                views += 1
    if not found:
        return None
    program = compile_program(graph, schedule, plan, device, kernels, list(found))
    if len(program.steps) != len(op_ids):  # a program pass merged steps: not this way
        return None
    counts = program.counts[False]
    counts[0] += views
    counts[1] += gathers
    counts[2] += gathered
    steps = program.steps  # (compile_program's LazySteps: found's steps made on first use)
    given = steps.entries() if isinstance(steps, LazySteps) else list(steps)

    def build() -> dict[int, Step]:
        batches = list(found)
        reads = indexed_reads([steps[b].kernel for b in batches], inplace_reads(
            [plan.operands[b] for b in batches], device, [0, 0, 0]), device)
        out = {}
        for b, step_reads in zip(batches, reads, strict=True):
            fields = steps[b].__dict__.copy()
            fields["reads"] = step_reads
            out[b] = new_step(**fields)
        return out

    program.steps = LazySteps(given, list(found), build)  # type: ignore[assignment]
    short: list[FastTreeStep | None] = [None] * len(steps)
    for b, fast in found.items():
        short[b] = fast
    program.short = tuple(short)  # type: ignore[attr-defined]
    return program
