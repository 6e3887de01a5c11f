"""A measured cost model: milliseconds per kernel launch of each op type at each batch size.

:func:`calibrate` times the executor's real kernel of every op type of a workload on a grid of
batch sizes (medians of a few repetitions, on the current device, forward or forward plus
backward) and fits each op type; :class:`CostModel` answers ``model(op, n)`` in milliseconds
and sums a schedule (:meth:`CostModel.schedule_ms`). The envs' ``cost_model`` reward and
``experiments.evaluate``'s ``modelled_ms`` column use it; :func:`measure_schedule_ms` runs a
schedule with the batched executor for the measured counterpart.

The fit per op type is piecewise linear through the medians, made non-decreasing in the batch
size by isotonic regression (:func:`isotonic`: timing noise must not make a larger batch look
cheaper, and one noisy point is averaged with its neighbours rather than carried to every
larger size), with the least-squares slope of ``a + b n`` beyond the largest size timed.
``launch_ms``, the executor's own cost per batch outside the kernel (operand reads, Python
dispatch), is fitted from one executed schedule of a real graph and added to every batch, so
``model(op, n) = launch_ms + kernel(op, n)``.

Files are JSON (:meth:`CostModel.save`, :func:`load_cost_model`) with the device, torch
version, dtype, workload sizes and date; a missing, corrupt or mismatched file raises
:class:`CostModelFileError` naming the file and the command that makes a new one.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.errors import EdbatchError, UnknownNameError
from edbatch.executor.device import check_device, check_dtype
from edbatch.executor.kernels import kernel_for
from edbatch.executor.params import init_params
from edbatch.graph import Graph, OpType, Vocab
from edbatch.schedule.schedule import Schedule

__all__ = ["BATCH_SIZES", "FORMAT", "CostModel", "CostModelFileError",
           "OpCost", "STATS", "calibrate", "isotonic", "load_cost_model", "measure_schedule_ms"]

#: The ``format`` field of a cost-model file.
FORMAT = "edbatch-cost-model"
SCHEMA_VERSION = 1
#: Default batch-size grid: powers of two up to 256.
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FIX = "calibrate one: python -m experiments.calibrate workload=<name> granularity=<g>"


class CostModelFileError(EdbatchError, ValueError):
    """A cost-model file is missing, corrupt, or does not match the workload or device."""

    def __init__(self, path: str | Path, problem: str, fix: str = _FIX) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {problem}. Fix: {fix}")


@dataclass
class OpCost:
    """The timings of one op type: median milliseconds per batch size, and the line fit."""

    kind: str
    sizes: list[int]
    ms: list[float]
    intercept_ms: float = 0.0
    slope_ms: float = 0.0

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.ms) or not self.sizes:
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.ms)} timings")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError(f"batch sizes must increase, got {self.sizes}")
        if not all(math.isfinite(v) and v >= 0 for v in self.ms):
            raise ValueError(f"timings must be finite and >= 0, got {self.ms}")
        x, y = np.asarray(self.sizes, float), np.asarray(self.ms, float)
        if len(x) > 1:
            self.slope_ms, self.intercept_ms = (float(v) for v in np.polyfit(x, y, 1))
        else:
            self.slope_ms, self.intercept_ms = 0.0, float(y[0])
        self._mono = isotonic(y)  # non-decreasing in n

    def __call__(self, n: int) -> float:
        """Milliseconds of one launch over ``n`` nodes (piecewise linear, non-decreasing)."""
        x = self.sizes
        if n <= x[-1]:
            return float(np.interp(n, x, self._mono))
        return float(self._mono[-1] + max(self.slope_ms, 0.0) * (n - x[-1]))


@dataclass
class CostModel:
    """Per op type milliseconds of one kernel launch over ``n`` nodes, plus ``launch_ms``.

    ``model(op, n)`` takes an :class:`~edbatch.graph.OpType` or an op name (what the env's
    ``cost_model`` hook is called with). Example:

        >>> m = CostModel({"add/4": OpCost("add", [1, 4], [0.01, 0.02])}, launch_ms=0.005)
        >>> round(m("add/4", 2), 4), round(m("add/4", 8), 4)
        (0.0183, 0.0383)
    """

    ops: dict[str, OpCost]
    launch_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def __call__(self, op: OpType | str, n: int) -> float:
        name = op if isinstance(op, str) else op.name
        cost = self.ops.get(name)
        if cost is None:
            raise UnknownNameError(f"the cost model has no op type {name!r} (it was calibrated "
                                   f"for {self.meta.get('workload', '?')!r}, "
                                   f"{len(self.ops)} op types); {_FIX}")
        return self.launch_ms + cost(int(n))

    def schedule_ms(self, schedule: Schedule, vocab: Vocab) -> float:
        """Modelled milliseconds of ``schedule``: the model summed over its batches."""
        return float(sum(self(vocab[b.op_id], len(b)) for b in schedule.batches))

    def check_vocab(self, vocab: Vocab, path: str | Path = "<cost model>") -> None:
        """Raise :class:`CostModelFileError` unless every op type of ``vocab`` is modelled."""
        missing = [n for n in vocab.names if n not in self.ops]
        if missing:
            raise CostModelFileError(
                path, f"calibrated for workload {self.meta.get('workload', '?')!r} "
                f"({self.meta.get('granularity', '?')}), which lacks op types {missing[:4]}"
                f"{' ...' if len(missing) > 4 else ''} of this workload")

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        ops = {k: {f: getattr(v, f) for f in ("kind", "sizes", "ms", "intercept_ms",
                                               "slope_ms")} for k, v in self.ops.items()}
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, **self.meta,
                "launch_ms": self.launch_ms, "ops": ops}

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON (creating parent folders); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return path


def load_cost_model(path: str | Path, vocab: Vocab | None = None, *,
                    device: str | torch.device | None = None) -> CostModel:
    """Read a cost-model file; with ``vocab``, check it models every op type; with
    ``device``, check it was calibrated on that device type (``cpu`` / ``cuda``).

    Raises:
        CostModelFileError: missing, corrupt, another format or version, or a mismatch.
    """
    path = Path(path)
    if not path.is_file():
        raise CostModelFileError(path, "no such cost-model file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CostModelFileError(path, f"not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CostModelFileError(path, f"not an edbatch cost model (format field is {found!r}"
                                       f", expected {FORMAT!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise CostModelFileError(path, f"schema version {data.get('schema_version')!r}, this "
                                       f"edbatch reads {SCHEMA_VERSION}")
    try:
        ops = {str(k): OpCost(str(v["kind"]), [int(s) for s in v["sizes"]],
                              [float(t) for t in v["ms"]]) for k, v in data["ops"].items()}
        launch = float(data.get("launch_ms", 0.0))
        if not math.isfinite(launch) or launch < 0:
            raise ValueError(f"launch_ms {launch} must be finite and >= 0")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CostModelFileError(path, f"malformed field ({type(e).__name__}: {e})") from None
    meta = {k: v for k, v in data.items()
            if k not in ("format", "schema_version", "ops", "launch_ms")}
    model = CostModel(ops, launch, meta)
    if vocab is not None:
        model.check_vocab(vocab, path)
    if device is not None:
        want = check_device(device).type
        got = str(meta.get("device", "?")).split(":")[0]
        if got != want:
            raise CostModelFileError(path, f"calibrated on device {meta.get('device')!r}, "
                                           f"but this run uses {want!r}",
                                     _FIX + f" device={want}")
    return model


def isotonic(y: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in squared error (pool adjacent
    violators): each run of decreasing values is replaced by its mean.

        >>> isotonic([1.0, 3.0, 2.0, 4.0]).tolist()
        [1.0, 2.5, 2.5, 4.0]
    """
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.repeat([b[0] for b in blocks], [int(b[1]) for b in blocks])


