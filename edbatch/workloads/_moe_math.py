"""The MoE workload's maths in PyTorch (:mod:`edbatch.workloads.moe`): gate noise, gates,
experts, the combination and the vectorised routing the graph builder uses.

Apart so that importing the workload registry stays torch-free (the DyNet worker of the
benchmarks imports it); :mod:`edbatch.workloads.moe` re-exports these names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from edbatch.workloads._moe_names import param_names

__all__ = ["combine", "expert_ffn", "gate_logits", "gate_noise", "route", "unpack_choice"]

_M32 = 0xFFFFFFFF


def _fmix32(h: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in ``[0, 2^32)``
    (products wrap modulo ``2^64``; the low 32 bits are kept)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def gate_noise(keys: Tensor, experts: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[B, experts]`` standard normal samples, a deterministic function of the int64
    ``keys`` (>= 0): hashed uniforms through Box-Muller. Same keys, same noise, on any
    batch composition."""
    keys = keys.reshape(-1, 1).to(torch.int64)
    h = _fmix32((keys & _M32) ^ _fmix32((keys >> 32) & _M32))
    count = torch.arange(2 * experts, dtype=torch.int64, device=keys.device)
    u = (_fmix32((h + count * 0x9E3779B9) & _M32).to(dtype) + 0.5) / 2.0 ** 32
    u1, u2 = u[:, :experts], u[:, experts:]
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def gate_logits(x: Tensor, w_gate: Tensor, w_noise: Tensor, keys: Tensor) -> Tensor:
    """``H = x W_g^T + n * softplus(x W_noise^T)``; rows whose key is negative get ``n = 0``."""
    clean = F.linear(x, w_gate)
    noisy = keys >= 0
    if keys.device.type == "cpu" and not bool(noisy.any()):  # elsewhere: no host sync
        return clean
    n = gate_noise(keys.clamp(min=0), w_gate.shape[0], x.dtype)
    n = n * noisy.reshape(-1, 1).to(x.dtype)
    return clean + n * F.softplus(F.linear(x, w_noise))


def expert_ffn(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """``W2 relu(W1 x + b1) + b2``."""
    return F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)


def unpack_choice(attrs: Tensor, experts: int, k: int) -> Tensor:
    """``[B, k]`` chosen experts of packed ``attrs``."""
    powers = experts ** torch.arange(k, dtype=torch.int64, device=attrs.device)
    return torch.div(attrs.reshape(-1, 1), powers, rounding_mode="floor") % experts


def combine(logits: Tensor, x: Tensor, outs: Sequence[Tensor], chosen: Tensor) -> Tensor:
    """``x + sum_j softmax(H[chosen])_j outs[j]`` (``chosen`` ``[B, k]``, in ``outs`` order)."""
    w = torch.softmax(logits.gather(1, chosen), dim=1)
    y = x
    for j, out in enumerate(outs):
        y = y + w[:, j:j + 1] * out
    return y


def route(params: Mapping[str, Tensor], words: Tensor, keys: Tensor, layers: int,
          experts: int, k: int) -> tuple[list[Tensor], Tensor]:
    """A whole set of tokens through the model, vectorised: the ``[T, k]`` chosen experts of
    each layer (descending logits) and the final ``[T, D]`` states. ``keys`` is
    ``[T, layers]`` (the gate noise keys)."""
    names = param_names(layers, experts)
    x = F.embedding(words, params[names["emb"]])
    routes = []
    for lay in range(layers):
        h = gate_logits(x, params[names["gate"][lay]], params[names["noise"][lay]],
                        keys[:, lay])
        top = h.topk(k, dim=1).indices
        routes.append(top)
        outs = [x.new_zeros(x.shape) for _ in range(k)]
        for a in range(experts):
            for j in range(k):
                rows = (top[:, j] == a).nonzero().reshape(-1)
                if len(rows):
                    outs[j] = outs[j].index_copy(
                        0, rows, expert_ffn(x[rows], *(params[n] for n in
                                                       names["experts"][lay][a])))
        x = combine(h, x, outs, top)
    return routes, x
