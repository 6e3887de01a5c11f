"""DynamicBatch: records one mini-batch of per-instance model code, then runs it batched.

See :mod:`edbatch.api` for the overview and an example.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from edbatch.api._assemble import assemble_graph
from edbatch.api._builtins import BuiltinOp, builtin_op, register_workload
from edbatch.api._bulk import Handles, add_losses
from edbatch.api._cellcall import probe, user_function
from edbatch.api._fast import bind_methods
from edbatch.api._handles import (
    Cell,
    CellImpl,
    Current,
    Handle,
    Instance,
    Kind,
    Recording,
    ShapeLike,
    _shape,
    cell_shapes,
    grow_pool,
    new_handle,
    recycle,
)
from edbatch.api._inputs import (
    add_input,
    add_inputs,
    check_params,
    input_op,
    lookup_index,
    output_handles,
)
from edbatch.api._programs import Program, ProgramsResult, run_programs
from edbatch.api._result import BatchResult, dtype_hint
from edbatch.api._schedulers import SchedulerLike, as_scheduler, memory_strategy
from edbatch.api._variadic import VariadicCell
from edbatch.errors import ExecutionError, GraphError
from edbatch.executor import KERNELS, Kernel
from edbatch.executor.device import check_device, check_dtype
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.graph import Graph, OpType, Vocab
from edbatch.memory import Strategy, plan_memory

__all__ = ["DynamicBatch"]


class DynamicBatch:
    """Records one mini-batch of per-instance model code, then runs it batched.

    Register modules as cells once (:meth:`cell`; :meth:`lookup` registers embeddings
    itself), then for every mini-batch: open one :meth:`instance` per data instance, call
    cells on handles, mark losses with :meth:`add_loss`, and :meth:`run`. The vocabulary
    grows as op types are registered and keeps that order, so it is the same for every
    mini-batch once all cells exist (as a trained FSM policy needs).

    Args:
        device: where inputs and the executor's buffers live (modules must be there too).
        dtype: the executor's arena dtype.
    """

    def __init__(self, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.device, self.dtype = check_device(device), check_dtype(dtype)
        #: The executor's kernels: the shared ``lookup`` (inputs) and ``sum`` (loss), and one
        #: per cell (this batch's own table, so cells never enter the global registry).
        self.kernels: dict[str, Kernel] = {k: KERNELS.get(k) for k in ("lookup", "sum")}
        self._ops: list[OpType] = []
        self._op_ids: dict[str, int] = {}
        self._kinds: dict[str, Kind] = {}
        self._cells: dict[str, CellImpl | VariadicCell] = {}
        self._embeddings: dict[int, Cell] = {}
        self._lookup_kinds: dict[Any, Kind] = {}  # embedding module -> its cell's kind
        self._generation = 0
        self.warned_outside = False  # the warning about nodes outside instances: once
        self.params: dict[str, Tensor] = {}  #: built-in op types' parameters (from_workload)
        self._vocabs: dict[tuple[int, bool], Vocab] = {}  # graph() vocabularies, reused
        self._kept: dict[Any, Any] = {}  # run("auto") and policies: made once, kept across runs
        self._switches: dict[tuple[Any, ...], Any] = {}  # switch(): cells checked for bulk
        self._pool: list[Handle] = []  # node id -> its handle object (see _handles.recycle)
        self._current = Current()  # ``_rec`` again, in a slot for the C calls (see _fast)
        self._clear()
        bind_methods(self, DynamicBatch)  # add_loss and lookup: the common case in C

    @classmethod
    def from_workload(cls, workload: object, params: Mapping[str, Tensor] | None = None,
                      **kw: object) -> DynamicBatch:
        """A batch (``kw``: device, dtype) with ``workload``'s ops and ``params`` built in."""
        return register_workload(cls(**kw), workload, params)  # type: ignore[arg-type]

    def op(self, name: str) -> BuiltinOp:
        """The built-in op type ``name`` as a callable ``op(*handles, attr=...) -> Handle``."""
        return builtin_op(self, name)

    def _clear(self) -> None:  # forget the recorded mini-batch; its handles become stale
        old = getattr(self, "_rec", None)
        if old is not None:
            recycle(self._pool, len(old.ops))
            old.release()
        self._generation += 1
        self._rec = self._current.rec = Recording(self, self._generation)
        self._instance, self._num_instances = -1, 0  # -1: outside any instance

    @property
    def vocab(self) -> Vocab:
        """The op types registered so far, in registration order (op id = position)."""
        return Vocab(self._ops)

    # ------------------------------------------------------------------ registration
    def cell(self, module: Callable[..., Tensor], name: str, in_shapes: Sequence[ShapeLike],
             out_shape: ShapeLike, *, takes_attr: bool = False,
             variadic: bool = False) -> Cell:
        """Register ``module`` as the cell (op type) ``user.<name>``; return the function
        that records one node of it per call (a :class:`~edbatch.api.Cell`; registering the
        same module under the same name again returns the same function).

        ``variadic=True``: the last of ``in_shapes`` repeats any number of times per call
        (see :mod:`edbatch.api._variadic` for the module's call).

        The module is probed once with a zero batch of one row (eval mode, no grad) to
        check that it returns ``[1, *out_shape]``.

        Args:
            module: ``module(*inputs[, attrs])`` with ``inputs[k]`` of shape
                ``[B, *in_shapes[k]]`` (and ``attrs`` ``int64[B]`` if ``takes_attr``); it
                must return ``[B, *out_shape]`` and treat rows independently.
            name: the cell name, unique in this batch (letters, digits, ``_``).
            in_shapes: one shape (or int width) per operand.
            out_shape: the shape of one output row; ``()`` for one number per row (losses).
            takes_attr: the module also gets each node's integer ``attr`` (label, token).

        Raises:
            GraphError: the name is taken, a shape is invalid, or the probe raised or
                returned the wrong shape (the message names the cell, got and expected).
        """
        ins = cell_shapes(name, in_shapes)
        out = () if out_shape == () else _shape(out_shape, f"cell {name!r} out_shape")
        if variadic and takes_attr:
            raise GraphError(f"cell {name!r}: a variadic cell takes no attr (its nodes' "
                             f"attrs hold their operand counts); pass labels to another cell")
        new = (VariadicCell(self, module, name, ins, out) if variadic
               else CellImpl(self, module, name, ins, out, takes_attr))
        old = self._cells.get(new.op.kind)
        if old is not None:
            if old.module is module and old.op == new.op and old.takes_attr == takes_attr:
                return old.call  # type: ignore[no-any-return]
            raise GraphError(f"cell {name!r} is already registered as {old!r} (module "
                             f"{type(old.module).__name__}); give this cell another name")
        probe(new, self.device, self.dtype)
        self.kernels[new.op.kind] = new.kernel
        self._register(new.op)
        new.kind = self._kinds[new.op.name]
        call = user_function(new, self)
        new.call = call
        self._cells[new.op.kind] = new
        return call  # type: ignore[no-any-return]

    def _register(self, op: OpType) -> None:
        if op.name not in self._op_ids:
            self._op_ids[op.name] = len(self._ops)
            self._kinds[op.name] = Kind(op, len(self._ops))
            self._ops.append(op)

    # ------------------------------------------------------------------ recording
    def instance(self) -> Instance:
        """Nodes created inside ``with batch.instance() as i:`` belong to a new data
        instance, of id ``i`` (blocks nest; on leaving one, the enclosing instance goes on).

        Instances label nodes with the data item they belong to: they change no value,
        gradient or schedule. The lower bound (:func:`~edbatch.schedule.lower_bound`) takes
        a faster path when instances are separate, and policy training and the
        environment's features see them. Nodes recorded outside every instance count as
        instance 0, with a :class:`RecordingWarning` (once per batch) at the first
        :meth:`run` or :meth:`graph` that has some."""
        return Instance(self)

    def next_instance(self) -> int:
        """Start a new data instance (no context manager); return its id."""
        self._instance = self._num_instances
        self._num_instances += 1
        self._rec.marks.append((len(self._rec.ops), self._instance))
        return self._instance

    def _add(self, op: OpType, operands: Sequence[int], attr: int) -> Handle:
        """Record one node (operands checked by the caller); the generic, slower path."""
        rec, kind = self._rec, self._kinds[op.name]
        node = len(rec.ops)
        rec.ops.append(kind.op_id)
        rec.operands.extend(operands)
        if kind.arity < 0:
            rec.counts.append(len(operands))
        rec.attrs.append(attr)
        return new_handle(rec, node, kind)

    def _check_handle(self, handle: object, where: str) -> None:
        if not isinstance(handle, Handle):
            raise GraphError(f"{where} is a {type(handle).__name__}, not a Handle; operands "
                             f"must be handles; wrap a constant tensor with batch.input(row)")
        if handle.batch is not self:
            raise GraphError(f"{where}: {handle!r} belongs to another DynamicBatch; create "
                             f"every handle of a mini-batch with the batch that runs it")
        if handle.generation != self._generation:
            raise GraphError(f"{where}: {handle!r} is from a mini-batch that already ran "
                             f"(run() starts a new one); rebuild it in the current mini-batch")

    def input(self, row: Tensor) -> Handle:
        """A node holding the constant ``row`` (gradients flow back to it if it needs them).

        Its op type is ``input/<shape>`` (one per shape), a lookup into the stacked rows.
        For many rows at once see :meth:`inputs`.
        """
        return add_input(self, row)

    def inputs(self, rows: Tensor) -> list[Handle]:
        """One node per row of ``rows`` (``[k, *shape]``), in the current instance: bulk
        :meth:`input`. The rows enter the executor as one block (one autograd node for the
        whole tensor, not one per row); gradients flow back to ``rows``."""
        return add_inputs(self, rows)

    def _input_op(self, shape: tuple[int, ...], prefix: str = "input") -> OpType:
        """The op type ``<prefix>/<shape>`` (a lookup of rows; registered on first use)."""
        return input_op(self, shape, prefix)

    def lookup(self, embedding: nn.Embedding, index: int, *, name: str | None = None
               ) -> Handle:
        """Row ``index`` of ``embedding``; on first use it becomes a cell named ``name``
        (default ``embedding<k>``) whose forward runs on the batched indices.

        Raises:
            GraphError: ``index`` is out of range (the message names the cell).
        """
        try:  # the common case inline: a registered embedding, an int index in range
            kind = self._lookup_kinds[embedding]
            if type(index) is int and 0 <= index < embedding.num_embeddings:
                rec = self._rec
                ops = rec.ops
                node = len(ops)
                ops.append(kind.op_id)
                rec.attrs.append(index)
                pool = self._pool
                try:
                    h = pool[node]
                except IndexError:
                    h = grow_pool(pool, node)
                h._rec = rec
                h._kind = kind
                return h
        except (KeyError, TypeError):  # (TypeError: an unhashable embedding-like object)
            pass
        cell = self._embeddings.get(id(embedding))
        if cell is None:
            if not (isinstance(getattr(embedding, "num_embeddings", None), int)
                    and isinstance(getattr(embedding, "embedding_dim", None), int)
                    and callable(embedding)):
                raise GraphError(f"batch.lookup takes an nn.Embedding (a module with int "
                                 f"num_embeddings and embedding_dim); got "
                                 f"{type(embedding).__name__}. Fix: pass the model's "
                                 f"nn.Embedding, e.g. batch.lookup(self.embed, index)")
            name = name or f"embedding{len(self._embeddings)}"
            cell = self.cell(embedding, name, [], embedding.embedding_dim, takes_attr=True)
            self._embeddings[id(embedding)] = cell
            try:
                self._lookup_kinds[embedding] = cell.cell.kind
            except TypeError:
                pass
        index = lookup_index(cell.name, index)
        if not 0 <= index < embedding.num_embeddings:
            raise GraphError(f"cell {cell.name!r}: index {index} is out of range for an "
                             f"embedding of {embedding.num_embeddings} rows; map unknown "
                             f"items to a valid row")
        return cell(attr=index)

    def add_loss(self, handle: Handle) -> None:
        """Add ``handle`` (one number per row) to the mini-batch loss that ``run`` returns;
        a :class:`Handles` (``cell.map``'s result) adds each of its nodes."""
        rec = self._rec
        if type(handle) is Handles:  # (first: a block has no ``_rec``, and raising costs)
            return add_losses(self, handle)
        try:  # (only a handle of this recording has it as ``_rec``)
            if handle._rec is rec and handle._kind.scalar:
                rec.losses.append(handle.node_id)
                return
        except AttributeError:
            pass
        self._check_handle(handle, "add_loss")
        if math.prod(handle.shape) != 1:
            raise GraphError(f"add_loss: {handle!r} has shape {handle.shape}, not one number; "
                             f"declare the loss cell with out_shape=() and reduce per row")
        rec.losses.append(handle.node_id)

    def run_programs(self, programs: Sequence[Program],
                     scheduler: SchedulerLike = "typewise_greedy", *,
                     strategy: Strategy = "aligned", grad: bool = True) -> ProgramsResult:
        """Run per-instance programs that read computed values, all instances batched.

        Each program is a generator (one per data instance, each its own instance) that
        records nodes as usual and yields a handle (or a list of handles of one shape) whose
        value it needs; the yield evaluates to the value (detached, shape ``handle.shape``,
        or ``[k, *shape]``). Every program is advanced to its next yield, then everything
        recorded and not run yet runs as one graph (scheduled with ``scheduler``, planned
        with ``strategy``), the values are handed back and all resume: one synchronisation
        per round of reads, so as many as the longest chain of reads of any instance. Then
        the rest runs and a new mini-batch starts. See :mod:`edbatch.api._programs`.

        Returns:
            A :class:`~edbatch.api._programs.ProgramsResult`: the loss over every segment
            (one ``backward()`` reaches every parameter), the programs' return values,
            ``syncs``, the segments run, and any node's value (``result[handle]``,
            ``result.stack(handles)``).

        Python's cyclic garbage collector is paused while they run (resumed after, also on
        errors): recorded objects die by refcount; collections cost ~5% of a MoE step.

        Raises:
            GraphError: nodes were already recorded, a program yielded something other
                than handles of this mini-batch.
        """
        return run_programs(self, programs, as_scheduler(scheduler, self._kept), strategy,
                            grad)  # (which starts a new mini-batch, also on errors)

    def discard(self) -> None:
        """Drop the recorded mini-batch without running it and start a new one; its handles
        become stale (e.g. after :meth:`graph` collected it for policy training)."""
        self._clear()

    # ------------------------------------------------------------------ running
    def graph(self, outputs: Sequence[Handle] = ()) -> tuple[Graph, int | None]:
        """Build the mini-batch graph; return it and its loss-sum node (``None`` if none).

        The graph's outputs are the loss sum (an unbatchable ``loss_sum`` over every
        :meth:`add_loss` term, if any), then ``outputs``.
        """
        return assemble_graph(self._vocab_for(bool(self._rec.losses)), self._rec,
                              output_handles(outputs, self._check_handle))

    def _vocab_for(self, losses: bool) -> Vocab:
        """The registered op types (and ``loss_sum`` if ``losses``) as a vocabulary."""
        key = (len(self._ops), losses)  # op types are only ever added
        vocab = self._vocabs.get(key)
        if vocab is None:
            ops = list(self._ops)
            if losses:
                ops.append(OpType("loss_sum", "sum", None, (1,), batchable=False))
            vocab = self._vocabs[key] = Vocab(ops)
        return vocab

    def run(self, scheduler: SchedulerLike = "typewise_greedy", *,
            outputs: Sequence[Handle] = (), strategy: Strategy = "aligned",
            grad: bool = True, params: Mapping[str, Tensor] | None = None,
            hoist: bool | None = None) -> BatchResult:
        """Schedule, plan and execute the recorded mini-batch, then start a new one.

        Args:
            scheduler: a registered scheduler name (see :data:`edbatch.schedule.SCHEDULERS`),
                a :class:`~edbatch.schedule.Policy`, a scheduler ``graph -> Schedule``, or
                ``"auto"`` / an :class:`AutoScheduler` (times the candidates on the first
                mini-batches and keeps the fastest; it picks the memory strategy too).
            outputs: handles whose values the result should hold.
            strategy: memory planning strategy: ``"aligned"`` (default; vectorised, about
                a millisecond per mini-batch), ``"naive"`` or ``"planned"`` (the chain
                planner, most views, but 70-200 ms of Python per fresh 64-instance
                mini-batch: for plans reused across repeated shapes).
            grad: build the autograd graph (training); ``False`` runs in place, no grad.
            hoist: input-projection hoisting for the built-in LSTM cells (``lstm_step``
                kinds): their input half ``W_x x + b`` for many batches in one GEMM, as a
                packed ``nn.LSTM`` does (same values up to float summation order; see
                ``TorchExecutor``'s ``hoist``). ``None`` (default): on; ``False``: off.

        Returns:
            The :class:`BatchResult` (loss, requested values, graph, schedule, stats).

        Raises:
            UnknownNameError: an unknown scheduler name (with a did-you-mean hint).
            GraphError: nothing was recorded, or a handle is not of this mini-batch.
        """
        make = as_scheduler(scheduler, self._kept)
        if not self._rec.ops:
            raise GraphError("DynamicBatch.run: the mini-batch is empty; call cells (inside "
                             "batch.instance()) before run()")
        graph, loss_node = self.graph(outputs)
        schedule = make(graph)
        plan = plan_memory(graph, schedule, memory_strategy(make, strategy))
        params = {**self.params, **check_params(params, graph.vocab, self.params, self.dtype), **{
            f"api.{n}": (r[0] if len(r) == 1 else torch.cat(r)).to(self.device, self.dtype)
            for n, r in self._rec.rows.items()}}
        executor = TorchExecutor(self.device, self.dtype, kernels=self.kernels, hoist=hoist)
        try:
            result = executor.run(graph, schedule, plan, params, grad=grad)
        except ExecutionError as e:
            hint = dtype_hint(self._cells.values(), self.dtype)
            if not hint:
                raise
            raise ExecutionError(f"{e}.{hint}") from e
        result.stats.update(plan.stats())
        loss = None if loss_node is None else result.outputs[loss_node].reshape(())
        out = BatchResult(loss, graph, schedule, result, self, self._generation)
        self._clear()
        return out
