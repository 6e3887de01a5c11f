"""The batched executor: one kernel call per batch, operands read as planned.

:class:`TorchExecutor` runs a :class:`~edbatch.schedule.Schedule` on a
:class:`~edbatch.graph.Graph` with a :class:`~edbatch.memory.MemoryPlan`. Per (graph, plan)
it compiles (and caches) a program: per batch its kernel, its ``int64`` attrs in row order,
and how to read every operand slot.

Three modes:

* **Inference** (``grad=False``): runs under :func:`torch.no_grad`. One arena tensor per
  plan arena is allocated up front; each batch's output is written in place into its
  region, and operands are read as arena slices (the plan's views, which may span several
  batches' regions) or with ``index_select`` (the plan's gathers).
* **Training with hand-written backwards** (``grad=True``, the default whenever every kernel
  of the program has one: the Tree-LSTM and LSTM-family cell workloads): the forward is the
  inference run plus the tensors each kernel's backward reads, and one autograd function
  (:class:`~edbatch.executor._analytic.AnalyticRun`) runs the kernels' backwards in reverse
  schedule order over gradient arenas of the same layout, with weight gradients batched
  across batches (``sparse_grads=True`` gives embedding tables sparse row gradients).
* **Training with autograd** (``grad=True`` otherwise, or ``hand_backward=False``): writes
  into a shared arena would bump the version of a tensor autograd saved, so each batch keeps
  its own output tensor. A view inside one producer batch's region is a slice of its output
  (zero-copy); any other read is assembled with ``torch.cat`` of slices or ``index_select``
  per producer batch. With the registered kernels (parameters only from ``params``) the run
  is one :class:`~edbatch.executor._train.BatchedRun` autograd function: each batch records
  its own small graph on detached operands, its backward routes operand gradients into
  per-batch gradient buffers. Custom ``kernels`` (parameters of their own): plain autograd.

Both modes count zero-copy reads and gathers in :attr:`RunResult.stats` (``exec/num_views``,
``exec/num_gathers``, ``exec/gathered_rows``). Inference runs hoisted LSTM batches (a run as
one compiled call), Tree-LSTM batches, k-ary sums and the BiLSTM loss's input through short
paths (``_fast_*``).

On CUDA, the index tensors (the attrs of all batches as one flat tensor, gather rows) are
compiled once per (graph, plan) and copied from pinned host memory without blocking, and the
run is timed with CUDA events. With ``cuda_graphs=True``, runs whose shape (graph structure,
schedule, strategy) repeats are captured once as CUDA graphs and replayed, for graphs of that
shape whatever their ``attrs`` (:mod:`~edbatch.executor._capture`): inference runs as one
graph, training runs (registered kernels, dense gradients) as a forward and a backward graph.

Example:
    >>> import torch
    >>> from edbatch.workloads.tree_gru import TreeGRU
    >>> from edbatch.executor import init_params, reference_loss
    >>> wl = TreeGRU(embed_dim=4, hidden_dim=4)
    >>> g = wl.minibatch("dev", [0, 1])
    >>> params = init_params(wl, torch.Generator().manual_seed(0))
    >>> res = execute(g, params=params)
    >>> bool(torch.allclose(res.loss, reference_loss(g, params), atol=1e-5))
    True
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from edbatch.errors import ConfigError, ExecutionError
from edbatch.executor import _fast_chain, _fused
from edbatch.executor._analytic import AnalyticRun, analytic
from edbatch.executor._capture import Captured, CapturedTraining, GraphCache
from edbatch.executor._chain_train import train_chains
from edbatch.executor._fast_chain import chain_short
from edbatch.executor._fast_lstm import fast_steps
from edbatch.executor._fast_pair import pair_short
from edbatch.executor._fast_sum import sum_short
from edbatch.executor._fast_tree import tree_program, tree_short
from edbatch.executor._head_reads import head_reads
from edbatch.executor._hoist import compile_hoisted, hoist_kinds, unhoisted
from edbatch.executor._program import Program, Step, check_matching, compile_program
from edbatch.executor._result import RunResult
from edbatch.executor._timer import Timer, timed
from edbatch.executor._train import BatchedRun, run_training
from edbatch.executor._weights import TRANSPOSED
from edbatch.executor.device import check_device, check_dtype
from edbatch.executor.kernels import Kernel, stacked_sum
from edbatch.graph import Graph
from edbatch.memory.plan import MemoryPlan
from edbatch.memory.planner import Strategy, plan_memory
from edbatch.schedule.schedule import Schedule

__all__ = ["RunResult", "TorchExecutor", "execute", "short_paths"]


class TorchExecutor:
    """Runs scheduled, memory-planned graphs with one kernel call per batch.

    Args:
        device: where arenas and per-batch tensors live (parameters must be there too; they
            are moved if not).
        dtype: arena dtype.
        kernels: op kind -> kernel, overriding the registered kernels for those kinds; the
            other kinds use :func:`~edbatch.executor.kernels.kernel_for`.
        cache_size: compiled programs kept (keyed by the graph and plan objects).
        profile: also time every operand read (gathers, concatenations and views) and
            kernel call separately, into ``exec/read_seconds``, ``exec/gather_seconds``
            and ``exec/kernel_seconds`` (synchronising CUDA around each); slower, for
            breakdowns only.
        hand_backward: in training, use the kernels' hand-written backwards when every
            kernel of the program has one (:mod:`~edbatch.executor._analytic`); ``False``
            always records per-batch autograd graphs (``BatchedRun``).
        sparse_grads: with hand-written backwards, give embedding tables sparse COO
            gradients holding only the rows read (as DyNet updates lookup parameters;
            SGD takes them, Adam does not); otherwise gradients are dense.
        cuda_graphs: on CUDA, capture the run of a shape seen before as CUDA graphs and
            replay them for later graphs of that shape (``exec/cuda_graph`` is 1 in a
            replayed run's stats), inference and training (not with custom ``kernels`` or
            ``sparse_grads`` in training); parameters must live on the device (moved
            parameters are new tensors every run, so those runs stay eager). A replayed
            training run's outputs are overwritten, and its backward invalid, once the next
            run of its shape starts (back-propagate each run first). No effect on CPU.
        capture_after: with ``cuda_graphs``, capture a shape on its ``capture_after``-th
            repetition (0: on its first run).
        hoist: input-projection hoisting (:mod:`~edbatch.executor._hoist`) for every LSTM
            cell kind with a hoisted form (``True``) or those op kinds: ``W_x x + b`` of many
            batches as one GEMM, each batch adds ``W_h h`` (equal up to summation order).
            Inference and hand-written-backward training; not with ``cuda_graphs`` on CUDA.
            ``None`` (default): ``True``, except with ``cuda_graphs`` on CUDA; ``False``:
            per-batch cells.
        fused: the LSTM-family cells' element-wise parts as one compiled kernel per batch
            (:mod:`~edbatch.executor._fused`, outside autograd; CUDA: TorchInductor's, opt-in by
            ``EDBATCH_COMPILED_CELLS=cuda``); ``None``: the process setting (on by default);
            ``False``: the unfused torch path.

    Raises:
        ConfigError: ``hoist`` with ``cuda_graphs`` on CUDA, or a ``hoist`` of another type.
        UnknownNameError: a ``hoist`` kind that has no hoisted form.
    """

    def __init__(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 *, kernels: Mapping[str, Kernel] | None = None, cache_size: int = 8,
                 profile: bool = False, hand_backward: bool = True,
                 sparse_grads: bool = False, cuda_graphs: bool = False,
                 capture_after: int = 1, hoist: bool | str | Iterable[str] | None = None,
                 fused: bool | None = None) -> None:
        self.device = check_device(device)
        dtype = check_dtype(dtype)
        if self.device.type == "cuda" and self.device.index is None and \
                torch.cuda.is_available():  # "cuda" means the current device: name it
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.hand_backward, self.sparse_grads = hand_backward, sparse_grads
        self.profile = profile
        self._timer = Timer(self.device) if profile else None
        self.graphs = GraphCache(capture_after) if cuda_graphs and \
            self.device.type == "cuda" else None
        self.hoist = hoist_kinds(self.graphs is None if hoist is None else hoist)
        if self.hoist and self.graphs is not None:
            raise ConfigError("hoist", hoist, "False with cuda_graphs=True on CUDA (captured "
                              "graphs run the unhoisted program)", "pass one of the two")
        self.dtype, self.fused = dtype, fused
        self.kernels = kernels
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[int, int], tuple[Graph, MemoryPlan, Program]] = \
            OrderedDict()

    def __repr__(self) -> str:
        return f"TorchExecutor(device={str(self.device)!r}, dtype={self.dtype})"

    # ---------------------------------------------------------------- public API
    def run(self, graph: Graph, schedule: Schedule, plan: MemoryPlan,
            params: Mapping[str, Tensor], *, grad: bool = False) -> RunResult:
        """Run ``schedule`` on ``graph`` with ``plan``; see the module docstring for modes.

        Args:
            graph: the graph.
            schedule: the schedule the plan was made for.
            plan: ``plan_memory(graph, schedule, ...)``.
            params: parameter name -> tensor.
            grad: build the autograd graph (training) instead of running in place.

        Returns:
            The :class:`RunResult`.

        Raises:
            ExecutionError: a kernel raised or returned a wrongly shaped value; the message
                names the batch index, op type and batch size.
            ScheduleError: the plan does not match the schedule, or is of a graph with
                another number of nodes.
        """
        check_matching(graph, schedule, plan)
        start = time.perf_counter()
        on_device = self._on_device(params)
        key = captured = None
        if self.graphs is not None and self._timer is None and \
                (not grad or (self.kernels is None and not self.sparse_grads)):
            key = self.graphs.key(graph, schedule, plan) + (b"/train" if grad else b"")
            captured = self.graphs.lookup(key, on_device)
        if captured is None:
            program, compiled = self._program(graph, schedule, plan)
        else:
            program, compiled = captured.program, False
        compile_s = time.perf_counter() - start
        function = self._training_function(program) if grad else None
        if function is not AnalyticRun and grad:  # the autograd paths run the per-batch
            program = unhoisted(program)  # cells; their training reads compiled untimed
            program.grad_steps()
        if self._timer is not None:
            self._timer.reset()
        outputs, seconds = timed(self.device, lambda: self._dispatch(
            graph, program, on_device, grad=grad, function=function, captured=captured))
        capture_s = 0.0
        if key is not None and captured is None and on_device is params and \
                self.graphs is not None and self.graphs.due(key):
            t0 = time.perf_counter()
            self._capture(key, graph, schedule, plan, params, grad)
            capture_s = time.perf_counter() - t0
        views, gathers, rows = program.counts[grad and function is not AnalyticRun]
        value = next(iter(outputs.values())) if len(outputs) == 1 else None
        loss = value.reshape(()) if value is not None and value.numel() == 1 else None
        stats = {"exec/num_views": float(views), "exec/num_gathers": float(gathers),
                 "exec/gathered_rows": float(rows), "exec/num_kernel_calls":
                 float(len(program.steps)), "exec/seconds": seconds, "exec/compile_seconds":
                 compile_s if compiled else 0.0, "exec/cuda_graph": float(captured is not None),
                 "exec/capture_seconds": capture_s, "exec/hoisted_projections":
                 float(getattr(program, "num_projections", 0))}
        if self._timer is not None:
            stats.update(self._timer.stats())
        return RunResult(outputs, loss, len(program.steps), stats, seconds)

    # ---------------------------------------------------------------- running
    def _training_function(self, program: Program) -> type[torch.autograd.Function] | None:
        """The autograd function a training run of ``program`` goes through: the
        hand-written backwards where every kernel has one, else ``BatchedRun``; ``None``
        with custom kernels (plain autograd, :meth:`_run_grad`)."""
        if self.kernels is not None:
            return None
        return AnalyticRun if self.hand_backward and analytic(program) else BatchedRun

    def _capture(self, key: bytes, graph: Graph, schedule: Schedule, plan: MemoryPlan,
                 params: Mapping[str, Tensor], grad: bool) -> None:
        """Capture this run's shape as a CUDA graph (a program compiled for it alone)."""
        assert self.graphs is not None
        if grad and not any(p.requires_grad for p in params.values()):
            return  # nothing to differentiate: the eager run is all there is to it
        program = compile_program(graph, schedule, plan, self.device, self.kernels)
        if not grad:
            self.graphs.capture(key, program, self._run_inplace, params)
            return
        names = tuple(params)
        function = self._training_function(program)
        assert function is not None  # custom kernels are never captured in training
        if function is BatchedRun:
            program.grad_steps()

        def fn(*values: Tensor) -> Any:
            return function.apply(self, program, names, *values)

        self.graphs.capture_training(key, program, fn, params)

    def _dispatch(self, graph: Graph, program: Program, params: Mapping[str, Tensor], *,
                  grad: bool, function: type[torch.autograd.Function] | None,
                  captured: Captured | CapturedTraining | None) -> dict[int, Tensor]:
        """The run proper, in the mode chosen (see the module docstring)."""
        if isinstance(captured, CapturedTraining):
            rows = captured.replay(graph, tuple(params.values()))
            return {v: t for (v, _, _, _), t in zip(program.outputs, rows, strict=True)}
        if function is not None:
            return run_training(self, program, params, function)
        if grad:
            return self._run_grad(program, params)
        if captured is not None:
            arenas = captured.replay(graph)
        else:
            with torch.no_grad():
                arenas = self._run_inplace(program, params)
        return {v: arenas[a][r:r + 1].clone() for v, a, r, _ in program.outputs}

    def _on_device(self, params: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        if all(p.device == self.device for p in params.values()):
            return params
        return {name: p.to(self.device, non_blocking=True) for name, p in params.items()}

    def _call(self, i: int, step: Step, sources: Sequence[Tensor],
              params: Mapping[str, Tensor], out: Tensor | None = None,
              save: list[Tensor] | None = None) -> Tensor:
        timer = self._timer
        if timer is None:
            return self._apply(i, step, [r(sources) for r in step.reads], params, out, save)
        operands = timer.reads(step, sources)
        return timer.kernel(self._apply, i, step, operands, params, out, save)

    def _apply(self, i: int, step: Step, operands: list[Tensor],
               params: Mapping[str, Tensor], out: Tensor | None,
               save: list[Tensor] | None = None) -> Tensor:
        """Run batch ``i`` on its read operands (a variadic node's single merged read is
        reduced directly if it is a sum, else split into its ``[1, d]`` rows)."""
        if step.split:
            if step.stacked:
                total = stacked_sum(operands[0])
                return total if out is None else out.copy_(total)
            operands = list(operands[0].split(1))
        return self._kernel(i, step, operands, params, out, save)

    def _kernel(self, i: int, step: Step, inputs: list[Tensor],
                params: Mapping[str, Tensor], out: Tensor | None,
                save: list[Tensor] | None = None) -> Tensor:
        try:
            if out is not None:  # only kernels that write out take ``out``
                out = step.kernel(step.op, inputs, params, step.attrs, out=out) \
                    if save is None else \
                    step.kernel(step.op, inputs, params, step.attrs, out=out, save=save)
            else:
                out = step.kernel(step.op, inputs, params, step.attrs) if save is None \
                    else step.kernel(step.op, inputs, params, step.attrs, save=save)
        except Exception as e:
            raise ExecutionError(
                f"batch {i} (op type {step.op.name!r}, kind {step.op.kind!r}, {step.size} "
                f"nodes) failed: {type(e).__name__}: {e}") from e
        if tuple(out.shape) != (step.size, step.width):
            raise ExecutionError(
                f"batch {i} (op type {step.op.name!r}, {step.size} nodes): kernel "
                f"{step.op.kind!r} returned shape {tuple(out.shape)}, expected "
                f"({step.size}, {step.width}); fix the kernel")
        return out

    def _run_inplace(self, program: Program, params: Mapping[str, Tensor],
                     saves: list[list[Tensor]] | None = None) -> list[Tensor]:
        """Run every batch into freshly allocated arenas and return them; with ``saves``,
        also collect per batch what its kernel's hand-written backward reads."""
        arenas = [torch.empty((rows, width), device=self.device, dtype=self.dtype)
                  for rows, width in program.arenas]
        fast = self._timer is None
        with TRANSPOSED.run(), _fused.use(self.fused):  # W^T made once for the whole run
            # short paths: in inference the hoisted LSTM and Tree-LSTM batches of a qualifying
            # run, in training (``saves``) its hoisted LSTM chains
            short, bound, views = train_chains(program, params, arenas, saves) \
                if fast and saves is not None else \
                fast_steps(program, params, arenas, fast, _fast_chain.ENABLED[0])
            steps = program.steps  # (a hoisted program's deferred steps: built if read)
            for i, entry in enumerate(short):
                if entry is not None:
                    entry(arenas, views, bound)
                    continue
                step = steps[i]
                region = arenas[step.out_arena].narrow(0, step.out_start, step.size)
                save: list[Tensor] | None = None
                if saves is not None:
                    save = []
                    saves.append(save)
                if fast and step.writes_out and not step.split:  # the common case, inlined
                    self._kernel(i, step, [read(arenas) for read in step.reads], params,
                                 region, save)
                elif step.writes_out:
                    self._call(i, step, arenas, params, region, save)
                else:
                    region.copy_(self._call(i, step, arenas, params, None, save))
        return arenas

    def _run_grad(self, program: Program, params: Mapping[str, Tensor]
                  ) -> dict[int, Tensor]:
        """Training with plain autograd over the whole run: custom kernels may hold
        parameters of their own (e.g. the modules of :class:`~edbatch.api.DynamicBatch`),
        which :class:`~edbatch.executor._train.BatchedRun` would not see."""
        outs: list[Tensor] = []
        for i, step in enumerate(program.grad_steps()):
            outs.append(self._call(i, step, outs, params))
        return {v: outs[b][r:r + 1]
                for (v, _, _, r), b in zip(program.outputs, program.output_batch, strict=True)}

    # ---------------------------------------------------------------- compiling
    def _program(self, graph: Graph, schedule: Schedule, plan: MemoryPlan
                 ) -> tuple[Program, bool]:
        key = (id(graph), id(plan))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is graph and hit[1] is plan:
            self._cache.move_to_end(key)
            return hit[2], False
        program = tree_program(graph, schedule, plan, self.device, self.kernels, self.hoist)
        if program is None:  # not a Tree-LSTM program on the CPU: the general compile
            program = compile_hoisted(graph, schedule, plan, self.device, self.kernels,
                                      self.hoist, self.kernels)
        program = short_paths(head_reads(program), self.device)  # h-only gathers; short paths
        self._cache[key] = (graph, plan, program)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return program, True


def short_paths(program: Program, device: torch.device) -> Program:
    """``program`` with its inference short paths (CPU; ``program.short`` and
    ``program.chained``): Tree-LSTM batches, k-ary sums (lattice states, no gathers), the
    BiLSTM loss's ``[h; h']`` in one gather, then runs of hoisted LSTM batches (sums between
    them included) as one compiled call each."""
    program = tree_short(program, device)
    program = sum_short(program, device)
    program = pair_short(program, device)
    return chain_short(program, device)


def execute(graph: Graph, schedule: Schedule | None = None, *, params: Mapping[str, Tensor],
            strategy: Strategy = "planned", grad: bool = False,
            device: str | torch.device = "cpu") -> RunResult:
    """Schedule (``None``: the ``ed_batch_agenda`` scheduler), plan with ``strategy`` and run
    ``graph`` on ``device`` with ``params`` (name -> tensor) in one call; ``grad``: training
    mode (build the autograd graph). Returns the :class:`RunResult`, its stats also holding
    the plan's ``memory/`` metrics."""
    if schedule is None:
        from edbatch.schedule.zoo import make_scheduler

        schedule = make_scheduler("ed_batch_agenda")(graph)
    plan = plan_memory(graph, schedule, strategy)
    dtype = next((p.dtype for p in params.values()), torch.float32)
    result = TorchExecutor(device, dtype).run(graph, schedule, plan, params, grad=grad)
    result.stats.update(plan.stats())
    return result
