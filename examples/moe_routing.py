"""The ``moe`` workload's model with its routing decided inside the per-sentence code.

``python examples/moe_routing.py``: trains the sparsely gated mixture-of-experts UPOS tagger
of :mod:`edbatch.workloads.moe` (noisy top-k gating, Shazeer et al. 2017) on EWT sentences.
Per sentence, a plain Python program records the gates of every token of a layer, asks for
each token's ``k`` largest gates (``top = yield topk(gates, k)``: the runtime takes one
``topk`` over every sentence's gate rows) and records the expert calls and their
combination; then the next layer. ``run_programs`` runs
every sentence of the mini-batch to that read, computes all gates as one batch, hands the
values back and runs the routed experts batched across all sentences (every expert is an op
type: all tokens routed to expert ``a`` of a layer run as one call). One synchronisation per
layer and mini-batch, one model function, one backward. The combination weights are the
recorded gate's outputs, so gradients reach the gate (the values read to route are detached).

The parameters carry the workload's names (:meth:`MoE.params`), so the same tensors run the
workload's graphs through the executor, the per-token reference below and the peers of
``benchmarks/moe_routing.py``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edbatch.api import DynamicBatch, route, topk
from edbatch.cli import positive, run
from edbatch.data.trees import load_trees
from edbatch.workloads.base import DATA_DIR
from edbatch.workloads.moe import (
    MoEInstance,
    MoETagger,
    combine,
    expert_ffn,
    gate_logits,
    pack_choice,
    unpack_choice,
)

__all__ = ["MoE", "main", "sentences"]


def sentences(limit: int) -> tuple[list[tuple[list[int], int]], int]:
    """The first ``limit`` SST train sentences as (word ids, sentiment label), and the
    vocabulary size (id 0: unknown); ``examples/early_exit.py`` reads them."""
    trees = load_trees(DATA_DIR / "trees" / "train.txt")[:limit]
    words = {w: i + 1 for i, w in enumerate(sorted({w for t in trees for w in t.leaves()}))}
    return [([words[w] for w in t.leaves()], t.label) for t in trees], len(words) + 1


class Gate(nn.Module):
    """Noisy gate logits (attr: the noise key, ``-1`` none)."""

    def __init__(self, w: Tensor, w_noise: Tensor) -> None:
        super().__init__()
        self.W, self.W_noise = nn.Parameter(w), nn.Parameter(w_noise)

    def forward(self, x: Tensor, keys: Tensor) -> Tensor:
        return gate_logits(x, self.W, self.W_noise, keys)


class Expert(nn.Module):
    """``W2 relu(W1 x + b1) + b2``."""

    def __init__(self, *weights: Tensor) -> None:
        super().__init__()
        self.W1, self.b1, self.W2, self.b2 = (nn.Parameter(w) for w in weights)

    def forward(self, x: Tensor) -> Tensor:
        return expert_ffn(x, self.W1, self.b1, self.W2, self.b2)


class Combine(nn.Module):
    """``x + sum_j softmax(H[a])_j e_j``; attr: the packed chosen experts."""

    def __init__(self, experts: int) -> None:
        super().__init__()
        self.experts = experts

    def forward(self, h: Tensor, x: Tensor, *rest: Tensor) -> Tensor:
        outs, attrs = rest[:-1], rest[-1]
        return combine(h, x, outs, unpack_choice(attrs, self.experts, len(outs)))


class Classify(nn.Module):
    """Per-token cross-entropy of ``W x + b`` against the tag (the attr)."""

    def __init__(self, w: Tensor, b: Tensor) -> None:
        super().__init__()
        self.W, self.b = nn.Parameter(w), nn.Parameter(b)

    def forward(self, x: Tensor, tags: Tensor) -> Tensor:
        return F.cross_entropy(F.linear(x, self.W, self.b), tags, reduction="none")


class MoE(nn.Module):
    """The workload's model as ``edbatch.api`` cells, initialised from ``params`` (workload
    names; default: the workload's seeded routing parameters)."""

    def __init__(self, workload: MoETagger, params: dict[str, Tensor] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        w, names = workload, workload.names
        p = {n: t.detach().clone().to(dtype)
             for n, t in (params or workload.routing_params).items()}
        self.workload, self.layers, self.k, self.experts = w, w.layers, w.top_k, w.experts
        self.embed = nn.Embedding.from_pretrained(p[names["emb"]], freeze=False)
        self.gates = nn.ModuleList(Gate(p[names["gate"][lay]], p[names["noise"][lay]])
                                   for lay in range(w.layers))
        self.expert_nets = nn.ModuleList(
            nn.ModuleList(Expert(*(p[n] for n in names["experts"][lay][a]))
                          for a in range(w.experts)) for lay in range(w.layers))
        self.classify = Classify(p[names["out"]], p[names["out_b"]])
        b = self.batch = DynamicBatch(dtype=dtype)
        d, e = w.dim, w.experts
        self.pows = [e ** j for j in range(w.top_k)]
        self.c_embed = b.cell(self.embed, "embed", [], d, takes_attr=True)
        self.c_gates = [b.cell(g, f"gate{lay}", [d], e, takes_attr=True)
                        for lay, g in enumerate(self.gates)]
        self.c_experts = [[b.cell(x, f"expert{lay}_{a}", [d], d) for a, x in enumerate(row)]
                          for lay, row in enumerate(self.expert_nets)]
        self.combiner = Combine(e)
        self.c_combine = b.cell(self.combiner, "combine", [e, d] + [d] * w.top_k, d,
                                takes_attr=True)
        self.c_loss = b.cell(self.classify, "loss", [d], (), takes_attr=True)

    def params(self) -> dict[str, Tensor]:
        """Every parameter under its workload name."""
        names, out = self.workload.names, {}
        out[names["emb"]] = self.embed.weight
        for lay in range(self.layers):
            out[names["gate"][lay]] = self.gates[lay].W
            out[names["noise"][lay]] = self.gates[lay].W_noise
            for a, net in enumerate(self.expert_nets[lay]):
                for n, t in zip(names["experts"][lay][a], (net.W1, net.b1, net.W2, net.b2),
                                strict=True):
                    out[n] = t
        out[names["out"]], out[names["out_b"]] = self.classify.W, self.classify.b
        return out

    def program(self, inst: MoEInstance) -> Generator[Any, Tensor, list[list[int]]]:
        """One sentence: per layer the gates, a read of their values, the routed experts and
        the combination; then per-token losses. Returns each layer's packed choices.

        Every step is recorded for all tokens of the sentence at once (``cell.map``, and
        ``route`` for the experts of every slot of the top-k: one node per token and slot,
        one list extension per column)."""
        keys, e = self.workload.key_lists(inst), self.experts
        xs = self.c_embed.map(attrs=inst.word_ids)
        chosen = []
        for lay in range(self.layers):
            gates = self.c_gates[lay].map(xs, attrs=keys[lay])
            top = yield topk(gates, self.k)  # per token its k experts: one topk per round
            packed = [a + e * c for a, c in top] if self.k == 2 else \
                [pack_choice(row, e) for row in top]
            outs = route(self.c_experts[lay], top, xs)  # per slot: its experts' nodes
            xs = self.c_combine.map(gates, xs, *outs, attrs=packed)
            chosen.append(packed)
        self.batch.add_loss(self.c_loss.map(xs, attrs=inst.tag_ids))  # every token's
        return chosen

    def run(self, instances: Sequence[MoEInstance], scheduler: str = "typewise_greedy",
            grad: bool = True, strategy: str = "naive") -> Any:
        """``run_programs`` over ``instances`` (the result: ``.loss``, ``.returns``...)."""
        return self.batch.run_programs([self.program(i) for i in instances], scheduler,
                                       grad=grad, strategy=strategy)

    def reference(self, inst: MoEInstance) -> tuple[Tensor, list[list[int]]]:
        """The same sentence token by token in plain PyTorch (the per-instance loop, through
        the same modules): summed loss and choices."""
        keys = self.workload.keys(inst)
        total = torch.zeros((), dtype=self.embed.weight.dtype)
        chosen: list[list[int]] = [[] for _ in range(self.layers)]
        for t, (w, tag) in enumerate(zip(inst.word_ids, inst.tag_ids, strict=True)):
            x = self.embed(torch.tensor([w]))
            for lay in range(self.layers):
                h = self.gates[lay](x, keys[t, lay:lay + 1])
                top = h[0].topk(self.k).indices.tolist()
                code = pack_choice(top, self.experts)
                outs = [self.expert_nets[lay][a](x) for a in top]
                x = self.combiner(h, x, *outs, torch.tensor([code]))
                chosen[lay].append(code)
            total = total + self.classify(x, torch.tensor([tag]))[0]
        return total, chosen


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train on EWT sentences with gate noise; return the mean per-token loss per epoch."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=positive, default=256)
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--epochs", type=positive, default=3)
    p.add_argument("--dim", type=positive, default=32)
    p.add_argument("--scheduler", default="typewise_greedy")
    args = p.parse_args(argv)
    workload = MoETagger(dim=args.dim, expert_dim=args.dim, max_sentences=args.sentences)
    data = workload.load("train")
    model = MoE(workload)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, tokens = [], sum(len(i) for i in data)
    for epoch in range(1, args.epochs + 1):
        workload.set_noise_round(epoch)
        start, total = time.perf_counter(), 0.0
        for i in range(0, len(data), args.batch_size):
            chunk = data[i:i + args.batch_size]
            out = model.run(chunk, args.scheduler)
            opt.zero_grad()
            (out.loss / sum(len(s) for s in chunk)).backward()
            opt.step()
            total += out.loss.item() / tokens
        losses.append(total)
        print(f"epoch {epoch}: loss/token {total:.3f}  ({out.syncs} syncs, "
              f"{out.num_batches} batches per mini-batch; {time.perf_counter() - start:.1f}s)")
    return losses


if __name__ == "__main__":
    run(main)
