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

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edbatch.api._bulk import Handles
from edbatch.api._handles import Handle
from edbatch.api._values import Values
from edbatch.errors import GraphError

__all__ = ["ArgMax", "TopK", "argmax", "bulk_round", "check_yield", "hand_back", "hand_back_argmax",
           "ids_array", "round_yields", "topk", "values_of"]


class ArgMax:
    """A request for the index of the largest entry of ``handle``'s value, among the
    ``allowed`` entries if given (see module)."""

    __slots__ = ("allowed", "code", "handle")

    def __init__(self, handle: Handle, allowed: np.ndarray | None = None,  # type: ignore[type-arg]
                 code: int = -1) -> None:
        # code: the mask's number in the registry of checked masks (-1: none or unknown)
        self.handle, self.allowed, self.code = handle, allowed, code

    def __repr__(self) -> str:
        return f"argmax({self.handle!r})"


def argmax(handle: Handle, allowed: np.ndarray | None = None) -> ArgMax:  # type: ignore[type-arg]
    """What a program yields to get ``int(value.argmax())`` of ``handle``, computed for the
    whole round at once (module docstring). ``allowed``: a boolean array over the value's
    entries (flattened); then the index of the largest allowed entry (first of ties), as
    ``int(np.where(allowed, value, -inf).argmax())`` (a parser's best legal transition).
    Pass the same array object for the same mask (it is not copied)."""
    if type(handle) is not Handle:
        raise GraphError(f"argmax() takes a Handle, got {type(handle).__name__}; yield "
                         f"argmax(handle) for one recorded node")
    if allowed is None:
        return ArgMax(handle)
    seen = _CHECKED.get(id(allowed))  # (a mask checked before: programs share them)
    if seen is None or seen[0] is not allowed or seen[1] is not handle._kind.shape:
        seen = _check_mask(handle, allowed)
    return ArgMax(handle, allowed, seen[2])


#: Masks checked by :func:`argmax` (by id, each kept alive with the interned row shape it
#: was checked for and its code: a number never given to another mask, the key of
#: :data:`_BY_CODE`), at most :data:`_MASKS_KEPT`.
_CHECKED: dict[int, tuple[np.ndarray, tuple[int, ...], int]] = {}  # type: ignore[type-arg]
#: The checked masks by code, emptied with :data:`_CHECKED`.
_BY_CODE: dict[int, np.ndarray] = {}  # type: ignore[type-arg]
_MASKS_KEPT = 4096
_next_code = [0]


def _check_mask(handle: Handle, allowed: Any) -> tuple[np.ndarray, tuple[int, ...], int]:  # type: ignore[type-arg]
    size = math.prod(handle.shape)
    if type(allowed) is not np.ndarray or allowed.dtype != bool or allowed.size != size:
        raise GraphError(f"argmax(): allowed must be a numpy bool array of "
                         f"{size} entries (the value's), got "
                         f"{type(allowed).__name__} {getattr(allowed, 'dtype', '')} "
                         f"{getattr(allowed, 'shape', '')}; build it with np.asarray(x, bool)")
    if len(_CHECKED) >= _MASKS_KEPT:
        _CHECKED.clear()
        _BY_CODE.clear()
    code = _next_code[0]
    _next_code[0] += 1
    seen = _CHECKED[id(allowed)] = (allowed, handle._kind.shape, code)
    _BY_CODE[code] = allowed  # (flattened when read: a copy if it is not contiguous)
    return seen


def _mask_rows(codes: list[int]) -> np.ndarray | None:  # type: ignore[type-arg]
    """Per program the entries its mask keeps, ``[len(codes), size]``, from the masks'
    codes: the distinct masks stacked (read now: a mask changed in place picks by its new
    entries) and indexed, a few numpy calls and no Python per program; ``None`` if a code
    is no longer registered (then the masks themselves are read).

    Raises:
        GraphError: a mask allows no entry.
    """
    distinct = dict.fromkeys(codes)  # (C loops: no Python per program)
    masks = list(map(_BY_CODE.get, distinct))
    if not all(m is not None for m in masks):
        return None
    table = np.array([m.reshape(-1) for m in masks])  # type: ignore[union-attr]  # (np.stack: 2.5x)
    if not table.any(1).all():
        raise GraphError("argmax(): an allowed mask allows no entry; allow at least one")
    if len(masks) == 1:
        return table
    row = dict(zip(distinct, range(len(masks))))
    return table[np.fromiter(map(row.__getitem__, codes), np.intp, len(codes))]