# ---------------------------------------------------------------------- calibration
def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


#: How the repetitions of one timing are reduced: ``median`` (the default) or ``min`` (robust
#: to other processes on a loaded machine: contention only ever adds time).
STATS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}


def _stat(stat: str) -> Callable[[list[float]], float]:
    if stat not in STATS:
        raise UnknownNameError(f"unknown timing statistic {stat!r}; choose one of "
                               f"{list(STATS)}")
    return STATS[stat]


def _time_ms(fn: Callable[[], Any], reps: int, sync: Callable[[], None], stat: str) -> float:
    fn()  # warm-up (allocations, lazy initialisation)
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * _stat(stat)(times)


def _op_attrs(graphs: Sequence[Graph], vocab: Vocab) -> dict[int, np.ndarray]:
    """Real attrs (token ids, labels) of every op type, from sample graphs."""
    out: dict[int, list[np.ndarray]] = {}
    for g in graphs:
        for op_id in np.unique(g.op_ids):
            out.setdefault(int(op_id), []).append(g.attrs[g.op_ids == op_id])
    return {k: np.concatenate(v) for k, v in out.items()}


def _time_op(op: OpType, n: int, params: Mapping[str, Tensor], attrs: np.ndarray,
             device: torch.device, dtype: torch.dtype, reps: int, backward: bool,
             gen: torch.Generator, stat: str) -> float:
    kernel = kernel_for(op)
    shapes = [op.out_shape] * n if op.in_shapes is None else list(op.in_shapes)
    rows = 1 if op.in_shapes is None else n
    inputs = [torch.randn(rows, math.prod(s), generator=gen).to(device, dtype)
              for s in shapes]
    a = torch.as_tensor(np.resize(attrs if attrs.size else np.zeros(1, np.int64), rows),
                        dtype=torch.int64, device=device)
    if not backward:
        def run() -> Any:
            with torch.no_grad():
                return kernel(op, inputs, params, a)
    else:
        for x in inputs:
            x.requires_grad_(True)

        def run() -> Any:
            out = kernel(op, inputs, params, a)
            if out.requires_grad:
                out.sum().backward()
            return out
    return _time_ms(run, reps, _sync(device), stat)


