"""Deterministic parameter initialisation from a workload's :meth:`param_shapes`.

Each parameter gets the initialiser its kinds declare (:class:`~edbatch.executor.cell_kind.
Param`'s ``init``, read through the kernels of the vocabulary's op kinds):

* ``"embedding"`` (tables a lookup reads rows of): uniform in ``[-0.1, 0.1]``;
* ``"glorot"``, the default for two or more dimensions (weights ``(out, in)``): Glorot /
  Xavier uniform, bound ``sqrt(6 / (fan_in + fan_out))``;
* ``"zeros"``, the default for one dimension (biases, e.g. ``tree_lstm.b_f``).

Values are drawn on the CPU in ``float32`` from the given generator, in ``param_shapes()``
order, then moved to ``device`` / ``dtype``; so they do not depend on the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from edbatch.errors import GraphError
from edbatch.executor.cell_kind import cell_kind_of
from edbatch.executor.kernels import KERNELS, Kernel
from edbatch.workloads.base import Workload

__all__ = ["EMBEDDING_RANGE", "declared_inits", "embedding_params", "init_params",
           "is_embedding"]

#: Embedding tables are drawn uniformly from ``[-EMBEDDING_RANGE, EMBEDDING_RANGE]``.
EMBEDDING_RANGE = 0.1


def declared_inits(workload: Workload, kernels: Mapping[str, Kernel] | None = None
                   ) -> dict[str, str]:
    """Parameter name -> the initialiser a kind of ``workload.vocab`` declares for it
    (``kernels`` overrides registered kernels, as the executors' argument does).

    Parameters no cell kind declares an initialiser for (those of primitive kernels such as
    ``affine``) are absent: they get the default of their rank.

    Raises:
        GraphError: two op types read one parameter with different declared initialisers.
    """
    out: dict[str, str] = {}
    where: dict[str, str] = {}
    for op in workload.vocab:
        kernel = kernels.get(op.kind) if kernels is not None else None
        if kernel is None and op.kind in KERNELS:
            kernel = KERNELS.get(op.kind)
        cell = cell_kind_of(kernel)
        if cell is None or len(cell.params) != len(op.params):
            continue  # not a cell kind; a miscounted op type fails when it runs
        for name, q in zip(op.params, cell.params, strict=True):
            if q.init is None:
                continue
            if out.setdefault(name, q.init) != q.init:
                raise GraphError(
                    f"parameter {name!r} is declared init={out[name]!r} by op type "
                    f"{where[name]!r} but init={q.init!r} by op type {op.name!r} "
                    f"({cell.__name__}.{q.name}); make the declarations agree")
            where.setdefault(name, op.name)
    return out


def embedding_params(workload: Workload) -> set[str]:
    """The parameters of ``workload`` declared as embedding tables (``init="embedding"``)."""
    return {n for n, init in declared_inits(workload).items() if init == "embedding"}


def is_embedding(name: str) -> bool:
    """The old naming convention for embedding tables (``E``, ``E_*``, ``*emb``).

    Initialisation no longer uses it (the kinds declare their tables,
    :func:`embedding_params`); kept for callers that only have a name. The built-in
    workloads' tables follow it.

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


def _glorot(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    return _uniform(shape, math.sqrt(6.0 / max(fan_in + fan_out, 1)), generator)


def init_params(workload: Workload, generator: torch.Generator | None = None, *,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                kernels: Mapping[str, Kernel] | None = None
                ) -> dict[str, torch.nn.Parameter]:
    """Create every parameter of ``workload`` (same names at both granularities).

    Args:
        workload: the workload; its :meth:`~edbatch.workloads.base.Workload.param_shapes`
            names and shapes the parameters, its kinds declare their initialisers.
        generator: a CPU ``torch.Generator``; the same seed gives the same values. ``None``
            uses torch's global generator.
        device: where the parameters live.
        dtype: their floating-point type.
        kernels: op kind -> kernel overriding the registered ones (their cell kinds'
            declared initialisers count instead).

    Returns:
        Parameter name -> ``torch.nn.Parameter`` (``requires_grad=True``).

    Raises:
        GraphError: an initialiser does not fit the parameter (Glorot or an embedding
            table of fewer than two dimensions), or two kinds declare different ones.

    Example:
        >>> from edbatch.workloads.tree_gru import TreeGRU
        >>> p = init_params(TreeGRU(embed_dim=4, hidden_dim=3), torch.Generator().manual_seed(0))
        >>> p["tree_gru.U_rz"].shape, p["tree_gru.U_rz.b"].count_nonzero().item()
        (torch.Size([9, 6]), 0)
    """
    inits = declared_inits(workload, kernels)
    out: dict[str, torch.nn.Parameter] = {}
    for name, shape in workload.param_shapes().items():
        init = inits.get(name, "zeros" if len(shape) < 2 else "glorot")
        if init == "zeros":
            value = torch.zeros(shape, dtype=torch.float32)
        elif len(shape) < 2:
            raise GraphError(f"parameter {name!r} of shape {shape} is declared init={init!r}, "
                             f"which needs two or more dimensions; declare init='zeros'")
        elif init == "embedding":
            value = _uniform(shape, EMBEDDING_RANGE, generator)
        else:
            value = _glorot(shape, generator)
        out[name] = torch.nn.Parameter(value.to(device=device, dtype=dtype))
    return out
