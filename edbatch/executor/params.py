"""Deterministic parameter initialisation from a workload's :meth:`param_shapes`.

* embedding tables (see :func:`is_embedding`): uniform in ``[-0.1, 0.1]``;
* other tensors of two or more dimensions (weights ``(out, in)``): Glorot / Xavier uniform,
  bound ``sqrt(6 / (fan_in + fan_out))``;
* one-dimensional tensors (biases, e.g. ``tree_lstm.b_f``): zeros.

Values are drawn on the CPU in ``float32`` from the given generator, in ``param_shapes()``
order, then moved to ``device`` / ``dtype``; so they do not depend on the device.
"""

from __future__ import annotations

import math

import torch

from edbatch.workloads.base import Workload

__all__ = ["EMBEDDING_RANGE", "init_params", "is_embedding"]

#: Embedding tables are drawn uniformly from ``[-EMBEDDING_RANGE, EMBEDDING_RANGE]``.
EMBEDDING_RANGE = 0.1


def is_embedding(name: str) -> bool:
    """Whether parameter ``name`` is an embedding table (a lookup reads rows of it).

    The workloads name their tables ``<workload>.E`` / ``.E_*`` (trees, MV-RNN's ``E_v`` and
    ``E_M``) or ``<workload>.*emb`` (``lattice_lstm.char_emb``, ``bilstm.emb``,
    ``seq2seq.src_emb``).

    Example:
        >>> [is_embedding(n) for n in ("tree_lstm.E", "mvrnn.E_M", "bilstm.emb",
        ...                            "seq2seq.enc_e2h", "tree_lstm.W_iou")]
        [True, True, True, False, False]
    """
    short = name.rsplit(".", 1)[-1]
    return short == "E" or short.startswith("E_") or short.endswith("emb")


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator | None
             ) -> torch.Tensor:
    return (torch.rand(shape, generator=generator, dtype=torch.float32) * 2.0 - 1.0) * bound


def init_params(workload: Workload, generator: torch.Generator | None = None, *,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                ) -> dict[str, torch.nn.Parameter]:
    """Create every parameter of ``workload`` (same names at both granularities).

    Args:
        workload: the workload; its :meth:`~edbatch.workloads.base.Workload.param_shapes`
            names and shapes the parameters.
        generator: a CPU ``torch.Generator``; the same seed gives the same values. ``None``
            uses torch's global generator.
        device: where the parameters live.
        dtype: their floating-point type.

    Returns:
        Parameter name -> ``torch.nn.Parameter`` (``requires_grad=True``).

    Example:
        >>> from edbatch.workloads.tree_gru import TreeGRU
        >>> p = init_params(TreeGRU(embed_dim=4, hidden_dim=3), torch.Generator().manual_seed(0))
        >>> p["tree_gru.U_rz"].shape, p["tree_gru.U_rz.b"].count_nonzero().item()
        (torch.Size([9, 6]), 0)
    """
    out: dict[str, torch.nn.Parameter] = {}
    for name, shape in workload.param_shapes().items():
        if len(shape) < 2:
            value = torch.zeros(shape, dtype=torch.float32)
        elif is_embedding(name):
            value = _uniform(shape, EMBEDDING_RANGE, generator)
        else:
            receptive = math.prod(shape[2:])
            fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
            value = _uniform(shape, math.sqrt(6.0 / max(fan_in + fan_out, 1)), generator)
        out[name] = torch.nn.Parameter(value.to(device=device, dtype=dtype))
    return out
