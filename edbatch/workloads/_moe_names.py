"""The MoE workload's pure-Python helpers (no torch): gate noise keys, packed expert choices
and parameter names (:mod:`edbatch.workloads.moe`, :mod:`edbatch.workloads._moe_math`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edbatch.errors import GraphError, is_integer

__all__ = ["noise_key", "pack_choice", "param_names"]


def noise_key(noise_round: int, sentence: int, token: int, layer: int) -> int:
    """The gate noise key of one (round, sentence, token, layer); ``-1`` (no noise) when
    ``noise_round < 0``."""
    if noise_round < 0:
        return -1
    return ((noise_round * (1 << 24) + sentence) * (1 << 12) + token) * 16 + layer


def pack_choice(chosen: Sequence[int], experts: int) -> int:
    """The attr of a combine node: ``sum_j a_j * experts^j``.

    Raises:
        GraphError: a chosen expert that is no integer in ``0 .. experts - 1``.
    """
    for j, a in enumerate(chosen):
        if not is_integer(a) or not 0 <= a < experts:
            raise GraphError(f"pack_choice: choice {j} is {a!r}, expected an expert index in "
                             f"0..{experts - 1}")
    return sum(int(a) * experts ** j for j, a in enumerate(chosen))


def param_names(layers: int, experts: int) -> dict[str, Any]:
    """Parameter names: ``emb``, ``out``/``out_b``, per layer ``gate``/``noise`` and per
    layer the ``(W1, b1, W2, b2)`` of each expert."""
    return {"emb": "moe.emb", "out": "moe.out", "out_b": "moe.out.b",
            "gate": [f"moe.gate{lay}.W" for lay in range(layers)],
            "noise": [f"moe.gate{lay}.W_noise" for lay in range(layers)],
            "experts": [[tuple(f"moe.expert{lay}.{a}.{p}" for p in ("W1", "b1", "W2", "b2"))
                         for a in range(experts)] for lay in range(layers)]}
