"""The GEMM floor of ``benchmarks/throughput.py``: a mini-batch's matrix products timed alone.

:func:`gemm_shapes` lists the products the executor's program for a schedule issues (one
:class:`Gemm` per 2-D weight of a batch's op type, rows = the batch's real row count; with
input-projection hoisting, :mod:`edbatch.executor._hoist`, an LSTM cell's weight ``[W_x W_h]``
is one ``W_x`` projection over many batches' rows plus one ``W_h`` product per batch: the
same multiply-adds in fewer, larger products; ``hoist=False`` lists the per-batch cells').

:class:`GemmFloor` times them as a **lower bound** on what any contender's products can
cost (issue 32: the floor it replaces gave every product its own random weight, 171 distinct
360 KB ``W_h`` copies in a lattice mini-batch, 61 MB, so each small-row product streamed its
weight from memory where the model multiplies by one cached ``W_h``; ``fsm`` ran at 0.93x
that floor; measured alone on one lattice, BiLSTM and Tree-LSTM mini-batch, one shared
weight made the same products 0.76-0.80x as long, this floor 0.72-0.82x; the layout
``x @ W^T`` vs a contiguous ``W^T`` 1-2%, ``mm`` vs ``addmm``, a fresh output vs ``out=``, a
64 MB cache flush before the run, and ``?gemm`` called from compiled code instead of
``torch.mm`` nothing that lowers it; in a throughput run, where the old floor's operands were
cold, this floor is 0.71-0.86x the old one at load 0.2-0.6, 0.61-0.82x at load 6):

* **weights**: the model's own parameter tensors (one per parameter, shared by all its
  products and all mini-batches, as every contender shares them), each block ``W[:, s:s+k]``
  in two layouts: the strided ``W^T`` view (what ``F.linear`` and ``x @ w.t()`` read) and a
  contiguous ``W^T`` copy made once (what edbatch's executor keeps);
* **operands**: one random buffer per role and width, shared by every product and every
  mini-batch of the job (``x``, ``dY`` and the outputs as cache-warm as they get); outputs
  written with ``out=`` (no allocation);
* **the faster layout**: the products are swept once in each layout (which first alternates
  per run) and the faster sweep counts (the two differ by 1-2%). Not per product the faster
  of two back-to-back runs: the second run of a product on the operands it has just touched
  took 0.53-0.57x the old floor where one run took 0.73-0.77x, warmer than any contender's
  single product;
* **training**: per product also ``dY W`` (both layouts) and, per weight block, **one**
  ``dY^T X`` over all its products' rows (what edbatch's analytic backward does,
  :class:`~edbatch.executor.param_grads.ParamGrads`: the same multiply-adds), as
  ``dY^T X`` or ``(X^T dY)`` (in the layout's sweep).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from edbatch.executor.cell_kind import CELL_KINDS
from edbatch.executor.cells_hoist import HOISTS
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, OpType
from edbatch.memory import plan_memory
from edbatch.schedule import Schedule

__all__ = ["Gemm", "GemmFloor", "gemm_shapes", "make_floors"]

_EMBEDDING_SUFFIXES = (".E", "emb")  # tables read by lookups, not multiplied


class Gemm(NamedTuple):
    """One product ``X W[:, start:start+inputs]^T``: ``X`` is ``rows x inputs``, the weight
    block ``outputs x inputs`` of the parameter ``param``."""

    rows: int
    inputs: int
    outputs: int
    param: str
    start: int = 0


def gemm_shapes(graph: Graph, schedule: Schedule, param_shapes: Mapping[str, tuple[int, ...]],
                hoist: bool = True) -> list[Gemm]:
    """Every matrix product the executor's program for ``schedule`` issues: one per 2-D
    weight of a batch's op type (embedding tables excluded), rows = batch size; with
    ``hoist`` (the executor's default), a hoisted LSTM cell's weight ``(4H, in + H)`` as its
    projection steps' ``W_x`` products (columns ``:in``) and its batches' ``W_h`` (``in:``)."""
    if not hoist:
        return [shape for batch in schedule.batches
                for shape in _weights(graph.vocab[batch.op_id], len(batch.node_ids),
                                      param_shapes)]
    program, _ = TorchExecutor("cpu", hoist=True)._program(
        graph, schedule, plan_memory(graph, schedule, "naive"))
    shapes: list[Gemm] = []
    for step in program.steps:
        op = step.op
        kind = op.kind.removesuffix(".projection")
        spec = HOISTS.get(kind)
        if spec is None or (op.kind == kind and step.kernel is not spec.cell):
            shapes += _weights(op, step.size, param_shapes)  # not hoisted
            continue
        name = op.params[spec.weight]
        gates, inputs = param_shapes[name]
        hidden = gates // 4
        if op.kind != kind:  # the projection: W_x over the group's rows
            shapes.append(Gemm(step.size, inputs - hidden, gates, name, 0))
        else:  # the hoisted cell: W_h, and any other weight of the op
            shapes.append(Gemm(step.size, hidden, gates, name, inputs - hidden))
            shapes += _weights(op, step.size, param_shapes, skip=name)
    return shapes


def _weights(op: OpType, rows: int, param_shapes: Mapping[str, tuple[int, ...]],
             skip: str = "") -> list[Gemm]:
    out = []
    cell = CELL_KINDS.get(op.kind)  # tables a cell kind declares (e.g. parser.E_w) are read
    tables = {name for name, q in zip(op.params, cell.params, strict=False)
              if q.init == "embedding"} if cell is not None else set()
    for name in op.params:
        shape = param_shapes.get(name)
        if name != skip and shape is not None and len(shape) == 2 and \
                not name.endswith(_EMBEDDING_SUFFIXES) and name not in tables:
            out.append(Gemm(rows, shape[1], shape[0], name))
    return out


#: One product in two layouts: ``(a, b, out)`` each, ``out = a @ b``.
Pair = tuple[tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class _Operands:
    """The shared operand buffers of a job's floors: one per role and width, as many rows as
    the largest product needs; the weight blocks and their contiguous transposes."""

    def __init__(self, lists: Sequence[Sequence[Gemm]], train: bool,
                 weights: Mapping[str, Tensor], generator: torch.Generator) -> None:
        need: dict[tuple[str, int], int] = {}

        def want(role: str, width: int, rows: int) -> None:
            need[role, width] = max(need.get((role, width), 0), rows)

        for gemms in lists:
            for g in gemms:
                _check(g, weights)
                want("x", g.inputs, g.rows)
                want("y", g.outputs, g.rows)
                if train:
                    want("dy", g.outputs, g.rows)
                    want("dx", g.inputs, g.rows)
            if train:
                for rows, inputs, outputs in _grouped(gemms).values():
                    want("X", inputs, rows)
                    want("dY", outputs, rows)
        #: the weights' device (the generator draws on the CPU; the buffers move once)
        self.device = next(iter(weights.values())).device if weights else torch.device("cpu")
        self.buffers = {key: torch.rand(rows, key[1], generator=generator).to(self.device)
                        for key, rows in need.items()}
        self.weights = {name: w.detach() for name, w in weights.items()}
        self.blocks: dict[tuple[str, int, int], tuple[Tensor, Tensor]] = {}
        self.grads: dict[tuple[int, int], Tensor] = {}

    def rows(self, role: str, width: int, rows: int) -> Tensor:
        return self.buffers[role, width].narrow(0, 0, rows)

    def grad(self, outputs: int, inputs: int) -> Tensor:
        """The weight-gradient output of a block of this shape (one per shape)."""
        return self.grads.setdefault((outputs, inputs), torch.empty(outputs, inputs,
                                                                     device=self.device))

    def block(self, g: Gemm) -> tuple[Tensor, Tensor]:
        """``(W_blk, W_blk^T contiguous)`` of ``g``'s weight block (made once per job)."""
        key = (g.param, g.start, g.inputs)
        if key not in self.blocks:
            w = self.weights[g.param].narrow(1, g.start, g.inputs)
            self.blocks[key] = (w, w.t().contiguous())
        return self.blocks[key]


def _check(g: Gemm, weights: Mapping[str, Tensor]) -> None:
    w = weights.get(g.param)
    if w is None:
        raise ValueError(f"the floor's product {g} names a parameter the weights lack: "
                         f"{g.param!r}")
    if w.dim() != 2 or w.shape[0] != g.outputs or g.start + g.inputs > w.shape[1]:
        raise ValueError(f"the floor's product {g} does not fit its parameter {g.param!r} "
                         f"of shape {tuple(w.shape)}")


def _grouped(gemms: Sequence[Gemm]) -> dict[tuple[str, int, int], tuple[int, int, int]]:
    """``(rows, inputs, outputs)`` per weight block ``(param, start, inputs)``, the rows of
    all its products: one ``dY^T X`` each in training."""
    out: dict[tuple[str, int, int], tuple[int, int, int]] = {}
    for g in gemms:
        rows = out.get((g.param, g.start, g.inputs), (0, 0, 0))[0]
        out[g.param, g.start, g.inputs] = (rows + g.rows, g.inputs, g.outputs)
    return out


class GemmFloor:
    """The products of one mini-batch on shared, warm operands; :meth:`run` times them."""

    def __init__(self, gemms: Sequence[Gemm], train: bool, weights: Mapping[str, Tensor],
                 generator: torch.Generator, operands: _Operands | None = None) -> None:
        ops = operands or _Operands([gemms], train, weights, generator)
        self.train, self.gemms = train, list(gemms)
        self.forward: list[Pair] = []
        self.input_grads: list[Pair] = []
        self.weight_grads: list[Pair] = []
        for g in gemms:
            w, wt = ops.block(g)
            x, y = ops.rows("x", g.inputs, g.rows), ops.rows("y", g.outputs, g.rows)
            self.forward.append(((x, w.t(), y), (x, wt, y)))
            if train:
                dy, dx = ops.rows("dy", g.outputs, g.rows), ops.rows("dx", g.inputs, g.rows)
                self.input_grads.append(((dy, w, dx), (dy, wt.t(), dx)))
        if train:
            for rows, inputs, outputs in _grouped(gemms).values():
                dys, xs = ops.rows("dY", outputs, rows), ops.rows("X", inputs, rows)
                grad = ops.grad(outputs, inputs)
                self.weight_grads.append(((dys.t(), xs, grad), (xs.t(), dys, grad.t())))
        self.num_gemms = len(self.forward) + len(self.input_grads) + len(self.weight_grads)
        self._flip = False

    def products(self) -> list[tuple[str, int, int, int]]:
        """``(phase, m, k, n)`` of every product timed (one per pair: each layout's sweep runs
        it once, in that layout): ``forward``, ``input_grad``, ``weight_grad``."""
        return [(phase, a.shape[0], a.shape[1], b.shape[1])
                for phase, pairs in (("forward", self.forward),
                                     ("input_grad", self.input_grads),
                                     ("weight_grad", self.weight_grads))
                for (a, b, _), _ in pairs]

    def run(self) -> dict[str, float]:
        """Seconds of the forward products (``execution``) and backward ones (``backward``):
        each phase swept once per layout (the order alternating per run), the faster sweep."""
        self._flip = flip = not self._flip
        layouts = (1, 0) if flip else (0, 1)
        execution = min(_sweep(self.forward, layout) for layout in layouts)
        if not self.train:
            return {"execution": execution}
        return {"execution": execution,
                "backward": min(_sweep(self.input_grads, layout) +
                                _sweep(self.weight_grads, layout) for layout in layouts)}


def _sweep(pairs: Sequence[Pair], layout: int) -> float:
    """Seconds of every product of ``pairs`` once, in ``layout`` (0 or 1); on CUDA from a
    synchronised start to the last product's end."""
    cuda = bool(pairs) and pairs[0][layout][0].is_cuda
    if cuda:
        torch.cuda.synchronize()
    mm, t0 = torch.mm, time.perf_counter()
    for pair in pairs:
        a, b, out = pair[layout]
        mm(a, b, out=out)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def make_floors(lists: Sequence[Sequence[Gemm]], train: bool, weights: Mapping[str, Tensor],
                generator: torch.Generator) -> list[GemmFloor]:
    """One :class:`GemmFloor` per product list, all on one set of shared operands."""
    ops = _Operands(lists, train, weights, generator)
    return [GemmFloor(gemms, train, weights, generator, ops) for gemms in lists]
