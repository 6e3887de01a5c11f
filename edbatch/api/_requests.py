"""Value requests a program may yield instead of a handle: what the runtime computes for it.

``yield argmax(handle)`` asks :meth:`DynamicBatch.run_programs
<edbatch.api.DynamicBatch.run_programs>` for the index of the handle's largest entry (an
``int``: over the flattened value, first of ties, as ``int(value.argmax())``). When every
program of a round asks for the argmax of a handle of one kind (a greedy decoder's logits,
a parser's action scores), the runtime gathers all the rows at once, takes one batched
``argmax`` and reads the indices back to the host with one ``tolist()``: one device-to-host
transfer per synchronisation, where each program's own ``int(value.argmax())`` costs an
``argmax`` and a transfer per program. Rounds that mix requests and handles work too (each
request then answered on its own).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from edbatch.api import DynamicBatch, argmax
    >>> _ = torch.manual_seed(0)
    >>> batch = DynamicBatch()
    >>> score = batch.cell(nn.Linear(3, 5), "score", [3], 5)
    >>> def program(x):
    ...     best = yield argmax(score(batch.input(x)))
    ...     return best
    >>> xs = [torch.randn(3) for _ in range(4)]
    >>> out = batch.run_programs([program(x) for x in xs], grad=False)
    >>> out.returns == [int(score.module(x).argmax()) for x in xs]
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from edbatch.api._handles import Handle
from edbatch.errors import GraphError

__all__ = ["ArgMax", "argmax", "hand_back", "hand_back_argmax"]


class ArgMax:
    """A request for the index of the largest entry of ``handle``'s value (see module)."""

    __slots__ = ("handle",)

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"argmax({self.handle!r})"


def argmax(handle: Handle) -> ArgMax:
    """What a program yields to get ``int(value.argmax())`` of ``handle``, computed for the
    whole round at once (module docstring)."""
    if type(handle) is not Handle:
        raise GraphError(f"argmax() takes a Handle, got {type(handle).__name__}; yield "
                         f"argmax(handle) for one recorded node")
    return ArgMax(handle)


def hand_back(values: Tensor, shape: tuple[int, ...]) -> Sequence[Tensor]:
    """``values`` (one row per program, all of row shape ``shape``) as detached row views
    (one ``unbind``: no Python per program)."""
    flat = values.detach()
    if len(shape) != 1:
        flat = flat.reshape(len(flat), *shape)
    return flat.unbind(0)


def hand_back_argmax(values: Tensor) -> list[int]:
    """The flat argmax of every row of ``values`` (one per program): one batched ``argmax``
    and one transfer to the host."""
    return values.detach().reshape(len(values), -1).argmax(1).tolist()  # type: ignore[no-any-return]


def node_ids(asked: list[object], kind: object, rec: object
             ) -> np.ndarray | None:  # type: ignore[type-arg]
    """The node ids of a round where every program asked for the argmax of one handle of
    ``kind`` recorded in ``rec`` (``None`` if it is not such a round)."""
    for y in asked:
        if type(y) is not ArgMax or y.handle._kind is not kind or y.handle._rec is not rec:
            return None
    return np.fromiter([y.handle.node_id for y in asked], np.int64,  # type: ignore[attr-defined]
                       len(asked))