def calibrate(workload: Any, *, batch_sizes: Sequence[int] = BATCH_SIZES, reps: int = 5,
              device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32,
              backward: bool = False, graphs: Sequence[Graph] = (), launch_reps: int = 3,
              seed: int = 0, stat: str = "median") -> CostModel:
    """Time every op type of ``workload`` at each batch size and fit a :class:`CostModel`.

    Args:
        workload: a :class:`~edbatch.workloads.Workload` (its ``vocab`` and parameters).
        batch_sizes: increasing batch sizes to time (a variadic op gets ``n`` operands).
        reps: repetitions per (op type, size); the median is kept (after one warm-up).
        device, dtype: where and in what precision the kernels run.
        backward: time forward plus backward (autograd) instead of forward only.
        graphs: sample graphs of the workload: their attrs feed lookups and losses, and the
            first is executed to fit ``launch_ms``; none: attrs 0 and ``launch_ms`` 0.
        launch_reps: executor runs of ``graphs[0]`` for ``launch_ms`` (median).
        seed: seeds the parameters and the random operands.
        stat: ``median`` or ``min`` of the repetitions (:data:`STATS`).
    """
    _stat(stat)
    sizes = sorted({int(n) for n in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive ints, got {list(batch_sizes)}")
    dev, dt = check_device(device), check_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    params = {k: v.detach().requires_grad_(backward)
              for k, v in init_params(workload, gen, device=dev, dtype=dt).items()}
    vocab: Vocab = workload.vocab
    attrs = _op_attrs(graphs, vocab)
    t0 = time.perf_counter()
    ops = {}
    for op_id, op in enumerate(vocab):
        ms = [_time_op(op, n, params, attrs.get(op_id, np.zeros(0, np.int64)), dev, dt, reps,
                       backward, gen, stat) for n in sizes]
        ops[op.name] = OpCost(op.kind, sizes, ms)
    model = CostModel(ops, 0.0, {
        "workload": getattr(workload, "name", type(workload).__name__),
        "granularity": getattr(workload, "granularity", None),
        "sizes": _workload_sizes(workload), "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch_version": torch.__version__, "dtype": str(dt).removeprefix("torch."),
        "mode": "forward_backward" if backward else "forward", "reps": reps, "stat": stat,
        "num_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "calibration_seconds": 0.0})
    if graphs and not backward:
        from edbatch.schedule import make_scheduler

        g = graphs[0]
        sched = make_scheduler("typewise_greedy")(g)
        measured = measure_schedule_ms(g, sched, params, reps=launch_reps, device=dev, dtype=dt,
                                       stat=stat)
        model.launch_ms = max(0.0, (measured - model.schedule_ms(sched, vocab))
                              / sched.num_batches)
        model.meta["launch_fit"] = {"nodes": g.num_nodes, "batches": sched.num_batches,
                                    "measured_ms": measured}
    model.meta["calibration_seconds"] = round(time.perf_counter() - t0, 3)
    return model


def _workload_sizes(workload: Any) -> dict[str, Any]:
    """The workload's scalar size attributes (``embed_dim``, ``hidden_dim``...)."""
    return {k: v for k, v in sorted(vars(workload).items())
            if k.endswith(("_dim", "_size")) and isinstance(v, (int, float))}


def measure_schedule_ms(graph: Graph, schedule: Schedule, params: Mapping[str, Tensor], *,
                        reps: int = 3, device: str | torch.device = "cpu",
                        dtype: torch.dtype | str = torch.float32,
                        strategy: str = "planned", stat: str = "median",
                        hoist: bool = False) -> float:
    """Milliseconds of running ``schedule`` on ``graph`` with the batched executor, the
    median (or ``stat``) of ``reps`` runs (inference; memory planned once, the program
    compiled on a warm-up run that is not counted). One kernel per batch (``hoist=False``,
    unlike the executor's default): what the per-(op type, batch size) model describes."""
    from edbatch.executor.torch_executor import TorchExecutor
    from edbatch.memory.planner import plan_memory

    executor = TorchExecutor(device, check_dtype(dtype), hoist=hoist)
    plan = plan_memory(graph, schedule, strategy)  # type: ignore[arg-type]
    executor.run(graph, schedule, plan, params)  # compile + warm-up
    reduce = _stat(stat)
    return 1e3 * reduce([executor.run(graph, schedule, plan, params).seconds
                         for _ in range(max(1, reps))])
