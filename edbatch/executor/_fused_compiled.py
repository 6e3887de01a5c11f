"""Fused cell bodies for CUDA tensors: each element-wise part as one TorchInductor kernel.

On the CPU the LSTM-family cells' element-wise parts run as numba loops
(:mod:`~edbatch.executor._fused`); numba cannot reach device memory, and the unfused torch
path launches about nine kernels per batch there (each a few microseconds of host time).
Here the same arithmetic is written once in torch (each function below mirrors one numba
kernel and its calling convention: ``g`` and the forget pre-activations become their
activations in place, ``out`` receives ``[h; c]``, ``t`` receives ``tanh(c)``; the
backwards write into the given gradient buffers) and compiled by ``torch.compile``
(TorchInductor: Triton on CUDA, C++ on the CPU) with ``dynamic=True`` and
``fullgraph=True``: sizes are symbolic, so any batch size runs the same kernel (a batch of
one is its own graph: Dynamo specialises sizes 0 and 1), and the compiled code lands in
Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), so a second process does not
compile again.

Numerics: ``torch.sigmoid`` and ``torch.tanh`` as the unfused CUDA path (where
:func:`~edbatch.executor.kernels.fast_tanh` is ``torch.tanh``); the compiler may contract
``a * b + c`` into one fused multiply-add, so float64 results agree with the unfused path to
rounding (``tests/executor/test_fused_compiled.py``: 1e-10 on real workload graphs,
gradients included).

Opt-in, because slower: on an H200 (2026-11-28, docs/results.md section 6) ``fsm`` with these
bodies ran at 0.54-0.76x the unfused path on fresh mini-batches (fewer launches, more host
time per compiled call), so :data:`DEVICES` is empty unless the environment variable
``EDBATCH_COMPILED_CELLS`` names device types (``cuda``; ``cpu,cuda``); without it CUDA runs
the unfused torch path as before. ``benchmarks/gpu_fused_check.sh`` turns it on.

Where: tensors on a device in :data:`DEVICES` (tests add devices with :func:`serve`),
fused kernels on (``_fused.use``), float32/float64, outside autograd. A call that fails to
compile warns once, disables this module for the process and completes on the eager body
(the same torch operations, uncompiled); later calls take the unfused path.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["DEVICES", "RECOMPILE_LIMIT", "available", "lstm_backward", "lstm_forward", "serve",
           "settings", "tree_backward", "tree_forward", "usable"]

_ENV = "EDBATCH_COMPILED_CELLS"
_KNOWN = ("cpu", "cuda")


def _env_devices() -> set[str]:
    """The device types ``EDBATCH_COMPILED_CELLS`` names (comma-separated; unset or empty:
    none). An unknown name warns once, naming the value and the fix, and counts as none."""
    raw = os.environ.get(_ENV, "")
    names = {part.strip().lower() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(_KNOWN))
    if unknown:
        warnings.warn(f"{_ENV}={raw!r}: unknown device type(s) {unknown}; use 'cuda', 'cpu' "
                      f"or 'cpu,cuda' (unset: off). The compiled cell bodies stay off.",
                      stacklevel=2)
        return set()
    return names


#: Device types whose tensors take the compiled bodies: empty unless ``EDBATCH_COMPILED_CELLS``
#: names some (opt-in: slower than the unfused path on an H200; the CPU has numba's; tests add
#: devices).
DEVICES = _env_devices()
_FAILED: list[str] = []  # the first compile failure's message (then: the unfused path)
_COMPILED: dict[str, Callable[..., None]] = {}
_DTYPES = (torch.float32, torch.float64)
#: Dynamo's recompile limit while the bodies may compile (a body's graphs: batch of one or
#: more, float32 or float64, and which operands share storage with a written one).
RECOMPILE_LIMIT = 32
_ACTIVE = [0]  # depth of :func:`settings`


@contextlib.contextmanager
def settings() -> Iterator[None]:
    """The compile settings of the bodies (:data:`_SHAPES`, :data:`RECOMPILE_LIMIT`), for a
    block (the executor's runs are each in one). They matter only when a body compiles, so
    nothing is set before the first one (that call sets them itself) or while no device takes
    the bodies (the default: ~18 us a run saved where Dynamo is loaded)."""
    if not DEVICES or "torch._dynamo" not in sys.modules:
        yield
        return
    with _applied():
        yield


#: The symbolic-shape settings while the bodies may compile: no duck sizing (sizes or
#: offsets that happen to be equal are not assumed equal, which recompiled whenever they
#: differed). (``backed_size_oblivious``, which would spare a batch of one its own graph,
#: fails to lower the slices of the state halves: Inductor ``evaluate_min``, torch 2.13.)
_SHAPES = {"use_duck_shape": False}


@contextlib.contextmanager
def _applied() -> Iterator[None]:
    """:data:`_SHAPES` and :data:`RECOMPILE_LIMIT` set for the block (names this torch lacks
    are left out)."""
    import torch._dynamo.config as dynamo_config  # (loaded already: cheap)
    import torch.fx.experimental._config as fx_config

    limit = next((n for n in ("recompile_limit", "cache_size_limit")
                  if hasattr(dynamo_config, n)), None)
    values = [(fx_config, n, v) for n, v in _SHAPES.items() if hasattr(fx_config, n)]
    if limit is not None:
        values.append((dynamo_config, limit, max(getattr(dynamo_config, limit),
                                                 RECOMPILE_LIMIT)))
    old = [(config, n, getattr(config, n)) for config, n, _ in values]
    for config, n, v in values:
        setattr(config, n, v)
    _ACTIVE[0] += 1
    try:
        yield
    finally:
        _ACTIVE[0] -= 1
        for config, n, v in old:
            setattr(config, n, v)


def available() -> bool:
    """Whether the compiled bodies may be used (no compile has failed in this process)."""
    return not _FAILED


@contextlib.contextmanager
def serve(*devices: str) -> Iterator[None]:
    """Also route tensors on ``devices`` (e.g. ``"cpu"``) to the compiled bodies."""
    old = set(DEVICES)
    DEVICES.update(devices)
    try:
        yield
    finally:
        DEVICES.clear()
        DEVICES.update(old)


def usable(*tensors: Tensor) -> bool:
    """Whether the compiled bodies serve ``tensors`` (one device in :data:`DEVICES`, one
    float dtype, nothing recording autograd, no failed compile, no CUDA-graph capture)."""
    if _FAILED:
        return False
    first = tensors[0]
    if first.device.type not in DEVICES or first.dtype not in _DTYPES:
        return False
    if first.is_cuda and torch.cuda.is_current_stream_capturing():
        return False  # a CUDA-graph capture (``cuda_graphs=True``) keeps the unfused path
    for t in tensors:
        if t.device != first.device or t.dtype is not first.dtype or t.requires_grad:
            return False
    return True


# ---------------------------------------------------------------------- the bodies
# (plain torch: each is compiled as one graph; the eager call is the fallback). Every value
# is computed and stored per ``[B, H]`` block, so all stores of a body share one iteration
# space and Inductor can fuse them into one kernel.
def _store(dest: Tensor, blocks: tuple[Tensor, ...]) -> None:
    """``dest[:, k H:(k + 1) H] = blocks[k]`` (each ``[B, H]``)."""
    h = blocks[0].shape[1]
    for k, block in enumerate(blocks):
        dest[:, k * h:(k + 1) * h].copy_(block)


def _tree_leaf(g: Tensor, out: Tensor, t: Tensor) -> None:
    h = t.shape[1]
    i, o = torch.sigmoid(g[:, :h]), torch.sigmoid(g[:, h:2 * h])
    u = torch.tanh(g[:, 2 * h:3 * h])
    c = i * u
    th = torch.tanh(c)
    _store(g, (i, o, u))
    _store(out, (o * th, c))
    t.copy_(th)


def _tree_internal(g: Tensor, f1: Tensor, s1: Tensor, f2: Tensor, s2: Tensor, out: Tensor,
                   t: Tensor) -> None:
    h = t.shape[1]
    i, o = torch.sigmoid(g[:, :h]), torch.sigmoid(g[:, h:2 * h])
    u = torch.tanh(g[:, 2 * h:3 * h])
    a, b = torch.sigmoid(f1), torch.sigmoid(f2)
    c = i * u + a * s1[:, h:2 * h] + b * s2[:, h:2 * h]
    th = torch.tanh(c)
    _store(g, (i, o, u))
    f1.copy_(a)
    f2.copy_(b)
    _store(out, (o * th, c))
    t.copy_(th)


def _tree_gates_grad(grad: Tensor, g: Tensor, t: Tensor, d: Tensor) -> Tensor:
    """Writes ``d[i; o; u]`` (pre-activation); returns ``dc``."""
    h = t.shape[1]
    dh, dcn = grad[:, :h], grad[:, h:2 * h]
    i, o, u = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h]
    dc = dh * o * (1 - t * t) + dcn
    _store(d, (dc * u * i * (1 - i), dh * t * o * (1 - o), dc * i * (1 - u * u)))
    return dc


def _tree_leaf_backward(grad: Tensor, g: Tensor, t: Tensor, d: Tensor) -> None:
    _tree_gates_grad(grad, g, t, d)


def _tree_internal_backward(grad: Tensor, g: Tensor, t: Tensor, d: Tensor, f1: Tensor,
                            c1: Tensor, f2: Tensor, c2: Tensor, d_f: Tensor,
                            d_states: Tensor) -> None:
    h = t.shape[1]
    dc = _tree_gates_grad(grad, g, t, d)
    d_f[0].copy_(dc * c1 * f1 * (1 - f1))
    d_f[1].copy_(dc * c2 * f2 * (1 - f2))
    d_states[0, :, h:2 * h].copy_(dc * f1)
    d_states[1, :, h:2 * h].copy_(dc * f2)


def _lstm(g: Tensor, c: Tensor, out: Tensor, t: Tensor) -> None:
    h = t.shape[1]
    i, f = torch.sigmoid(g[:, :h]), torch.sigmoid(g[:, h:2 * h])
    o, u = torch.sigmoid(g[:, 2 * h:3 * h]), torch.tanh(g[:, 3 * h:4 * h])
    c2 = f * c + i * u
    th = torch.tanh(c2)
    _store(g, (i, f, o, u))
    _store(out, (o * th, c2))
    t.copy_(th)


def _lstm_backward(grad: Tensor, g: Tensor, c: Tensor, t: Tensor, d_gates: Tensor,
                   d_c: Tensor) -> None:
    h = t.shape[1]
    dh, dcn = grad[:, :h], grad[:, h:2 * h]
    i, f, o, u = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:4 * h]
    dc = dh * o * (1 - t * t) + dcn
    _store(d_gates, (dc * u * i * (1 - i), dc * c * f * (1 - f), dh * t * o * (1 - o),
                     dc * i * (1 - u * u)))
    d_c.copy_(dc * f)


_BODIES: dict[str, Callable[..., None]] = {
    "tree_leaf": _tree_leaf, "tree_internal": _tree_internal,
    "tree_leaf_backward": _tree_leaf_backward,
    "tree_internal_backward": _tree_internal_backward,
    "lstm": _lstm, "lstm_backward": _lstm_backward}


def _call(name: str, *args: Any) -> None:
    """Run body ``name`` compiled (compiled on first use); on a failure warn once, turn
    this module off and run the body eagerly."""
    if not _FAILED:
        try:
            fn = _COMPILED.get(name)
            if fn is None:
                fn = _COMPILED[name] = torch.compile(_BODIES[name], dynamic=True,
                                                     fullgraph=True)
            if _ACTIVE[0]:
                fn(*args)
            else:
                with _applied():
                    fn(*args)
            return
        except Exception as e:  # a compile or lowering failure: never crash the run
            _fail(name, e)
    _BODIES[name](*args)


def _fail(name: str, error: Exception) -> None:
    """Record the first failure and warn once; the compiled bodies are off from now on."""
    _FAILED.append(f"{type(error).__name__}: {error}")
    warnings.warn(f"edbatch: compiling the fused cell body {name!r} failed ({_FAILED[0][:300]}); "
                  f"the unfused torch path runs instead", RuntimeWarning, stacklevel=4)


# ---------------------------------------------------------------------- entry points
def tree_forward(g: Tensor, kids: tuple[Tensor, Tensor, Tensor, Tensor] | None, out: Tensor,
                 t: Tensor) -> None:
    """:func:`edbatch.executor._fused.tree_forward`, compiled for any device."""
    if kids is None:
        _call("tree_leaf", g, out, t)
    else:
        _call("tree_internal", g, kids[0], kids[1], kids[2], kids[3], out, t)


def tree_backward(grad: Tensor, g: Tensor, t: Tensor, d: Tensor,
                  kids: tuple[Tensor, ...] | None = None) -> None:
    """:func:`edbatch.executor._fused.tree_backward`, compiled for any device."""
    if kids is None:
        _call("tree_leaf_backward", grad, g, t, d)
    else:
        _call("tree_internal_backward", grad, g, t, d, *kids)


def lstm_forward(g: Tensor, c: Tensor, out: Tensor, t: Tensor) -> None:
    """:func:`edbatch.executor._fused.lstm_forward`, compiled for any device."""
    _call("lstm", g, c, out, t)


def lstm_backward(grad: Tensor, g: Tensor, c: Tensor, t: Tensor, d_gates: Tensor,
                  d_in: Tensor, d0: int) -> None:
    """:func:`edbatch.executor._fused.lstm_backward`, compiled for any device."""
    _call("lstm_backward", grad, g, c, t, d_gates, d_in.narrow(1, d0, t.shape[1]))
