"""Compiled fused cell bodies (``edbatch.executor._fused_compiled``, TorchInductor): where they
apply, that they equal the unfused torch path in fp64 on real workload graphs (gradients
through the hand-written backwards included) on the CPU (Inductor's C++ backend, ``slow``:
the first compiles take minutes here) and on CUDA (``gpu``), and that a failing compile
falls back to the unfused path with one warning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import Tensor

from edbatch.executor import _fast_lstm, _fused, _fused_compiled, init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory
from edbatch.schedule import make_scheduler
from edbatch.workloads import WORKLOADS, make_workload

#: A tree workload and an LSTM one: every compiled body runs in one or the other.
NAMES = ("tree_lstm", "bilstm_tagger")
TREE_BODIES = {"tree_leaf", "tree_internal", "tree_leaf_backward", "tree_internal_backward"}
LSTM_BODIES = {"lstm", "lstm_backward"}


def _run(name: str, device: str, fused: bool, count: int = 4
         ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Inference loss, training loss and parameter gradients (hand-written backwards) of a
    small fp64 mini-batch of ``name`` on ``device``."""
    wl = make_workload(name, granularity="cell",
                       **WORKLOADS[name].test_kwargs(dim=6, hidden=5, short=True))
    graph = wl.minibatch(wl.default_eval_split, range(count))
    schedule = make_scheduler("critical_path")(graph)
    plan = plan_memory(graph, schedule, "planned")
    params = {k: p.requires_grad_() for k, p in
              init_params(wl, torch.Generator().manual_seed(3), dtype=torch.float64,
                          device=device).items()}
    executor = TorchExecutor(device, dtype=torch.float64, fused=fused)
    infer = executor.run(graph, schedule, plan, params).loss
    result = executor.run(graph, schedule, plan, params, grad=True)
    assert infer is not None and result.loss is not None
    assert result.stats["exec/cuda_graph"] == 0.0
    grads = torch.autograd.grad(result.loss, list(params.values()), allow_unused=True)
    return infer, result.loss.detach(), {k: g for k, g in zip(params, grads, strict=True)
                                         if g is not None}


def _assert_same(a: tuple[Tensor, Tensor, dict[str, Tensor]],
                 b: tuple[Tensor, Tensor, dict[str, Tensor]]) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a[1], b[1], rtol=1e-10, atol=1e-12)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        torch.testing.assert_close(a[2][k].to_dense(), b[2][k].to_dense(), rtol=1e-10,
                                   atol=1e-12, msg=f"gradient of {k} differs")


# ---------------------------------------------------------------------- where they apply
def test_cpu_tensors_keep_numba_unless_served() -> None:
    x = torch.zeros(3, 4)
    assert not _fused_compiled.usable(x)  # the CPU has the numba kernels
    assert _fused.cell_usable(x) == _fused.usable(x)
    with _fused_compiled.serve("cpu"):
        assert _fused_compiled.usable(x, torch.zeros(3, 2))
        assert _fused.cell_usable(x)
        assert not _fast_lstm.qualifies([x])  # no numba short paths while served
    assert "cpu" not in _fused_compiled.DEVICES


def test_opt_in_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off unless ``EDBATCH_COMPILED_CELLS`` names device types; a bad name warns with the fix."""
    monkeypatch.delenv("EDBATCH_COMPILED_CELLS", raising=False)
    assert _fused_compiled._env_devices() == set()
    monkeypatch.setenv("EDBATCH_COMPILED_CELLS", " cuda, CPU ")
    assert _fused_compiled._env_devices() == {"cuda", "cpu"}
    monkeypatch.setenv("EDBATCH_COMPILED_CELLS", "gpu")
    with pytest.warns(UserWarning, match=r"EDBATCH_COMPILED_CELLS='gpu'.*\['gpu'\].*'cuda'"):
        assert _fused_compiled._env_devices() == set()


@pytest.mark.parametrize(("bad", "alone"), [("grad", False), ("dtype", True),
                                           ("int", False), ("device", False)])
def test_not_usable(bad: str, alone: bool) -> None:
    """Mixed with a usable tensor never; alone only if it is usable itself (``alone``)."""
    x = torch.zeros(3, 4, device="meta")
    other = {"grad": torch.zeros(3, 4, device="meta", requires_grad=True),
             "dtype": torch.zeros(3, 4, device="meta", dtype=torch.float64),
             "int": torch.zeros(3, 4, device="meta", dtype=torch.int64),
             "device": torch.zeros(3, 4)}[bad]
    with _fused_compiled.serve("meta"):
        assert _fused_compiled.usable(x, x)
        assert not _fused_compiled.usable(x, other)
        assert _fused_compiled.usable(other, other) == alone


def test_off_switch_turns_the_compiled_bodies_off() -> None:
    """``TorchExecutor(fused=False)`` runs inside ``_fused.use(False)``: no compiled body."""
    x = torch.zeros(3, 4, device="meta")
    with _fused_compiled.serve("meta"):
        assert _fused.cell_usable(x)
        with _fused.use(False):
            assert not _fused.cell_usable(x)
        assert _fused.cell_usable(x)


# ---------------------------------------------------------------------- the same numbers
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_compiled_equals_unfused_on_cpu_fp64(name: str) -> None:
    torch.set_num_threads(1)
    with _fused_compiled.serve("cpu"):
        fused = _run(name, "cpu", True)
    assert not _fused_compiled._FAILED, _fused_compiled._FAILED
    used = TREE_BODIES if name == "tree_lstm" else LSTM_BODIES
    assert used <= set(_fused_compiled._COMPILED)
    _assert_same(fused, _run(name, "cpu", False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_compiled_equals_unfused_on_cuda_fp64(name: str) -> None:
    with _fused_compiled.serve("cuda"):  # opt-in (EDBATCH_COMPILED_CELLS): slower on a GPU
        fused = _run(name, "cuda", True, count=6)
    assert not _fused_compiled._FAILED, _fused_compiled._FAILED
    used = TREE_BODIES if name == "tree_lstm" else LSTM_BODIES
    assert used <= set(_fused_compiled._COMPILED)
    _assert_same(fused, _run(name, "cuda", False, count=6))


# ---------------------------------------------------------------------- failing compiles
_FALLBACK = """
import warnings, torch
import torch._inductor.config as config
from edbatch.executor import _fused_compiled
config.cpp.cxx = ("/nonexistent/c++",)  # no compiler: every compile fails
from tests.executor.test_fused_compiled import _assert_same, _run
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with _fused_compiled.serve("cpu"):
        fused = _run("tree_lstm", "cpu", True)
ours = [w for w in caught if "fused cell body" in str(w.message)]
assert len(ours) == 1, [str(w.message) for w in caught]
assert _fused_compiled._FAILED and not _fused_compiled.available()
_assert_same(fused, _run("tree_lstm", "cpu", False))
print("fell back")
"""


@pytest.mark.slow
def test_a_failing_compile_falls_back_with_one_warning(tmp_path: object) -> None:
    """No C++ compiler (and an empty Inductor cache): one warning, then the unfused path,
    the same numbers (in a fresh process: the failure turns the module off for good)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_FALLBACK)], env=env,
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fell back" in done.stdout
