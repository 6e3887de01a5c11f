"""Sparsely gated mixture-of-experts tagger (Shazeer et al. 2017) over UD English EWT words.

Each sentence of ``data/ud_ewt/`` is tagged token by token with its universal POS tag (17
classes; the task metric is token accuracy, against the majority baseline of always saying
``NOUN``). With ``D = dim``, ``E = experts``, ``k = top_k`` and ``L = layers``, per token:

* **embed**: ``x^0 = Emb[w]`` (built-in ``lookup`` of ``moe.emb``; id 0 = unknown word).
* **gate** (layer ``l``): Shazeer's noisy top-k gating
  ``H(x) = x W_g^T + n * softplus(x W_noise^T)`` with ``n ~ N(0, 1)`` per expert in training
  and ``n = 0`` otherwise. The noise is a function of an integer key (the gate node's attr;
  ``-1``: no noise), see :func:`gate_noise`, so a graph and every reference reproduce it.
* **routing**: the experts ``a_1..a_k`` of the ``k`` largest ``H`` (descending).
* **experts** (one op type per layer and expert): ``e_a(x) = W2 relu(W1 x + b1) + b2``.
* **combine** (residual): ``x^{l+1} = x + sum_j softmax(H_{a_1..a_k})_j e_{a_j}(x)``: the
  softmax over the kept logits is Shazeer's ``softmax(KeepTopK(H, k))``. The chosen experts
  travel in the attr (:func:`pack_choice`), so the gradient reaches ``W_g`` and ``W_noise``.
* **loss**: ``cross_entropy(W_o x^L + b_o, upos)``.

Shazeer's load-balancing losses (importance and load) are not part of the loss.

**Routing in the graph builder.** A node graph follows the routing (only the chosen experts
run), so :meth:`MoETagger.emit` needs each token's decisions. It computes them with
:func:`route`, a plain PyTorch forward of the equations above under the workload's own
parameters :attr:`MoETagger.routing_params`: seeded (``seed``; Glorot matrices, zero biases,
embedding rows uniform in ``[-0.1, 0.1]``) unless a trainer hands its current parameters to
:meth:`MoETagger.set_routing_params` (which also forgets the cached graphs). The gates are
Glorot-initialised, not zero as in Shazeer's paper, so that without noise the routing is
not the same two experts for every token. Per-instance code that reads the gate's values
(``edbatch.api``'s ``run_programs``, ``examples/moe_routing.py``) decides the same routes.

Op types (cell granularity only): ``lookup.moe.emb``, ``moe.gate<l>``, ``moe.expert<l>.<a>``,
``moe.combine`` (shared by the layers; operands ``(H, x, e_1..e_k)``, attr
:func:`pack_choice`), ``moe.loss`` (attr = tag) and ``loss_sum``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edbatch.data._text import parsed
from edbatch.data.ud import UPOS_TAGS, Treebank, load_conllu
from edbatch.errors import GraphError
from edbatch.graph import GraphBuilder, OpType
from edbatch.workloads._moe_names import noise_key, pack_choice, param_names
from edbatch.workloads._seq import check_positive, frequency_index
from edbatch.workloads.base import Workload
from edbatch.workloads.primitives import OpSet

if TYPE_CHECKING:
    from torch import Tensor

#: (the torch maths, ``combine``, ``expert_ffn``, ``gate_logits``, ``gate_noise``, ``route``
#: and ``unpack_choice``, live in :mod:`edbatch.workloads._moe_math`; importing them from
#: here works too, through the module ``__getattr__``)
__all__ = ["MoEInstance", "MoETagger", "noise_key", "pack_choice", "param_names"]

_FILES = {"train": "en_ewt-ud-train.conllu", "dev": "en_ewt-ud-dev.conllu",
          "test": "en_ewt-ud-test.conllu"}


_MATHS = ("combine", "expert_ffn", "gate_logits", "gate_noise", "route", "unpack_choice")


def __getattr__(name: str) -> Any:
    """The torch maths (:mod:`edbatch.workloads._moe_math`), imported on first use."""
    if name in _MATHS:
        from edbatch.workloads import _moe_math
        return getattr(_moe_math, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- data
def _treebank(path: str) -> Treebank:
    return parsed(load_conllu, path)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, eq=False)
class MoEInstance:
    """One sentence: its split, index, word ids and UPOS tag ids."""

    split: str
    index: int
    word_ids: tuple[int, ...]
    tag_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.word_ids)


class MoETagger(Workload):
    """Sparsely gated MoE UPOS tagger on EWT (see the module docstring).

    Example:
        >>> w = MoETagger(dim=8, expert_dim=8, max_sentences=4)
        >>> g = w.minibatch("dev", range(2))
        >>> sum(len(w.load("dev")[i]) for i in range(2)) * 10 + 1 == g.num_nodes
        True
    """

    name = "moe"
    real_data = True
    granularities = ("cell",)

    @classmethod
    def test_kwargs(cls, dim: int = 8, hidden: int | None = None, *, short: bool = False
                    ) -> dict[str, Any]:
        """Small states, four experts, at most 8 sentences of at most 12 words per split."""
        return {"dim": dim, "expert_dim": dim if hidden is None else hidden, "experts": 4,
                "max_sentences": 8, "max_words": 6 if short else 12, "vocab_size": 200}

    def __init__(self, granularity: str = "cell", dim: int = 64, expert_dim: int = 64,
                 experts: int = 8, top_k: int = 2, layers: int = 2,
                 vocab_size: int | None = 10000, max_sentences: int | None = None,
                 max_words: int | None = None, seed: int = 0,
                 data_dir: str | Path | None = None) -> None:
        """Read EWT, build the word vocabulary (train words by frequency), declare the ops.

        Args:
            granularity: ``"cell"`` (the only one).
            dim: token state width ``D``.
            expert_dim: hidden width of an expert's feed-forward network.
            experts: experts per layer ``E``.
            top_k: experts per token ``k`` (``1 <= k <= E``).
            layers: MoE layers ``L``.
            vocab_size: word ids including the unknown id 0; ``None`` keeps every word.
            max_sentences: keep the first this many sentences of each split (after
                ``max_words``).
            max_words: drop sentences longer than this.
            seed: seed of :attr:`routing_params`.
            data_dir: folder holding ``ud_ewt/``; defaults to ``data/``.
        """
        super().__init__(granularity, data_dir)
        if self.granularity != "cell":
            raise GraphError("workload 'moe' has only granularity 'cell'; pass "
                             "granularity='cell'")
        check_positive(dim=dim, expert_dim=expert_dim, experts=experts, top_k=top_k,
                       layers=layers, vocab_size=vocab_size, max_sentences=max_sentences,
                       max_words=max_words)
        if top_k > experts or layers > 16:
            raise GraphError(f"moe: top_k={top_k} must be <= experts={experts} and "
                             f"layers={layers} <= 16")
        self.dim, self.expert_dim, self.experts = dim, expert_dim, experts
        self.top_k, self.layers, self.seed = top_k, layers, seed
        self.max_sentences, self.max_words = max_sentences, max_words
        train = self._sentences("train")
        self.word_index = frequency_index((w for s in train for w in s.words), vocab_size)
        self.num_words = len(self.word_index) + 1
        self.tag_names = UPOS_TAGS
        self.tag_index = {t: i for i, t in enumerate(UPOS_TAGS)}
        #: Gate noise round: ``-1`` (default) no noise; a trainer sets the epoch.
        self.noise_round = -1
        self._declare_vocab()
        self.names = param_names(layers, experts)
        self.routing_params = self._seeded_params()
        self._routes: dict[tuple[str, int], list[list[int]]] = {}
        self._key_lists: dict[tuple[str, int], list[list[int]]] = {}

    # ------------------------------------------------------------------ vocabulary
    def _declare_cells(self, ops: OpSet) -> None:
        d, f, e = self.dim, self.expert_dim, self.experts
        self._lookup = ops.lookup("moe.emb", self.num_words, d)
        names = param_names(self.layers, e)
        self._gates, self._experts = [], []
        for lay in range(self.layers):
            gate = {names["gate"][lay]: (e, d), names["noise"][lay]: (e, d)}
            self._gates.append(ops.add(OpType(f"moe.gate{lay}", "moe.gate", ((d,),), (e,),
                                              tuple(gate)), gate))
            row = []
            for a in range(e):
                w1, b1, w2, b2 = names["experts"][lay][a]
                p = {w1: (f, d), b1: (f,), w2: (d, f), b2: (d,)}
                row.append(ops.add(OpType(f"moe.expert{lay}.{a}", "moe.expert", ((d,),), (d,),
                                          tuple(p)), p))
            self._experts.append(row)
        self._combine = ops.add(OpType("moe.combine", "moe.combine",
                                       ((e,), (d,)) + ((d,),) * self.top_k, (d,)))
        out = {"moe.out": (len(UPOS_TAGS), d), "moe.out.b": (len(UPOS_TAGS),)}
        self._loss = ops.add(OpType("moe.loss", "moe.loss", ((d,),), (1,), tuple(out)), out)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape."""
        return dict(self._params)

    def _seeded_params(self) -> dict[str, Tensor]:
        import torch
        gen = torch.Generator().manual_seed(self.seed)
        out = {}
        for name, shape in self._params.items():
            if name == "moe.emb":
                out[name] = torch.rand(shape, generator=gen) * 0.2 - 0.1
            elif len(shape) == 1:
                out[name] = torch.zeros(shape)
            else:
                bound = math.sqrt(6.0 / (shape[0] + shape[1]))
                out[name] = (torch.rand(shape, generator=gen) * 2 - 1) * bound
        return out

    def set_routing_params(self, params: Mapping[str, Tensor]) -> None:
        """Route with ``params`` (e.g. a trainer's current ones) from now on; cached routes
        and graphs are dropped."""
        missing = [n for n in self._params if n not in params]
        if missing:
            raise GraphError(f"set_routing_params: parameter {missing[0]!r} is missing; pass "
                             f"every parameter of the workload (init_params(workload))")
        self.routing_params = {n: params[n].detach().float().cpu() for n in self._params}
        self._routes.clear()
        self._cache.clear()

    def set_noise_round(self, noise_round: int) -> None:
        """Gate noise of round ``noise_round`` (``-1``: none) from now on; drops caches."""
        if noise_round != self.noise_round:
            self.noise_round = noise_round
            self._key_lists.clear()
            self._routes.clear()
            self._cache.clear()

    # ------------------------------------------------------------------ data
    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "dev", "test")``: EWT's own split."""
        return tuple(_FILES)

    def _sentences(self, split: str) -> list[Any]:
        sents = list(_treebank(str(self.data_dir / "ud_ewt" / _FILES[split])))
        if self.max_words is not None:
            sents = [s for s in sents if len(s.words) <= self.max_words]
        if self.max_sentences is not None:
            sents = sents[:self.max_sentences]
        return sents

    def _load(self, split: str) -> list[MoEInstance]:
        words, tags = self.word_index, self.tag_index
        return [MoEInstance(split, i, tuple(words.get(w, 0) for w in s.words),
                            tuple(tags[t] for t in s.upos))
                for i, s in enumerate(self._sentences(split))]

    def keys(self, inst: MoEInstance) -> Tensor:
        """``[T, layers]`` gate noise keys of a sentence (``-1`` without noise)."""
        import torch
        shape = (len(inst), self.layers)
        if self.noise_round < 0:
            return torch.full(shape, -1, dtype=torch.int64)
        base = noise_key(self.noise_round, inst.index, 0, 0)  # + t * 16 + layer
        return base + (torch.arange(len(inst)).reshape(-1, 1) * 16
                       + torch.arange(self.layers).reshape(1, -1))

    def key_lists(self, inst: MoEInstance) -> list[list[int]]:
        """:meth:`keys` as one list of ints per layer (what a program passes as attrs),
        made once per sentence and noise round (shared: do not modify them)."""
        got = self._key_lists.get((inst.split, inst.index))
        if got is not None:
            return got
        n = len(inst)
        if self.noise_round < 0:
            got = [[-1] * n for _ in range(self.layers)]
        else:
            base = noise_key(self.noise_round, inst.index, 0, 0)
            got = [list(range(base + lay, base + lay + 16 * n, 16))
                   for lay in range(self.layers)]
        self._key_lists[(inst.split, inst.index)] = got
        return got

    def routes(self, inst: MoEInstance) -> list[list[list[int]]]:
        """Per layer, per token, the chosen experts (under :attr:`routing_params`)."""
        import torch

        from edbatch.workloads._moe_math import route
        key = (inst.split, inst.index)
        got = self._routes.get(key)
        if got is None:
            with torch.no_grad():
                routes, _ = route(self.routing_params, torch.tensor(inst.word_ids),
                                  self.keys(inst), self.layers, self.experts, self.top_k)
            got = self._routes[key] = [r.tolist() for r in routes]
        return got

    def route_all(self, instances: Sequence[MoEInstance]) -> None:
        """Route every token of ``instances`` in one vectorised forward (what :meth:`routes`
        does per sentence), e.g. before building a mini-batch."""
        import torch

        from edbatch.workloads._moe_math import route
        todo = [i for i in instances if (i.split, i.index) not in self._routes]
        if not todo:
            return
        words = torch.tensor([w for i in todo for w in i.word_ids])
        keys = torch.cat([self.keys(i) for i in todo])
        with torch.no_grad():
            routes, _ = route(self.routing_params, words, keys, self.layers, self.experts,
                              self.top_k)
        at = 0
        lists = [r.tolist() for r in routes]
        for inst in todo:
            n = len(inst)
            self._routes[(inst.split, inst.index)] = [r[at:at + n] for r in lists]
            at += n

    # ------------------------------------------------------------------ emission
    def emit(self, instance: MoEInstance, builder: GraphBuilder) -> list[int]:
        """Append one sentence's nodes (routed per token); return its per-token losses."""
        add, routes, e = builder.add, self.routes(instance), self.experts
        keys = self.keys(instance).tolist()
        losses = []
        for t, (w, tag) in enumerate(zip(instance.word_ids, instance.tag_ids, strict=True)):
            x = add(self._lookup, attr=w)
            for lay in range(self.layers):
                h = add(self._gates[lay], x, attr=keys[t][lay])
                chosen = routes[lay][t]
                outs = [add(self._experts[lay][a], x) for a in chosen]
                x = add(self._combine, h, x, *outs, attr=pack_choice(chosen, e))
            losses.append(add(self._loss, x, attr=tag))
        return losses

    def instances(self, split: str, indices: Sequence[int]) -> list[MoEInstance]:
        """The instances ``indices`` of ``split``."""
        data = self.load(split)
        return [data[int(i)] for i in indices]
