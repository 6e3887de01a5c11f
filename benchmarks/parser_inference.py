"""Transition-parser inference: edbatch's ``run_programs`` against its peers, outputs checked.

``PYTHONPATH=. python benchmarks/parser_inference.py --sentences 128 --batch-size 64``

Every contender parses the same mini-batches of EWT sentences (``--split``, every sentence,
non-projective ones included) greedily with the same parameters (random, or ``--params``: a
``torch.save``'d dict such as ``experiments.train_parser --save-params`` writes):

* ``edbatch``: :meth:`experiments.parser_model.ApiParser.parse` (per-sentence generator
  programs; ``run_programs`` batches every sentence's pending decision per synchronisation);
* ``edbatch_long`` (only if named in ``--contenders``): the same with direct rounds off
  (:mod:`edbatch.api._direct`: every decision round planned and run as a segment);
* ``hand_batched``: :class:`benchmarks.peers.transition_parser.HandBatchedParser` (packed
  ``nn.LSTM``, then all sentences advance by transition step, one MLP call per step);
* ``unbatched``: one sentence and one configuration at a time (the per-instance reference);
* ``dynet``: DyNet 2.2 (``--autobatch``), one sentence per computation graph, ``.npvalue()``
  on every decision (:func:`benchmarks.peers.dynet.transition_parser.parse`).

Each contender's heads and relations are compared with the per-instance reference decoder
(a mismatch is counted and reported, not hidden). Timing: ``--repeats`` interleaved passes
(contender order rotated per pass) after one warm-up pass, the median per mini-batch, summed,
in wall time and in this process's CPU time (``cpu_ms_per_batch``: less sensitive to the
machine's load). One CPU thread. The last stdout line is a JSON object with the load average
beside the times: timings on a loaded machine are noise, the correctness check is not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _args
from benchmarks.dynet_peer import build_peer, init_dynet
from benchmarks.peers.dynet import transition_parser as dynet_parser
from benchmarks.peers.transition_parser import HandBatchedParser, unbatched_parse
from edbatch.api import _direct
from edbatch.executor import init_params
from edbatch.workloads.transition_parser import TransitionParser
from experiments.parser_model import ApiParser

__all__ = ["main", "run"]

Contender = Callable[[Sequence[Sequence[int]]], list[Any]]
DEFAULT_CONTENDERS = ("edbatch", "hand_batched", "unbatched", "dynet")


def contenders(wl: TransitionParser, params: dict[str, torch.Tensor], autobatch: int,
               names: Sequence[str] = DEFAULT_CONTENDERS) -> dict[str, Contender]:
    """The contenders ``names`` as ``parse(sentences) -> [(heads, labels, reads)]`` (DyNet
    started only when ``dynet`` is one of them)."""
    api = ApiParser(wl, params)
    hand = HandBatchedParser(wl, params)

    def long_path(s: Sequence[Sequence[int]]) -> list[Any]:
        on, _direct.DIRECT = _direct.DIRECT, False
        try:
            return api.parse(s)[0]
        finally:
            _direct.DIRECT = on

    out: dict[str, Contender] = {
        "edbatch": lambda s: api.parse(s)[0],
        "edbatch_long": long_path,
        "hand_batched": hand.parse,
        "unbatched": lambda s: unbatched_parse(wl, params, s),
    }
    if "dynet" in names:
        dy = init_dynet(autobatch, mem="1024")
        # keep the ParameterCollection alive: DyNet frees the parameters' memory with it
        model, dy_params = build_peer(dy, wl.name, {k: v.detach().numpy()
                                                    for k, v in params.items()})
        actions = wl.class_actions()
        out["dynet"] = lambda s, _model=model: dynet_parser.parse(dy, dy_params, wl.hidden_dim,
                                                                  s, actions)
    return {n: out[n] for n in names if n in out}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check every contender's parses and time them; return the report."""
    torch.set_num_threads(1)
    wl = TransitionParser(embed_dim=args.embed, pos_dim=args.pos, hidden_dim=args.hidden,
                          mlp_dim=args.mlp, layers=args.layers)
    if args.params:
        params = {k: v.detach() for k, v in torch.load(args.params).items()}
    else:
        params = {k: v.detach() for k, v in
                  init_params(wl, torch.Generator().manual_seed(args.seed)).items()}
    sentences = [wl.embed_attrs(s) for s in list(wl.sentences(args.split))[:args.sentences]]
    batches = [sentences[k:k + args.batch_size]
               for k in range(0, len(sentences), args.batch_size)]
    runners = contenders(wl, params, args.autobatch, args.contenders)
    with torch.no_grad():
        reference = [unbatched_parse(wl, params, b) for b in batches]
    times: dict[str, list[list[float]]] = {n: [[] for _ in batches] for n in runners}
    cpu: dict[str, list[list[float]]] = {n: [[] for _ in batches] for n in runners}
    mismatches = dict.fromkeys(runners, 0)
    names = list(runners)
    for rep in range(args.repeats + 1):
        for k, batch in enumerate(batches):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                start, cpu_start = time.perf_counter(), time.process_time()
                with torch.no_grad():
                    out = runners[name](batch)
                seconds = time.perf_counter() - start
                cpu_seconds = time.process_time() - cpu_start
                if rep == 0:  # the warm-up pass checks the outputs
                    mismatches[name] += sum(
                        (a[0], a[1]) != (b[0], b[1])
                        for a, b in zip(out, reference[k], strict=True))
                else:
                    times[name][k].append(seconds)
                    cpu[name][k].append(cpu_seconds)
    total = {n: sum(statistics.median(t) for t in times[n]) for n in names}
    cpu_total = {n: sum(statistics.median(t) for t in cpu[n]) for n in names}
    report = {
        "sentences": len(sentences), "batch_size": args.batch_size, "split": args.split,
        "model": {"embed": args.embed, "pos": args.pos, "hidden": args.hidden,
                  "mlp": args.mlp, "layers": args.layers,
                  "params": args.params or f"random seed {args.seed}"},
        "autobatch": args.autobatch, "repeats": args.repeats,
        "loadavg": os.getloadavg(), "threads": 1,
        "mismatched_sentences": mismatches,
        "ms_per_batch": {n: 1000 * total[n] / len(batches) for n in names},
        "cpu_ms_per_batch": {n: 1000 * cpu_total[n] / len(batches) for n in names},
        "edbatch_speedup": {n: total[n] / total["edbatch"] for n in names
                            if n != "edbatch" and "edbatch" in total},
    }
    for name in names:
        print(f"{name:>13}: {report['ms_per_batch'][name]:9.1f} ms per mini-batch "
              f"({report['cpu_ms_per_batch'][name]:.1f} CPU), "
              f"{mismatches[name]} sentences differ from the reference")
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    p.add_argument("--embed", type=int, default=100)
    p.add_argument("--pos", type=int, default=25)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--mlp", type=int, default=100)
    p.add_argument("--layers", type=int, default=1, choices=(1, 2))
    p.add_argument("--params", default=None, help="torch.save'd parameter dict")
    p.add_argument("--autobatch", type=int, default=1, choices=(0, 1, 2))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=_args.seed, default=0)
    p.add_argument("--contenders", nargs="+", default=list(DEFAULT_CONTENDERS),
                   choices=(*DEFAULT_CONTENDERS, "edbatch_long"),
                   help="which to run (edbatch_long: edbatch with direct rounds off)")
    p.add_argument("--out", type=_args.out_file, default=None,
                   help="write the JSON report here too")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point: the report (also printed as the last stdout line)."""
    args = _parser().parse_args(argv)
    for name in ("sentences", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            _parser().error(f"--{name.replace('_', '-')} must be >= 1")
    report = run(args)
    line = json.dumps(report)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)
    return report


if __name__ == "__main__":
    _args.run(main)