class TopK:
    """A request for the indices of the ``k`` largest entries of each of ``handles``."""

    __slots__ = ("handles", "k")

    def __init__(self, handles: Handles | Sequence[Handle], k: int) -> None:
        self.handles, self.k = handles, k

    def __repr__(self) -> str:
        return f"topk({len(self.handles)} handles, {self.k})"


def topk(handles: Handles | Sequence[Handle], k: int) -> TopK:
    """What a program yields to get, per handle, the indices of its value's ``k`` largest
    entries (a list of ``k`` ints, largest first, as ``value.topk(k).indices.tolist()``),
    computed for the whole round at once: one ``topk`` and one transfer (module docstring)."""
    if type(handles) is Handles and handles.n and type(k) is int and \
            1 <= k <= math.prod(handles.shape):
        return TopK(handles, k)  # (a block: nothing per handle to check)
    if not isinstance(handles, (Handles, list, tuple)) or not len(handles) or \
            any(type(h) is not Handle for h in ([] if type(handles) is Handles else handles)):
        raise GraphError(f"topk() takes a non-empty list of Handles, got {handles!r}")
    if type(k) is not int or k < 1:
        raise GraphError(f"topk(): k={k!r} must be an int >= 1")
    width = math.prod(handles.shape) if type(handles) is Handles else \
        min(math.prod(h.shape) for h in handles)
    if k > width:  # (was torch's raw "selected index k out of range" at the sync)
        raise GraphError(f"topk(): k={k} is more than the {width} entries of a handle's "
                         f"value; pass k <= {width}")
    return TopK(handles, k)


def hand_back(values: Tensor, shape: tuple[int, ...]) -> Sequence[Tensor]:
    """``values`` (one row per program, all of row shape ``shape``) as detached row views
    (one ``unbind``: no Python per program)."""
    flat = values.detach()
    if len(shape) != 1:
        flat = flat.reshape(len(flat), *shape)
    return flat.unbind(0)


#: Dtypes whose CPU argmax runs in numpy (the same index: the first largest; a NaN counts as
#: the largest, as in torch).
_NUMPY_ARGMAX = (torch.float32, torch.float64)


def hand_back_argmax(values: Tensor, allowed: list[Any] | Callable[[], list[Any]] | None = None,
                     codes: list[int] | None = None) -> list[int]:
    """The flat argmax of every row of ``values`` (one per program), over the entries its
    ``allowed`` mask keeps (``None``: all): one batched ``argmax`` and one transfer to the
    host. ``codes``: the masks' codes (:func:`argmax` gives every checked mask one), when
    every program has one: the distinct masks are then stacked by code, with no Python
    per program (``allowed`` may then be a function giving the masks, called only if a
    code is no longer registered).

    Raises:
        GraphError: a mask allows no entry.
    """
    flat = values if values.dim() == 2 and not values.requires_grad else \
        values.detach().reshape(len(values), -1)  # (an inference batch as it is)
    if codes is not None:
        keep = _mask_rows(codes) if flat.device.type == "cpu" else None
        if keep is not None:  # (numpy: cheaper than torch at these sizes)
            return np.where(keep, flat.numpy(), -np.inf).argmax(1).tolist()  # type: ignore[no-any-return]
        allowed = allowed() if callable(allowed) else allowed
    if allowed is not None:  # each distinct mask once (programs pass shared arrays)
        ids = list(map(id, allowed))  # (C loops: no Python per program)
        distinct = dict(zip(ids, allowed, strict=True))  # id -> its mask, first-seen order
        index = {i: k for k, i in enumerate(distinct)}
        masks = list(distinct.values())
        table = np.stack([np.ones(flat.shape[1], bool) if a is None else a.reshape(-1)
                          for a in masks])
        if not table.any(1).all():
            raise GraphError("argmax(): an allowed mask allows no entry; allow at least one")
        keep = table[list(map(index.__getitem__, ids))] if len(masks) > 1 else \
            np.broadcast_to(table[0], flat.shape)
        if flat.device.type == "cpu":  # (numpy: cheaper than torch at these sizes)
            return np.where(keep, flat.numpy(), -np.inf).argmax(1).tolist()  # type: ignore[no-any-return]
        flat = flat.masked_fill(torch.from_numpy(~keep).to(flat.device), -math.inf)
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_ARGMAX:  # (a fifth of torch's time)
        return flat.numpy().argmax(1).tolist()  # type: ignore[no-any-return]
    return flat.argmax(1).tolist()  # type: ignore[no-any-return]


