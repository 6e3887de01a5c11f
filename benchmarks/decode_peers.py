"""Greedy seq2seq decoding and early exit at inference: edbatch's ``run_programs`` against
hand-vectorised PyTorch, DyNet 2.2 with ``.value()`` and unbatched per-instance PyTorch.

``python -m benchmarks.decode_peers``: both demonstrations of issue 28 on the same parameters,
one CPU thread, the sentences reshuffled (seed) into mini-batches of ``--batch-size``; every
repeat visits the mini-batches in a new random order and, per mini-batch, the contenders in
a new random order (so all are timed in the same minutes). Contenders
(``benchmarks/decode_torch.py``, ``benchmarks/_decode_dynet.py``):

* ``edbatch``: one program per sentence (``examples/greedy_decode.py``'s ``Decoder.program``;
  :func:`~benchmarks.decode_torch.exit_program`), ``batch.run_programs(..., scheduler,
  grad=False)`` (``--scheduler``, default ``typewise_greedy``: it batches every sentence's
  first decoder step together, where ``depth`` splits them by source length);
* ``pytorch_hand``: a practitioner's batched loop: one step for all unfinished sentences,
  finished ones masked out;
* ``pytorch_unbatched``: each sentence alone, ``argmax().item()`` per step;
* ``dynet_instance``: DyNet, each sentence alone, ``.npvalue()`` per step (autobatch 0);
* ``dynet_interleaved``: DyNet, the sentences interleaved by hand in one graph, one
  ``dy.forward`` per round of steps (autobatch 1).

The DyNet workers time each pass in their own process (``benchmarks/_decode_dynet.py``),
while this process waits. Every contender's outputs (tokens; words read and class) are
compared with the unbatched reference on the first pass; mismatching sentences are counted
and printed (float32: a near-tie of two logits may round differently between libraries).
Prints per contender the sum over mini-batches of the median milliseconds, and each one's
ratio to edbatch (> 1: slower than edbatch). Timings depend on the machine and its load:
report them with ``uptime``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: this checkout's edbatch
    sys.path.insert(0, str(ROOT))
from benchmarks import _args  # noqa: E402
from benchmarks import decode_torch as dt  # noqa: E402

__all__ = ["Demo", "DynetWorker", "early_exit_demo", "greedy_demo", "main", "time_demo"]

Contender = Callable[[list[int]], Any]  # instance indices -> outputs


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DynetWorker:
    """``benchmarks/_decode_dynet.py`` as a subprocess with its own autobatch flag."""

    def __init__(self, params: Path, autobatch: int, bos: int, eos: int,
                 threshold: float) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, str(ROOT / "benchmarks" / "_decode_dynet.py"), "--params",
               str(params), "--autobatch", str(autobatch), "--bos", str(bos), "--eos", str(eos),
               "--threshold", repr(threshold)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT, env=env)
        if not self._reply().get("ready"):
            raise RuntimeError("the DyNet worker did not report ready")

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return dict(json.loads(line))
        raise RuntimeError(f"the DyNet worker exited {self.proc.wait()}")

    def ask(self, **req: Any) -> tuple[float, Any]:
        """One pass: (seconds in the worker, outputs)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return float(reply["seconds"]), reply["outputs"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Demo:
    """One demonstration: instances, torch contenders, DyNet request, a summary line."""

    def __init__(self, name: str, model: Any, count: int, contenders: dict[str, Contender],
                 request: Callable[[list[int]], dict[str, Any]], summary: str) -> None:
        self.name, self.model, self.count, self.contenders = name, model, count, contenders
        self.request, self.summary = request, summary
        #: The last edbatch run's synchronisation count.
        self.syncs = 0


def greedy_demo(hidden: int, vocab_size: int, max_len: int, max_steps: int, count: int,
                dtype: torch.dtype = torch.float32, scheduler: str = "typewise_greedy",
                general: bool = False) -> tuple[Demo, dict[str, Any]]:
    """The greedy decoder on the first ``count`` IWSLT15 test sources (limit per sentence:
    ``min(max_steps, 2 * source length)``), edbatch scheduling with ``scheduler``; (demo,
    its DyNet arrays and ids). ``general``: also ``edbatch_general``, edbatch with typed
    segments off (:data:`edbatch.api._typed.TYPED`), for a before/after in one run."""
    model = load_example("greedy_decode").Decoder(hidden=hidden, vocab_size=vocab_size,
                                                  max_len=max_len, dtype=dtype)
    sources = [list(i.source_ids) for i in model.wl.load("test")[:count]]
    limits = [min(max_steps, 2 * len(s)) for s in sources]
    w = dt.Weights(model.params)

    def pick(idx: list[int]) -> tuple[list[list[int]], list[int]]:
        return [sources[i] for i in idx], [limits[i] for i in idx]

    def edbatch(idx: list[int]) -> Any:
        out = model.batch.run_programs([model.program(s, n) for s, n in
                                        zip(*pick(idx), strict=True)], scheduler, grad=False)
        demo.syncs = out.syncs
        return out.returns

    contenders = {"edbatch": edbatch,
                  "pytorch_hand": lambda idx: dt.greedy_hand(w, *pick(idx), model.bos,
                                                             model.eos),
                  "pytorch_unbatched": lambda idx: dt.greedy_unbatched(w, *pick(idx),
                                                                       model.bos, model.eos)}
    if general:
        contenders["edbatch_general"] = lambda idx: _untyped(edbatch, idx)
    arrays = {k: v.detach().numpy() for k, v in model.params.items()}
    demo = Demo("greedy", model, len(sources), contenders,
                lambda idx: dict(zip(("sources", "limits"), pick(idx), strict=True)),
                f"hidden {hidden}, target vocabulary {model.wl.num_target}, sources of "
                f"<= {max_len} tokens, limit min({max_steps}, 2 x source)")
    return demo, {"arrays": arrays, "bos": model.bos, "eos": model.eos}


def _untyped(fn: Contender, idx: list[int]) -> Any:
    """``fn(idx)`` with typed segments switched off."""
    from edbatch.api import _typed
    _typed.TYPED = False
    try:
        return fn(idx)
    finally:
        _typed.TYPED = True


def early_exit_demo(dim: int, threshold: float, count: int, dtype: torch.dtype = torch.float32,
                    scheduler: str = "typewise_greedy") -> tuple[Demo, dict[str, np.ndarray]]:
    """The early-exit RNN on the first ``count`` SST train sentences; (demo, DyNet arrays)."""
    data, vocab = load_example("moe_routing").sentences(count)
    sentences = [list(w) for w, _ in data if len(w)]
    torch.manual_seed(0)
    model = load_example("early_exit").EarlyExit(vocab, dim=dim, threshold=threshold,
                                                 dtype=dtype)

    def edbatch(idx: list[int]) -> Any:
        out = model.batch.run_programs([dt.exit_program(model, sentences[i]) for i in idx],
                                       scheduler, grad=False)
        demo.syncs = out.syncs
        return out.returns

    contenders = {"edbatch": edbatch,
                  "pytorch_hand": lambda idx: dt.exit_hand(model, [sentences[i] for i in idx]),
                  "pytorch_unbatched": lambda idx: dt.exit_unbatched(
                      model, [sentences[i] for i in idx])}
    arrays = {"exit.embed": model.embed.weight, "exit.step": model.step.linear.weight,
              "exit.step.b": model.step.linear.bias, "exit.out": model.out.weight,
              "exit.out.b": model.out.bias}
    demo = Demo("exit", model, len(sentences), contenders,
                lambda idx: {"sentences": [sentences[i] for i in idx]},
                f"Elman RNN dim {dim}, 5 classes, threshold {threshold}")
    return demo, {k: v.detach().numpy() for k, v in arrays.items()}


def _same(a: Any, b: Any) -> bool:
    return [list(x) for x in a] == [list(x) for x in b]


def time_demo(demo: Demo, workers: dict[str, tuple[DynetWorker, str]], batch_size: int,
              repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    """Interleaved, reshuffled timing of every contender (module docstring)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(demo.count).tolist()
    batches = [perm[s:s + batch_size] for s in range(0, len(perm), batch_size)]
    contenders = dict(demo.contenders)
    for name, (worker, style) in workers.items():
        contenders[name] = (lambda idx, w=worker, s=style:
                            w.ask(demo=demo.name, style=s, **demo.request(idx)))
    times: dict[str, list[list[float]]] = {c: [[] for _ in batches] for c in contenders}
    mismatch = dict.fromkeys(contenders, 0)
    reference: dict[int, Any] = {}
    for rep in range(warmup + repeats):
        for b in rng.permutation(len(batches)).tolist():
            for name in rng.permutation(list(contenders)).tolist():
                t0 = time.perf_counter()
                with torch.no_grad():
                    got = contenders[name](batches[b])
                seconds = time.perf_counter() - t0
                if name in workers:
                    seconds, got = got
                if rep == 0:
                    if b not in reference:
                        with torch.no_grad():
                            reference[b] = demo.contenders["pytorch_unbatched"](batches[b])
                    mismatch[name] += sum(not _same([x], [y]) for x, y in
                                          zip(got, reference[b], strict=True))
                if rep >= warmup:
                    times[name][b].append(seconds)
    ms = {c: 1e3 * sum(statistics.median(t) for t in times[c]) for c in contenders}
    return {"demo": demo.name, "model": demo.summary, "instances": demo.count,
            "batches": len(batches), "repeats": repeats, "ms": ms,
            "ratio_to_edbatch": {c: ms[c] / ms["edbatch"] for c in contenders},
            "mismatched_sentences": mismatch}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demos", nargs="+", default=["greedy", "exit"], choices=["greedy", "exit"])
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--exit-dim", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--no-dynet", action="store_true", help="leave the DyNet contenders out")
    ap.add_argument("--seed", type=_args.seed, default=0)
    ap.add_argument("--general", action="store_true",
                    help="greedy: also time edbatch with typed segments off, interleaved")
    ap.add_argument("--scheduler", default="typewise_greedy",
                    help="edbatch's scheduler for run_programs (a registry name)")
    return ap


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark; print and return one report per demonstration."""
    args = _parser().parse_args(argv)
    for flag in ("sentences", "batch_size", "repeats", "hidden", "vocab_size", "max_len",
                 "max_steps", "exit_dim"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"decode_peers: --{flag.replace('_', '-')} "
                             f"{getattr(args, flag)} must be >= 1")
    torch.set_num_threads(1)
    greedy, ids = greedy_demo(args.hidden, args.vocab_size, args.max_len, args.max_steps,
                              args.sentences, scheduler=args.scheduler,
                              general=args.general)
    exit_, exit_arrays = early_exit_demo(args.exit_dim, args.threshold, args.sentences,
                                         scheduler=args.scheduler)
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.npz"
        np.savez(params, **ids["arrays"], **exit_arrays)
        workers: dict[int, DynetWorker] = {}
        if not args.no_dynet:
            workers = {ab: DynetWorker(params, ab, ids["bos"], ids["eos"], args.threshold)
                       for ab in (0, 1)}
        roles = {"dynet_instance": (workers[0], "instance"),
                 "dynet_interleaved": (workers[1], "interleaved")} if workers else {}
        try:
            for demo in (d for d in (greedy, exit_) if d.name in args.demos):
                report = time_demo(demo, roles, args.batch_size, args.repeats, args.warmup,
                                   args.seed)
                report["load"] = os.getloadavg()
                reports.append(report)
                print(json.dumps(report), flush=True)
                _table(report)
        finally:
            for w in workers.values():
                w.close()
    return reports


def _table(report: dict[str, Any]) -> None:
    print(f"{report['demo']}: {report['model']}; {report['instances']} sentences in "
          f"{report['batches']} mini-batches, load {report['load'][0]:.2f}")
    for c, ms in sorted(report["ms"].items(), key=lambda kv: kv[1]):
        print(f"  {c:20s} {ms:9.1f} ms  x{report['ratio_to_edbatch'][c]:.2f} of edbatch  "
              f"mismatched {report['mismatched_sentences'][c]}")


if __name__ == "__main__":
    _args.run(main)
