"""DyNet 2.2 contenders of the decoding demonstrations, as a worker kept running.

DyNet users branch on a computed value by forcing evaluation (``.value()``). Two ways:

* ``instance``: each sentence alone (``renew_cg`` per sentence), its next step built and its
  value read per step: nothing to batch, so the worker runs with ``--autobatch 0``;
* ``interleaved``: the user interleaves the sentences by hand: one graph per mini-batch,
  every unfinished sentence's next step built, then one ``dy.forward`` over their values
  (with ``--autobatch 1`` DyNet batches those steps), each value read, the next round built.

Same equations and parameter values as ``benchmarks/decode_torch.py`` (the seq2seq cells,
``[i f o u]`` LSTM gates; the early-exit Elman RNN). DyNet fixes its autobatch mode at
init, so ``benchmarks/decode_peers.py`` starts one worker per mode. After ``{"ready": ...}``
the worker answers each stdin line ``{"demo": "greedy", "style": ..., "sources": [[...]],
"limits": [...]}`` or ``{"demo": "exit", "style": ..., "sentences": [[...]]}`` with
``{"seconds": ..., "outputs": [...]}`` (the pass alone, in the worker) until end of input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.dynet_peer import init_dynet
from benchmarks.peers.dynet import lstm_step

__all__ = ["Peer", "main"]

STYLES = ("instance", "interleaved")
#: The early-exit model's arrays in the parameter file (the rest are seq2seq's).
EXIT_LOOKUPS = ("exit.embed",)
SEQ_LOOKUPS = ("seq2seq.src_emb", "seq2seq.tgt_emb")


class Peer:
    """The DyNet parameters and both demonstrations in both styles."""

    def __init__(self, dy: Any, arrays: dict[str, np.ndarray], bos: int, eos: int,
                 threshold: float) -> None:
        self.dy, self.bos, self.eos, self.threshold = dy, bos, eos, threshold
        self.model = dy.ParameterCollection()
        self.p: dict[str, Any] = {}
        for name, value in arrays.items():
            lookup = name in EXIT_LOOKUPS or name in SEQ_LOOKUPS
            add = self.model.add_lookup_parameters if lookup else self.model.add_parameters
            self.p[name] = add(value.shape, init=value)
        self.hidden = arrays["seq2seq.out"].shape[1] if "seq2seq.out" in arrays else 0

    # ------------------------------------------------------------------ greedy
    def _seq_step(self, side: str, table: str, token: int, h: Any, c: Any) -> tuple[Any, Any]:
        dy, p = self.dy, self.p
        x = dy.tanh(dy.affine_transform([p[f"seq2seq.{side}_e2h.b"], p[f"seq2seq.{side}_e2h"],
                                         dy.lookup(p[f"seq2seq.{table}_emb"], token)]))
        return lstm_step(dy, p[f"seq2seq.{side}_lstm"], p[f"seq2seq.{side}_lstm.b"], x, h, c,
                         self.hidden)

    def _logits(self, h: Any) -> Any:
        return self.dy.affine_transform([self.p["seq2seq.out.b"], self.p["seq2seq.out"], h])

    def _encode(self, source: Sequence[int]) -> tuple[Any, Any]:
        h = c = self.dy.zeros(self.hidden)
        for token in source:
            h, c = self._seq_step("enc", "src", token, h, c)
        return h, c

    def greedy(self, style: str, sources: Sequence[Sequence[int]], limits: Sequence[int]
               ) -> list[list[int]]:
        dy = self.dy
        if style == "instance":
            outputs = []
            for source, limit in zip(sources, limits, strict=True):
                dy.renew_cg()
                h, c = self._encode(source)
                prev, out = self.bos, []
                for _ in range(limit):
                    h, c = self._seq_step("dec", "tgt", prev, h, c)
                    prev = int(np.argmax(self._logits(h).npvalue()))
                    out.append(prev)
                    if prev == self.eos:
                        break
                outputs.append(out)
            return outputs
        dy.renew_cg()
        states = [self._encode(s) for s in sources]
        outs: list[list[int]] = [[] for _ in sources]
        alive = [i for i, n in enumerate(limits) if n > 0]
        while alive:
            logits = []
            for i in alive:
                prev = outs[i][-1] if outs[i] else self.bos
                states[i] = self._seq_step("dec", "tgt", prev, *states[i])
                logits.append(self._logits(states[i][0]))
            dy.forward(logits)  # every pending step at once (batched with autobatch)
            for i, e in zip(alive, logits, strict=True):
                outs[i].append(int(np.argmax(e.npvalue())))
            alive = [i for i in alive if outs[i][-1] != self.eos and len(outs[i]) < limits[i]]
        return outs

    # ------------------------------------------------------------------ early exit
    def _exit_step(self, h: Any, word: int) -> tuple[Any, Any]:
        dy, p = self.dy, self.p
        x = dy.lookup(p["exit.embed"], word)
        h = dy.tanh(dy.affine_transform([p["exit.step.b"], p["exit.step"],
                                         dy.concatenate([h, x])]))
        return h, dy.softmax(dy.affine_transform([p["exit.out.b"], p["exit.out"], h]))

    def early_exit(self, style: str, sentences: Sequence[Sequence[int]]) -> list[list[int]]:
        dy, dim = self.dy, self.p["exit.step"].shape()[0]
        if style == "instance":
            out = []
            for words in sentences:
                dy.renew_cg()
                h = dy.zeros(dim)
                for t, word in enumerate(words):
                    h, probs = self._exit_step(h, word)
                    p = probs.npvalue()
                    if p.max() > self.threshold or t == len(words) - 1:
                        out.append([t + 1, int(np.argmax(p))])
                        break
            return out
        dy.renew_cg()
        hs = [dy.zeros(dim) for _ in sentences]
        decided: list[list[int]] = [[] for _ in sentences]
        alive, t = list(range(len(sentences))), 0
        while alive:
            probs = []
            for i in alive:
                hs[i], pr = self._exit_step(hs[i], sentences[i][t])
                probs.append(pr)
            dy.forward(probs)
            t += 1
            still = []
            for i, e in zip(alive, probs, strict=True):
                p = e.npvalue()
                if p.max() > self.threshold or t == len(sentences[i]):
                    decided[i] = [t, int(np.argmax(p))]
                else:
                    still.append(i)
            alive = still
        return decided


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", required=True, help=".npz of both models' arrays")
    ap.add_argument("--autobatch", type=int, choices=(0, 1), required=True)
    ap.add_argument("--bos", type=int, required=True)
    ap.add_argument("--eos", type=int, required=True)
    ap.add_argument("--threshold", type=float, required=True)
    ap.add_argument("--mem", default="1024")
    args = ap.parse_args(argv)
    with np.load(args.params) as npz:
        arrays = {k: np.ascontiguousarray(npz[k], dtype=np.float32) for k in npz.files}
    dy = init_dynet(args.autobatch, mem=args.mem)
    peer = Peer(dy, arrays, args.bos, args.eos, args.threshold)
    print(json.dumps({"ready": True, "autobatch": args.autobatch}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req["style"] not in STYLES or req["demo"] not in ("greedy", "exit"):
                raise ValueError(f"style {req['style']!r} / demo {req['demo']!r}: styles "
                                 f"{list(STYLES)}, demos ['greedy', 'exit']")
        except (ValueError, KeyError, TypeError) as e:
            print(json.dumps({"error": f"bad request: {e}"}), flush=True)
            continue
        t0 = time.perf_counter()
        if req["demo"] == "greedy":
            outputs: Any = peer.greedy(req["style"], req["sources"], req["limits"])
        else:
            outputs = peer.early_exit(req["style"], req["sentences"])
        seconds = time.perf_counter() - t0
        print(json.dumps({"seconds": seconds, "outputs": outputs}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
