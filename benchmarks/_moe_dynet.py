"""DyNet 2.2 peer of the MoE training step (``benchmarks/moe_routing.py``), as a worker.

A DyNet user routes on the gate's values by forcing evaluation. Interleaved by hand, as
``benchmarks/_decode_dynet.py``'s ``interleaved`` style: one graph per mini-batch; per layer
every token's noisy gate logits of every sentence are built, one ``dy.forward`` computes
them (batched by autobatch), each token's ``npvalue()`` is read and its top ``k`` experts
chosen in Python, then the experts' and the combination's expressions are built; finally
one ``pickneglogsoftmax`` per token, one ``dy.esum``, ``backward`` and a ``SimpleSGDTrainer``
update at learning rate 0. Same equations and parameters as ``examples/moe_routing.py``
(``x + sum_j softmax(H[top])_j e_j(x)``, ``e(x) = W2 relu(W1 x + b1) + b2``, gate noise
``n * softplus(x W_noise)`` with ``n`` the workload's hashed normal samples, recomputed
here with numpy: this worker imports no torch).

Protocol (:class:`benchmarks._dynet_server.DynetServer`): ``python benchmarks/_moe_dynet.py
--params P.npz --dim D --noise-round R [--max-sentences N]`` prints ``{"ready": ...}``,
then answers each stdin line ``{"mode": "train", "batch": 0, "indices": [...], "split":
"train"}`` with the pass's phase seconds and its loss.
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
from edbatch.workloads.moe import MoETagger

__all__ = ["gate_noise", "main", "train_step"]

_M32 = np.uint64(0xFFFFFFFF)


def _fmix32(h: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & _M32
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & _M32
    return h ^ (h >> np.uint64(16))  # type: ignore[no-any-return]


def gate_noise(keys: np.ndarray, experts: int) -> np.ndarray:  # type: ignore[type-arg]
    """:func:`edbatch.workloads._moe_math.gate_noise` in numpy (float32): ``[B, experts]``."""
    k = keys.reshape(-1, 1).astype(np.int64).astype(np.uint64)
    h = _fmix32((k & _M32) ^ _fmix32((k >> np.uint64(32)) & _M32))
    count = np.arange(2 * experts, dtype=np.uint64)
    with np.errstate(over="ignore"):
        u = (_fmix32((h + count * np.uint64(0x9E3779B9)) & _M32).astype(np.float32)
             + np.float32(0.5)) / np.float32(2.0 ** 32)
    u1, u2 = u[:, :experts], u[:, experts:]
    return (np.sqrt(np.float32(-2.0) * np.log(u1)) *  # type: ignore[no-any-return]
            np.cos(np.float32(2.0 * np.pi) * u2)).astype(np.float32)


class Peer:
    """The DyNet parameters (workload names) and the training step."""

    def __init__(self, dy: Any, workload: MoETagger, arrays: dict[str, np.ndarray]) -> None:
        self.dy, self.w = dy, workload
        self.model = dy.ParameterCollection()
        names = workload.names
        self.p = {n: (self.model.add_lookup_parameters if n == names["emb"] else
                      self.model.add_parameters)(a.shape, init=a) for n, a in arrays.items()}
        self.trainer = dy.SimpleSGDTrainer(self.model, learning_rate=0.0)

    def _expert(self, lay: int, a: int, x: Any) -> Any:
        dy = self.dy
        w1, b1, w2, b2 = (self.p[n] for n in self.w.names["experts"][lay][a])
        return dy.affine_transform([b2, w2, dy.rectify(dy.affine_transform([b1, w1, x]))])

    def build(self, insts: Sequence[Any]) -> Any:
        """The mini-batch's summed loss expression (routing read per layer)."""
        dy, w, names = self.dy, self.w, self.w.names
        dy.renew_cg()
        emb = self.p[names["emb"]]
        xs = [dy.lookup(emb, t) for i in insts for t in i.word_ids]
        keys = np.concatenate([np.asarray(w.key_lists(i), np.int64).T for i in insts])
        for lay in range(w.layers):
            noise = gate_noise(keys[:, lay], w.experts)
            wg, wn = self.p[names["gate"][lay]], self.p[names["noise"][lay]]
            hs = [wg * x + dy.cmult(dy.inputVector(n.tolist()), -dy.log_sigmoid(-(wn * x)))
                  for x, n in zip(xs, noise, strict=True)]
            dy.forward(hs)  # every token's gate at once (batched with autobatch)
            new = []
            for x, h in zip(xs, hs, strict=True):
                top = np.argsort(-h.npvalue(), kind="stable")[:w.top_k].tolist()
                g = dy.softmax(dy.concatenate([dy.pick(h, a) for a in top]))
                outs = dy.concatenate_cols([self._expert(lay, a, x) for a in top])
                new.append(x + outs * g)  # x + sum_j g_j e_j(x)
            xs = new
        out, out_b = self.p[names["out"]], self.p[names["out_b"]]
        tags = [t for i in insts for t in i.tag_ids]
        return dy.esum([dy.pickneglogsoftmax(dy.affine_transform([out_b, out, x]), t)
                        for x, t in zip(xs, tags, strict=True)])


def train_step(peer: Peer, insts: Sequence[Any]) -> tuple[dict[str, float], float]:
    """One timed training step: (phase seconds, loss)."""
    clock = time.perf_counter
    t0 = clock()
    loss = peer.build(insts)
    t1 = clock()
    value = loss.value()
    t2 = clock()
    loss.backward()
    t3 = clock()
    peer.trainer.update()
    return ({"construction": t1 - t0, "forward": t2 - t1, "backward": t3 - t2,
             "update": clock() - t3}, float(value))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", required=True, help=".npz of the model's parameters")
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--noise-round", type=int, default=1)
    ap.add_argument("--max-sentences", type=int, default=0, help="as the model's (0: all)")
    ap.add_argument("--autobatch", type=int, choices=(0, 1, 2), default=1)
    args = ap.parse_args(argv)
    workload = MoETagger(dim=args.dim, expert_dim=args.dim,
                         max_sentences=args.max_sentences or None)
    workload.set_noise_round(args.noise_round)
    with np.load(args.params) as npz:
        arrays = {n: np.ascontiguousarray(npz[n], dtype=np.float32) for n in npz.files}
    if set(arrays) != set(workload.param_shapes()):
        print(f"_moe_dynet: error: {args.params} does not hold the MoE parameters of dim "
              f"{args.dim}; write MoE.params() with benchmarks.dynet_peer.save_params",
              file=sys.stderr)
        return 2
    peer = Peer(init_dynet(args.autobatch), workload, arrays)
    print(json.dumps({"ready": True, "contender": f"dynet_autobatch{args.autobatch}",
                      "sizes": []}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        insts = [workload.load(str(req.get("split", "train")))[int(i)]
                 for i in req["indices"]]
        phases, loss = train_step(peer, insts)
        print(json.dumps({**phases, "loss": loss}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
