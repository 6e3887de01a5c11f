"""Per-batch host cost of one ``fsm`` Tree-LSTM inference mini-batch, fused bodies on and off.

For each of ``--minibatches`` reshuffled mini-batches of 64 SST train trees (numpy builder,
the ``fsm`` policy of ``benchmarks/throughput.py``, naive memory plan), the executor runs the
mini-batch with the fused cell bodies on (``TorchExecutor(fused=None)``: on CUDA the
TorchInductor bodies of :mod:`edbatch.executor._fused_compiled`) and off (``fused=False``,
the unfused torch kernels), interleaved; one run of each is traced with ``torch.profiler``.
Printed and written to ``--out`` (JSON): batches per mini-batch, top-level aten ops and
compiled regions per batch, kernel launches, ``cudaStreamSynchronize`` /
``cudaDeviceSynchronize`` / ``cudaEventSynchronize`` / ``cudaMemcpy*`` calls per mini-batch,
the host microseconds (under the profiler) of the costliest top-level ops, and the median wall
ms of ``run()`` (which waits for the device at its end) per mode. ``DISABLE_ADDMM_CUDA_LT=1``
in the environment (torch reads it at start) runs ``addmm`` with a bias through plain cuBLAS
instead of cuBLASLt (whose per-call heuristic query costs host time at new shapes).

    python3 benchmarks/gpu_fused_profile.py --device cuda --out $OUT/profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.peers import sized_workload
from edbatch.executor import init_params
from edbatch.executor.torch_executor import TorchExecutor
from edbatch.memory import plan_memory

#: Runtime-API calls counted per mini-batch (the names torch.profiler gives them).
CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
         "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaHostAlloc")


def _counts(prof: Any, batches: int) -> dict[str, Any]:
    top: collections.Counter[str] = collections.Counter()
    host_us: collections.Counter[str] = collections.Counter()  # host us, top-level ops
    calls: collections.Counter[str] = collections.Counter()
    regions = 0
    for e in prof.events():
        name = e.name
        if name in CALLS:
            calls[name] += 1
        elif name.startswith("Torch-Compiled Region"):
            regions += 1
            host_us["Torch-Compiled Region"] += e.cpu_time_total
        elif name.startswith("aten::") and (e.cpu_parent is None
                                            or not e.cpu_parent.name.startswith(("aten::",
                                                                                 "Torch-"))):
            top[name] += 1
            host_us[name] += e.cpu_time_total
    ops = sum(top.values())
    return {"batches": batches, "aten_ops": ops, "aten_ops_per_batch": ops / batches,
            "compiled_regions": regions, "calls": dict(calls),
            "launches": sum(v for k, v in calls.items() if "Launch" in k),
            "top_ops": top.most_common(25),
            "host_us_by_op": [(k, round(v, 1)) for k, v in host_us.most_common(15)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="300x150")
    p.add_argument("--minibatches", type=int, default=3)
    p.add_argument("--policy-dir", default="results/throughput_policies")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from benchmarks.throughput import load_or_train_policy

    torch.set_num_threads(1)
    embed, hidden = (int(x) for x in args.size.split("x"))
    wl = sized_workload("tree_lstm", embed, hidden)
    scheduler = load_or_train_policy("tree_lstm", wl, args.policy_dir)[0].runtime_scheduler("fsm")
    params = dict(init_params(wl, torch.Generator().manual_seed(0), device=args.device))
    data = wl.load("train")
    order = list(range(len(data)))
    random.Random(0).shuffle(order)
    modes = {"fused": None, "unfused": False}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    result: dict[str, Any] = {"device": str(args.device), "size": args.size,
                              "gpu": torch.cuda.get_device_name() if args.device.startswith(
                                  "cuda") else "cpu"}
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if args.device.startswith("cuda") else [])
    for k in range(1 + args.minibatches):  # mini-batch 0 warms up (and compiles)
        graph = wl.minibatch("train", order[k * 64:(k + 1) * 64])
        schedule = scheduler(graph)
        plan = plan_memory(graph, schedule, "naive", cache=False)
        for mode in (modes if k % 2 else reversed(modes)):  # alternate who goes first
            ex = TorchExecutor(args.device, fused=modes[mode])
            ex._program(graph, schedule, plan)  # program compiled outside the timing
            with torch.no_grad():
                t0 = time.perf_counter()
                ex.run(graph, schedule, plan, params)
                if k:
                    wall[mode].append(1e3 * (time.perf_counter() - t0))
                if k == 1:
                    with profile(activities=activities) as prof:
                        ex.run(graph, schedule, plan, params)
                    result[mode] = _counts(prof, schedule.num_batches)
    for mode in modes:
        result[mode]["run_ms_median"] = statistics.median(wall[mode])
        c = result[mode]
        print(f"{mode:<8} batches {c['batches']:>4}  aten ops/batch {c['aten_ops_per_batch']:6.1f}"
              f"  compiled regions {c['compiled_regions']:>4}  launches {c['launches']:>5}"
              f"  run() {c['run_ms_median']:7.2f} ms  calls {c['calls']}")
        print(f"         top ops: {c['top_ops'][:12]}")
        print(f"         host us (profiled) by op: {c['host_us_by_op'][:10]}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
