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
from edbatch.executor._reads import whole_rows
from edbatch.executor._weights import TRANSPOSED

__all__ = ["KIND", "FastTreeStep", "gather_pairs", "tree_short"]

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
