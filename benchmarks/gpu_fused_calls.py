"""Host cost of one compiled cell-body call against the eager ops it replaces (issue 32).

On an H200 (2026-11-28, docs/results.md section 6) the compiled CUDA bodies
(:mod:`edbatch.executor._fused_compiled`) cut a Tree-LSTM mini-batch's launches from 350 to
228, yet its ``run()`` took 13.7 ms against 8.9: about 230 us of host time per compiled call,
where the CPU shows no recompile and a call about as cheap as the eager ops. This script
times the Tree-LSTM internal-node body alone, per call, on ``--device``:

* ``eager``: the body's torch ops as the unfused path runs them;
* ``compiled``: ``torch.compile(dynamic=True, fullgraph=True)``, as the executor compiles it;
* ``no-guards``: the same compiled body under ``torch.compiler.set_stance(...,
  skip_guard_eval_unsafe=True)`` (guards evaluated only on a miss): the guards' share.

Each variant runs ``--calls`` calls back to back on each row count after warm-up; the host
time per call (``perf_counter`` around the loop, a device synchronisation after it and
before it) and, on CUDA, the device time per call (CUDA events) are printed and written as
JSON. The first compile takes a minute on a fresh Inductor cache.

    python benchmarks/gpu_fused_calls.py --device cuda --out /tmp/calls.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import _args
from edbatch.executor import _fused_compiled

ROWS = (8, 64, 512)


def _operands(n: int, hidden: int, device: str) -> tuple[torch.Tensor, ...]:
    """Operands of one internal-node batch of ``n`` rows: ``g, f1, s1, f2, s2, out, t``."""
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device)
    return (r(n, 3 * hidden), r(n, hidden), r(n, 2 * hidden), r(n, hidden),
            r(n, 2 * hidden), r(n, 2 * hidden), r(n, hidden))


def time_calls(fn: Callable[..., Any], args: tuple[torch.Tensor, ...], calls: int,
               device: str) -> dict[str, float]:
    """Host us per call (``calls`` back to back) and, on CUDA, device us per call."""
    cuda = torch.device(device).type == "cuda"
    for _ in range(10):
        fn(*args)
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    out = {"host_us": 1e6 * (time.perf_counter() - t0) / calls}
    if cuda:
        end.record()
        torch.cuda.synchronize()
        out["device_us"] = 1e3 * start.elapsed_time(end) / calls
    out["host_synced_us"] = 1e6 * (time.perf_counter() - t0) / calls
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", type=_args.device,
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=_args.positive, default=150)
    p.add_argument("--calls", type=_args.positive, default=200)
    p.add_argument("--out", type=_args.out_file, default=Path("results/gpu_fused_calls.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    body = _fused_compiled._tree_internal
    compiled = torch.compile(body, dynamic=True, fullgraph=True)
    rows: list[dict[str, Any]] = []
    with _fused_compiled._applied():  # the executor's compile settings (no duck sizing)
        for n in (5, 40, 130):  # the dynamic graph, compiled once before timing
            compiled(*_operands(n, a.hidden, a.device))
        for n in ROWS:
            args = _operands(n, a.hidden, a.device)
            row: dict[str, Any] = {"rows": n}
            row["eager"] = time_calls(body, args, a.calls, a.device)
            row["compiled"] = time_calls(compiled, args, a.calls, a.device)
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                row["no-guards"] = time_calls(compiled, args, a.calls, a.device)
            rows.append(row)
            print(f"rows {n:4d}: " + "; ".join(
                f"{k} host {v['host_us']:.1f} us" +
                (f", device {v['device_us']:.1f} us" if "device_us" in v else "")
                for k, v in row.items() if k != "rows"), flush=True)
    cuda = torch.device(a.device).type == "cuda"
    info = {"device": a.device, "torch": torch.__version__, "hidden": a.hidden,
            "calls": a.calls, "gpu": torch.cuda.get_device_name(a.device) if cuda else None,
            "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(info, indent=1), encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