def _topk_rows(values: Tensor, k: int, counts: list[int]) -> list[list[list[int]]]:
    """Per program (``counts[i]`` rows each) the top-``k`` indices of its rows: one batched
    ``topk`` and one transfer, then list slices (the lists made by numpy: about 0.75x the
    time of ``Tensor.tolist``)."""
    top = values.detach().reshape(len(values), -1).topk(k, dim=1).indices
    rows = top.cpu().numpy().tolist()
    out, at = [], 0
    for n in counts:
        out.append(rows[at:at + n])
        at += n
    return out


def bulk_round(asked: list[Any], rec: Any
               ) -> tuple[np.ndarray, Callable[[Tensor], Sequence[Any]]] | None:  # type: ignore[type-arg]
    """A round answered in bulk: every program yielded one handle of one kind, or asked for
    the argmax of one, or for the top-``k`` of handles of one shape (all recorded in
    ``rec``): ``(node ids, values -> what each program is sent)``; ``None`` otherwise."""
    first = asked[0]
    kind = type(first)
    if kind is Handle or kind is ArgMax:
        want = (first if kind is Handle else first.handle)._kind
        node_ids: list[int] = []
        add = node_ids.append
        if kind is ArgMax:
            codes: list[int] = []
            code = codes.append
            for y in asked:  # one pass: the checks, the node ids and the mask codes
                if type(y) is not kind:
                    return None
                h: Any = y.handle
                if h._kind is not want or h._rec is not rec:
                    return None
                add(h.node_id)
                code(y.code)
            nodes = np.array(node_ids, np.int64)
            if min(codes) >= 0:  # every mask checked by argmax(): the masks read if need be
                return nodes, lambda values: hand_back_argmax(
                    values, lambda: [y.allowed for y in asked], codes)
            if any(y.allowed is not None for y in asked):
                allowed = [y.allowed for y in asked]
                return nodes, lambda values: hand_back_argmax(values, allowed)
            return nodes, hand_back_argmax
        for y in asked:  # one pass: the checks and the node ids
            if type(y) is not kind or y._kind is not want or y._rec is not rec:
                return None
            add(y.node_id)
        nodes = np.array(node_ids, np.int64)
        return nodes, lambda values: hand_back(values, want.shape)
    if kind is TopK:
        return _bulk_topk(asked, rec)
    return None


def _bulk_topk(asked: list[Any], rec: Any
               ) -> tuple[np.ndarray, Callable[[Tensor], Sequence[Any]]] | None:  # type: ignore[type-arg]
    """:func:`bulk_round` of a round of :class:`TopK` requests (``None``: not one ``k``
    and row shape, or handles of another recording)."""
    first = asked[0]
    k, shape, counts = first.k, None, []
    parts: list[Any] = []  # per program: its Handles block's first node, or its node ids
    blocks = True  # every part a block's first node
    for y in asked:
        if type(y) is not TopK or y.k != k:
            return None
        hs = y.handles
        if type(hs) is Handles:
            if hs.rec is not rec or (shape is not None and hs.shape != shape):
                return None
            shape = hs.shape
            parts.append(hs.first)
        else:
            if any(h._rec is not rec or h.shape != hs[0].shape for h in hs) or \
                    (shape is not None and hs[0].shape != shape):
                return None
            shape = hs[0].shape
            parts.append(np.fromiter([h.node_id for h in hs], np.int64, len(hs)))
            blocks = False
        counts.append(len(hs))
    if blocks:  # the blocks' ranges in a few array operations
        return _ranges(parts, counts), lambda values: _topk_rows(values, k, counts)
    ids = [np.arange(p, p + c, dtype=np.int64) if type(p) is int else p
           for p, c in zip(parts, counts, strict=True)]
    return np.concatenate(ids), lambda values: _topk_rows(values, k, counts)


