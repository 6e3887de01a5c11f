"""Data-parallel training of the executor's parameter dicts over :mod:`torch.distributed`.

Each rank records, schedules and runs its own share of the global mini-batch; before the
optimizer step the ranks sum their parameter gradients, so every rank takes the same step as
one process over the whole mini-batch would.

Why not ``DistributedDataParallel``: DDP wraps an ``nn.Module`` and overlaps bucketed
all-reduces with per-parameter autograd hooks. The executor's parameters are a plain
name -> tensor dict, and its training run is one ``autograd.Function`` whose hand-written
backward hands back every parameter gradient at once, at the very end; there is no
backward to overlap, so :class:`DataParallel` all-reduces once after ``backward`` and
overlaps the sum with the next mini-batch's preparation instead (recording, scheduling and
memory planning need no parameters; :meth:`DataParallel.sum_grads_async`):

1. A rank back-propagates ``loss_sum / N_global`` (its share of the global mean), exactly
   the scaling one process over the global mini-batch uses, so the gradients only need a
   SUM. ``N_global`` needs no collective when every rank knows the global mini-batch (the
   training loop computes it from the instances' sizes); :meth:`DataParallel.sum` adds up
   counts that only the ranks themselves know.
2. :meth:`DataParallel.sum_grads` sends one small header (per parameter: got a gradient on
   some rank; per embedding table given in ``sparse_rows``: a mask of the rows read), then
   one flat buffer: every dense gradient, and for each embedding table only the rows some
   rank read (the union), not the whole table (SST's 18k x 128 table is 9 MB; a mini-batch
   of 64 trees reads about 600 rows). The table's gradient comes back dense (rows nobody
   read are zero, as in the single-process gradient), which Adam needs. Started with
   :meth:`DataParallel.sum_grads_async`, the header goes while the next mini-batch is
   recorded and the buffer while it is scheduled and planned; the rank waits only for
   what is left, and Adam runs just before the next forward.

A parameter that got no gradient on any rank keeps ``grad = None`` (Adam skips it, as it
would in one process). The all-reduce sums in a fixed order and hands every rank the same
bytes, so the ranks' parameters stay identical without re-broadcasting them; they start
identical through :meth:`DataParallel.broadcast`.

With ``world_size == 1`` (no ``torchrun``) every method is a no-op or the identity, so a
training loop calls them unconditionally.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import NDArray
from torch import Tensor

from edbatch.errors import EdbatchError

__all__ = ["DataParallel", "DistributedSetupError", "PendingGrads", "PendingSum",
           "instance_sizes"]

T = TypeVar("T")


class DistributedSetupError(EdbatchError, RuntimeError):
    """The process group cannot be set up as asked (backend, device, environment)."""


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group (rank 0 of 1 without ``torchrun``).

    Attributes:
        rank: global rank.
        world_size: number of ranks.
        local_rank: rank on this node (picks the CUDA device).
        backend: ``gloo`` / ``nccl``; ``None`` when not distributed.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    #: per embedding table: the dense gradient buffer handed out last step, its version
    #: then and the rows it holds (the next step zeroes those rows, not the whole table)
    _tables: dict[str, tuple[Tensor, int, Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    # ---------------------------------------------------------------- set-up
    @classmethod
    def from_env(cls, device: str = "cpu", backend: str | None = None) -> DataParallel:
        """Join the group ``torchrun`` describes in the environment (``WORLD_SIZE``,
        ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), or, in a SLURM job of
        several tasks started by submitit (Hydra's ``hydra/launcher=slurm``), the group of
        its tasks; a single process when there is neither.

        Args:
            device: the training device, ``cpu`` or ``cuda`` (each rank then uses
                ``cuda:LOCAL_RANK``).
            backend: ``gloo`` or ``nccl``; ``None`` picks NCCL on CUDA, gloo on CPU.
        """
        if "WORLD_SIZE" not in os.environ and os.environ.get("SUBMITIT_EXECUTOR") == "slurm" \
                and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            from submitit.helpers import TorchDistributedEnvironment

            # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (the job's first node), MASTER_PORT
            TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_available():
            raise DistributedSetupError(f"WORLD_SIZE={world} asks for {world} ranks but this "
                                        f"torch build has no torch.distributed")
        cuda = str(device).startswith("cuda")
        backend = backend or ("nccl" if cuda else "gloo")
        if backend not in ("gloo", "nccl"):
            raise DistributedSetupError(f"dist_backend={backend!r} is not supported; use "
                                        f"'gloo' (CPU or CUDA) or 'nccl' (CUDA), or null")
        if backend == "nccl" and not cuda:
            raise DistributedSetupError("dist_backend='nccl' needs device=cuda; on the CPU use "
                                        "dist_backend=gloo (or null)")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            if not torch.cuda.is_available() or local >= torch.cuda.device_count():
                raise DistributedSetupError(
                    f"rank with LOCAL_RANK={local} needs a CUDA device but this node has "
                    f"{torch.cuda.device_count()}; lower --nproc_per_node or use device=cpu")
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group(backend)  # env:// rendezvous, set up by torchrun
        return cls(dist.get_rank(), dist.get_world_size(), local, backend)

    def close(self) -> None:
        """Leave the process group (no-op for a single process)."""
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def enabled(self) -> bool:
        """Whether there is more than one rank."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs and writes files."""
        return self.rank == 0

    def device(self, device: str) -> str:
        """This rank's device: ``cuda`` becomes ``cuda:LOCAL_RANK`` when distributed."""
        return f"cuda:{self.local_rank}" if self.enabled and device == "cuda" else device

    def shard(self, items: Sequence[T], weights: Sequence[float] | None = None) -> list[T]:
        """This rank's share of ``items`` (the shares are disjoint and cover ``items``).

        Without ``weights``: every ``world_size``-th item, from ``rank`` (shares differ in
        size by at most one). With ``weights`` (``weights[k]`` is the cost of ``items[k]``,
        e.g. its tree's node count: :func:`instance_sizes`): balanced by cost, since a
        step takes as long as its slowest rank: largest first, each to the least-loaded
        rank (ties: the lower rank, the earlier item), so every rank computes the same
        split; each share keeps the items' order. A rank gets an empty share only when
        there are fewer items than ranks.
        """
        if weights is None or self.world_size == 1:
            return list(items[self.rank::self.world_size])
        if len(weights) != len(items):
            raise ValueError(f"shard: {len(weights)} weights for {len(items)} items; give "
                             f"one weight per item")
        cost = [float(w) for w in weights]
        load = [0.0] * self.world_size
        mine: list[int] = []
        for k in sorted(range(len(items)), key=lambda k: -cost[k]):  # stable: ties in order
            r = min(range(self.world_size), key=load.__getitem__)
            load[r] += cost[k]
            if r == self.rank:
                mine.append(k)
        return [items[k] for k in sorted(mine)]

    # ---------------------------------------------------------------- collectives
    def broadcast(self, params: Iterable[Tensor]) -> None:
        """Copy rank 0's values of ``params`` to every rank, in place."""
        if self.enabled:
            with torch.no_grad():
                for p in params:
                    dist.broadcast(p.data, src=0)

    def sum(self, values: Sequence[float], device: str | torch.device | None = None
            ) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (float64; identity for one rank)."""
        return self.sum_async(values, device).result()

    def sum_async(self, values: Sequence[float], device: str | torch.device | None = None
                  ) -> PendingSum:
        """Start :meth:`sum` and return at once; ``.result()`` waits for it. Work done in
        between (the forward pass) overlaps the collective and the wait for the other
        ranks to reach it."""
        if not self.enabled:
            return PendingSum([float(v) for v in values])
        t = torch.tensor([float(v) for v in values], dtype=torch.float64,
                         device=device or self.comm_device)
        return PendingSum(t, dist.all_reduce(t, async_op=True))

    @property
    def comm_device(self) -> torch.device:
        """Where small collectives' tensors live: the rank's GPU with NCCL, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else \
            torch.device("cpu")

    def any(self, flag: bool, device: str | torch.device | None = None) -> bool:
        """Whether ``flag`` is true on some rank (for decisions every rank must share)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=device or self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def sum_grads(self, params: Mapping[str, Tensor], sparse_rows: Collection[str] = ()
                  ) -> None:
        """Replace every ``params[n].grad`` by its sum over the ranks (see the module doc).

        Args:
            params: name -> parameter, the same names in the same order on every rank.
            sparse_rows: embedding tables whose gradients go as the union of the rows read;
                their gradients may be sparse COO (the executor's ``sparse_grads``) or
                dense; they come back dense.
        """
        self.sum_grads_async(params, sparse_rows).finish()

    def sum_grads_async(self, params: Mapping[str, Tensor], sparse_rows: Collection[str] = (),
                        flags: Sequence[float] = ()) -> PendingGrads:
        """Start :meth:`sum_grads` and return at once; ``.finish()`` completes it.

        The header's all-reduce (which parameters got gradients, which table rows were
        read) runs in the background; ``advance()`` waits for it and starts the gradients'
        all-reduce, ``finish()`` waits for that and hands the sums out. Work done in between
        (a training loop prepares its next mini-batch: recording before ``advance``,
        scheduling and memory planning after it) overlaps the transfers and, above all,
        this rank's wait for the slowest rank. The gradients must not change until
        ``finish``.

        ``flags`` (a few numbers, e.g. "my time budget is spent") travel in the header and
        come back summed over the ranks from :meth:`PendingGrads.flags`: decisions every
        rank must share, at no extra collective.
        """
        if not self.enabled:
            return PendingGrads(self, {}, [], {}, None, None, [float(f) for f in flags])
        names = list(params)
        device = next(iter(params.values())).device
        tables = [n for n in names if n in sparse_rows and params[n].dim() == 2]
        local_rows = {n: _rows_of(params[n].grad) for n in tables}
        header = [torch.tensor([0.0 if params[n].grad is None else 1.0 for n in names],
                               device=device)]
        for n in tables:
            mask = torch.zeros(params[n].shape[0], device=device)
            idx = local_rows[n]
            if idx is not None:
                mask[idx[0]] = 1.0
            header.append(mask)
        header.append(torch.tensor([float(f) for f in flags], device=device))
        head = torch.cat(header)
        return PendingGrads(self, params, names, local_rows, head,
                            dist.all_reduce(head, async_op=True), len(flags))

    def _send_grads(self, pending: PendingGrads) -> tuple[Tensor, Any]:
        """Stage 2 of :meth:`sum_grads_async` (the header is in): lay out this rank's
        gradients in one flat buffer and start its all-reduce; returns ``(flat, work)``."""
        params, names, local_rows, head = (pending.params, pending.names, pending.local_rows,
                                           pending.head)
        assert head is not None
        ref = next(iter(params.values()))
        device, dtype = ref.device, ref.dtype
        unions, at = {}, len(names)
        for n in local_rows:
            size = params[n].shape[0]
            unions[n] = torch.nonzero(head[at:at + size] > 0).flatten()
            at += size
        parts: list[Tensor] = []
        for n in names:
            p, g = params[n], params[n].grad
            if n in unions:
                part = torch.zeros(len(unions[n]), p.shape[1], device=device, dtype=dtype)
                idx = local_rows[n]
                if idx is not None:  # rows of the union this rank read, in union order
                    part.index_add_(0, torch.searchsorted(unions[n], idx[0]), idx[1])
                parts.append(part.flatten())
            else:
                parts.append(torch.zeros(p.numel(), device=device, dtype=dtype) if g is None
                             else g.reshape(-1).to(dtype))
        pending.unions = unions
        flat = torch.cat(parts)
        return flat, dist.all_reduce(flat, async_op=True)

    def _take_grads(self, pending: PendingGrads, flat: Tensor) -> None:
        """Stage 3 (the sum is in): hand the summed gradients out."""
        params, names, unions = pending.params, pending.names, pending.unions
        assert pending.head is not None
        got = pending.head[:len(names)] > 0
        at = 0
        for k, n in enumerate(names):
            p = params[n]
            size = len(unions[n]) * p.shape[1] if n in unions else p.numel()
            chunk = flat[at:at + size]
            at += size
            if not bool(got[k]):
                p.grad = None
            elif n in unions:
                p.grad = self._dense_table(n, p, unions[n], chunk.view(-1, p.shape[1]))
            else:
                p.grad = chunk.view_as(p)  # a view of this step's buffer (fresh each step)

    def _dense_table(self, name: str, p: Tensor, rows: Tensor, values: Tensor) -> Tensor:
        """``p``'s dense gradient: ``values`` at ``rows``, zero elsewhere. Reuses last step's
        buffer (zeroing only the rows it held) unless it was changed in place since."""
        old = self._tables.get(name)
        if old is not None and old[0]._version == old[1] and old[0].shape == p.shape \
                and old[0].dtype == p.dtype and old[0].device == p.device:
            dense = old[0]
            dense[old[2]] = 0.0
        else:
            dense = torch.zeros_like(p)
        dense[rows] = values
        self._tables[name] = (dense, dense._version, rows)
        return dense


class PendingGrads:
    """A :meth:`DataParallel.sum_grads_async` in flight, in three stages: the header's
    all-reduce (started), the gradients' all-reduce (:meth:`advance` starts it once the
    header is in), handing the sums out (:meth:`finish`). Each stage runs once; for one rank
    there is nothing to do."""

    def __init__(self, dp: DataParallel, params: Mapping[str, Tensor], names: list[str],
                 local_rows: dict[str, tuple[Tensor, Tensor] | None], head: Tensor | None,
                 work: Any, flags: int | list[float] = 0) -> None:
        self.dp, self.params, self.names = dp, params, names
        self.local_rows, self.head, self._work = local_rows, head, work
        self.unions: dict[str, Tensor] = {}
        self._flat: tuple[Tensor, Any] | None = None
        self.done = work is None
        #: one rank: the flags themselves; else how many end the header (summed there)
        self._flags = flags

    def advance(self) -> None:
        """Wait for the header and start the gradients' all-reduce (once; no-op after)."""
        if self.done or self._flat is not None:
            return
        self._work.wait()
        self._flat = self.dp._send_grads(self)

    def flags(self) -> list[float]:
        """The ``flags`` of :meth:`DataParallel.sum_grads_async` summed over the ranks
        (waits for the header, and starts the gradients' all-reduce, if not done yet)."""
        if isinstance(self._flags, list):
            return list(self._flags)
        self.advance()
        assert self.head is not None
        return self.head[self.head.numel() - self._flags:].tolist()

    def finish(self) -> None:
        """Wait for the gradients' sum and hand it out as every parameter's ``grad``."""
        if self.done:
            return
        self.advance()
        assert self._flat is not None
        flat, work = self._flat
        work.wait()
        self.done = True
        self.dp._take_grads(self, flat)


class PendingSum:
    """A :meth:`DataParallel.sum_async` in flight (or done, for one rank)."""

    def __init__(self, values: Tensor | list[float], work: Any = None) -> None:
        self._values, self._work = values, work

    def result(self) -> list[float]:
        """The sums (waits for the collective the first time)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        if isinstance(self._values, Tensor):
            self._values = self._values.tolist()
        return list(self._values)


def instance_sizes(instances: Sequence[Any]) -> NDArray[np.float64]:
    """A cost per instance for :meth:`DataParallel.shard`: its ``num_nodes`` (a tree's
    nodes), else its ``len()``, else 1."""
    def size(inst: Any) -> float:
        n = getattr(inst, "num_nodes", None)
        if n is None:
            n = len(inst) if hasattr(inst, "__len__") else 1
        return float(n)

    return np.fromiter((size(x) for x in instances), dtype=np.float64, count=len(instances))


def _rows_of(grad: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """``(row indices, row values)`` of a table gradient (indices may repeat: the values of
    a repeated row add up), from a sparse COO or a dense gradient; ``None`` if none."""
    if grad is None:
        return None
    if not grad.is_sparse:
        grad = grad.to_sparse(sparse_dim=1)  # the non-zero rows
    return grad._indices()[0], grad._values()
