"""Hand-batched PyTorch peers: what a PyTorch practitioner writes instead of a batching library.

Every model takes the same parameters as the edbatch workload (``init_params`` seeded with 0,
the same names) and computes the same loss (the sum of every per-node / per-token negative
log-likelihood), so its loss on a mini-batch equals edbatch's reference loss:

* **Tree-LSTM**, level by level (as DGL propagates, in plain PyTorch): all nodes of the
  mini-batch sorted by height; every leaf in one embedding + GEMM, then one cell call per
  height over all nodes of that height, children gathered by index from ``h`` / ``c``
  buffers that each level writes a slice of; one GEMM + cross-entropy for every node's loss.
* **Lattice-LSTM**, level by level: states sorted by their longest path from the start
  state; per level one LSTM step per arc kind (character / word arcs have their own
  embeddings and weights) over all arcs into that level's states, the arcs' outputs summed
  into their states with ``index_add``; one loss GEMM over every state.
* **BiLSTM tagger**: one ``nn.LSTM(num_layers=2, bidirectional=True)`` over a packed padded
  mini-batch (its weights are the workload's, gate rows reordered from edbatch's
  ``i f o u`` to torch's ``i f g o``, copied once), then the per-token MLP loss on the valid
  positions.

The element-wise ``tanh`` of the Tree- and Lattice-LSTM cells is edbatch's
:func:`~edbatch.executor.kernels.fast_tanh` (the same arithmetic as the edbatch kernels, so
the rows compare batching, not a tanh implementation); ``nn.LSTM`` uses its own kernels.
Embedding lookups have sparse (row) gradients, as edbatch's training and DyNet's lookups.

Each workload's model lives in ``benchmarks/peers/<name>.py`` (its ``HandBatched``), found by
the workload's name; its ``Unbatched``, where it has one, is per-instance PyTorch node by node
(the ``pytorch_unbatched`` contender, the baseline the seeds' speedups divide by). Each model
is a :class:`HandBatched`: ``prepare(instances)`` builds the index arrays of a mini-batch
(numpy; the ``construction`` phase) and ``forward(prepared)`` returns the loss.

TorchFold (``torchfold`` 0.1.0 on PyPI, the dynamic-batching helper for PyTorch) is tried by
:func:`torchfold_status`: on torch >= 1 its ``Fold.add`` evaluates ``torch.tensor._TensorBase``
(torch 0.3's tensor base class; ``torch.tensor`` is now a function), so every ``add`` raises
``AttributeError`` before anything is batched.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["HandBatched", "PerInstance", "hand_batched_models", "levels", "make_hand_batched",
           "lstm_step", "make_unbatched", "torchfold_status", "unbatched_models"]


class HandBatched:
    """A hand-batched model over one workload's parameters (see the module docstring)."""

    def __init__(self, wl: Any, params: Mapping[str, Tensor]) -> None:
        self.wl, self.params = wl, params

    def prepare(self, instances: Sequence[Any]) -> Any:
        """Index arrays of one mini-batch (the construction phase)."""
        raise NotImplementedError

    def forward(self, prepared: Any) -> Tensor:
        """The mini-batch loss (a scalar)."""
        raise NotImplementedError

    def parameters(self) -> list[Tensor]:
        """The tensors an optimizer step updates."""
        return list(self.params.values())

    def loss(self, instances: Sequence[Any]) -> Tensor:
        """``forward(prepare(instances))``."""
        return self.forward(self.prepare(instances))


class PerInstance(HandBatched):
    """A per-instance model (an ``Unbatched`` peer): nothing to prepare, ``forward`` walks
    the instances one by one."""

    def prepare(self, instances: Sequence[Any]) -> Sequence[Any]:
        return instances


def lstm_step(x: Tensor, h: Tensor, c: Tensor, w: Tensor, b: Tensor,
              tanh: Any = torch.tanh) -> tuple[Tensor, Tensor]:
    """One edbatch LSTM step on single rows, ``[i f o u] = W [x; h] + b``: ``(h', c')``."""
    i, f, o, u = F.linear(torch.cat([x, h]), w, b).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * tanh(u)
    return torch.sigmoid(o) * tanh(c), c


def levels(order_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:  # type: ignore[type-arg]
    """Stable sort by ``order_key``: ``(order, position of each item, level starts)``."""
    order = np.argsort(order_key, kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    starts = np.searchsorted(order_key[order], np.arange(int(order_key.max()) + 2)).tolist()
    return order, pos, starts


@functools.cache
def hand_batched_models() -> dict[str, type[HandBatched]]:
    """Workload name -> hand-batched model class: the ``HandBatched`` of every
    ``benchmarks/peers/<name>.py`` (those modules import this one, so found on first use)."""
    from benchmarks.peers import find_peers

    return find_peers("HandBatched")


def make_hand_batched(wl: Any, params: Mapping[str, Tensor]) -> HandBatched | None:
    """The hand-batched model of ``wl`` (``None`` if there is none for it)."""
    cls = hand_batched_models().get(wl.name)
    return None if cls is None else cls(wl, params)


@functools.cache
def unbatched_models() -> dict[str, type[HandBatched]]:
    """Workload name -> per-instance PyTorch model class: the ``Unbatched`` of every
    ``benchmarks/peers/<name>.py`` that has one."""
    from benchmarks.peers import find_peers

    return find_peers("Unbatched")


def make_unbatched(wl: Any, params: Mapping[str, Tensor]) -> HandBatched | None:
    """The per-instance PyTorch model of ``wl`` (``None`` if there is none for it)."""
    cls = unbatched_models().get(wl.name)
    return None if cls is None else cls(wl, params)


def torchfold_status() -> str | None:
    """``None`` if TorchFold batches a one-node fold on this torch, else why not (the
    exception, verbatim)."""
    try:
        import torchfold
    except ImportError as e:
        return f"torchfold is not installed ({e}); pip install torchfold"

    class _Probe(nn.Module):
        def leaf(self, words: Tensor) -> Tensor:
            return words.float().unsqueeze(1)

    try:
        fold = torchfold.Fold()
        node = fold.add("leaf", 1)
        fold.apply(_Probe(), [[node]])
    except Exception as e:  # any failure is the recorded reason
        return f"torchfold {getattr(torchfold, '__version__', '0.1.0')} on torch " \
               f"{torch.__version__}: Fold.add raised {type(e).__name__}: {e}"
    return None