def _ranges(firsts: list[int], counts: list[int]) -> np.ndarray:  # type: ignore[type-arg]
    """``first .. first + count - 1`` of every ``(first, count)``, concatenated."""
    cnt = np.array(counts, np.int64)
    ends = np.cumsum(cnt)
    return np.arange(int(ends[-1]), dtype=np.int64) + \
        np.repeat(np.array(firsts, np.int64) - (ends - cnt), cnt)


def round_yields(batch: Any, asking: list[int], asked: list[Any]
           ) -> tuple[np.ndarray, Any, Any]:  # type: ignore[type-arg]
    """A round's yields: ``(node ids, None, answer)`` when it is answered in bulk
    (:func:`~edbatch.api._requests.bulk_round`: nothing more to check), else ``(node ids,
    [(ids, shape)] per program, None)``, checked."""
    found = bulk_round(asked, batch._rec)
    if found is not None:
        return found[0], None, found[1]
    lists = [check_yield(batch, i, y) for i, y in zip(asking, asked, strict=True)]
    return np.concatenate([ids_array(ids) for ids, _ in lists]), lists, None


def ids_array(ids: Sequence[int]) -> np.ndarray:  # type: ignore[type-arg]
    if type(ids) is range:
        return np.arange(ids.start, ids.stop, dtype=np.int64)
    return np.asarray(ids, dtype=np.int64)


def check_yield(batch: Any, i: int, wanted: Any) -> tuple[Sequence[int], tuple[int, ...]]:
    """The node ids and row shape of what program ``i`` yielded (checked)."""
    rec = batch._rec
    if type(wanted) is ArgMax:
        wanted = wanted.handle
    elif type(wanted) is TopK:
        wanted = wanted.handles
    if type(wanted) is Handles and wanted.rec is rec and wanted.n:
        return wanted.ids, wanted.shape
    items = [wanted] if type(wanted) is Handle else wanted
    if not isinstance(items, (list, tuple, Handles)) or not len(items):
        raise GraphError(f"program {i} yielded {type(wanted).__name__}; yield a Handle (or a "
                         f"non-empty list of handles) whose value it needs, or argmax(handle)")
    items = list(items)
    shape = getattr(items[0], "shape", None)
    for h in items:
        if type(h) is not Handle or h._rec is not rec:
            batch._check_handle(h, f"program {i}'s yield")
        if h._kind.shape != shape:
            raise GraphError(f"program {i} yielded handles of shapes {items[0].shape} and "
                             f"{h.shape}; yield a list of one shape (or yield them apart)")
    return [h.node_id for h in items], shape  # type: ignore[return-value]


def values_of(values: Values, asked: list[Any],
              lists: list[tuple[Sequence[int], tuple[int, ...]]]) -> list[Any]:
    """What each program is sent (the general path; the common rounds: :func:`bulk_round`):
    the value of the handle it yielded (shape ``handle.shape``) or of its list (``[k,
    *shape]``), detached, or the argmax or top-``k`` it asked for, read from ``values`` in
    one gather per row shape."""
    out: list[Any] = [None] * len(asked)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for j, (_, shape) in enumerate(lists):
        by_shape.setdefault(shape, []).append(j)
    for shape, js in by_shape.items():
        nodes = np.concatenate([ids_array(lists[j][0]) for j in js])
        flat = values.gather(nodes).detach()
        at = 0
        for j in js:
            k = len(lists[j][0])
            if type(asked[j]) is Handle:
                out[j] = flat[at].reshape(shape)
            elif type(asked[j]) is ArgMax:
                out[j] = hand_back_argmax(flat[at:at + 1], [asked[j].allowed])[0]
            elif type(asked[j]) is TopK:
                out[j] = flat[at:at + k].reshape(k, -1).topk(asked[j].k, dim=1) \
                    .indices.tolist()
            else:
                out[j] = flat[at:at + k].reshape(k, *shape)
            at += k
    return out
