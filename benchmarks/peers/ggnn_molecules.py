"""The benchmark peers of ``ggnn_molecules``: the same GGNN, loss and parameters as the
workload, as a user of ``edbatch.api``, in plain PyTorch one molecule at a time (the seeds'
unbatched baseline) and in PyTorch Geometric (the practitioner's choice: one disjoint-union
batch, ``MessagePassing`` with ``add`` aggregation and ``global_add_pool``).

* ``record``: the per-instance model on ``edbatch.api`` (:mod:`benchmarks.models_api`): per
  round one variadic ``update`` per atom on its state and its neighbours' states (messages
  computed inside, per bond type); a variadic ``readout`` over the atoms, the loss.
* ``Unbatched`` (:func:`unbatched_loss`): per-molecule tensors, a Python loop over molecules.
* ``HandBatched`` (:func:`pyg_loss`): one PyG ``Batch`` of the mini-batch's molecules.

Both PyTorch peers read the parameter dict of :func:`edbatch.executor.init_params` by name and
the molecules as :class:`~edbatch.workloads.ggnn_molecules.MoleculeInstance` (atom codes,
incoming messages, coded target), and return the summed loss of a mini-batch, the value of
its ``loss_sum`` node in edbatch (``tests/workloads/test_ggnn_molecules.py`` checks the
equality in fp64). The equations are in :mod:`edbatch.workloads.ggnn_molecules`; here
messages are computed per directed edge, as PyG does (edbatch sums the neighbour states per
bond type first: the same values). PyG is the optional ``peers`` extra (``pip install
torch-geometric``). Their ``tanh`` is edbatch's :func:`~edbatch.executor.kernels.fast_tanh`,
as in edbatch's kernels and every hand-batched peer (the rows compare batching, not a
``tanh`` implementation). The DyNet peer is ``benchmarks/peers/dynet/ggnn_molecules.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks import hand_batched
from edbatch.api import DynamicBatch
from edbatch.data.molecules import BOND_TYPES
from edbatch.executor.kernels import fast_tanh
from edbatch.workloads.ggnn_molecules import (
    TARGET_SCALE,
    GGNNMolecules,
    MoleculeInstance,
    unpack_atom,
)

__all__ = ["GGNNPyG", "GGNNUnbatched", "HandBatched", "Unbatched", "pyg_loss", "record",
           "unbatched_loss"]

P = "ggnn"


def record(batch: DynamicBatch, wl: GGNNMolecules, instances: Sequence[MoleculeInstance]
           ) -> None:
    """``wl.rounds`` rounds of one variadic ``update`` per atom on its state and its
    neighbours' states (the messages are computed inside, per bond type), then the readout
    and the squared error."""
    embed, update, readout, loss = (batch.op(f"{P}.{n}")
                                    for n in ("embed", "update", "readout", "loss"))
    add_loss = batch.add_loss
    for inst in instances:
        with batch.instance():
            h = [embed(attr=code) for code in inst.atom_codes]
            for _ in range(wl.rounds):  # each atom's state, then its neighbours' states
                get = h.__getitem__
                h = [update(*map(get, ops), attr=attr)
                     for ops, attr in zip(inst.update_operands, inst.update_attrs)]
            add_loss(loss(readout(*h, attr=len(h)), attr=inst.target_code))


def _atoms(inst: MoleculeInstance, device: torch.device) -> Tensor:
    """``[n, 6]`` rows of ``ggnn.atom_emb`` each atom reads."""
    return torch.tensor([unpack_atom(c) for c in inst.atom_codes], dtype=torch.int64,
                        device=device)


def _embed(rows: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    return F.embedding(rows, params[f"{P}.atom_emb"], sparse=True).sum(dim=1)


def _edges(insts: Sequence[MoleculeInstance], device: torch.device
           ) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, dst, bond type)`` of every directed edge, atoms numbered over ``insts``."""
    src, dst, kind, base = [], [], [], 0
    for inst in insts:
        for v, incoming in enumerate(inst.sources):
            for u, t in incoming:
                src.append(base + u)
                dst.append(base + v)
                kind.append(t)
        base += inst.n_atoms
    as_t = [torch.tensor(x, dtype=torch.int64, device=device) for x in (src, dst, kind)]
    return as_t[0], as_t[1], as_t[2]


def _gru(a: Tensor, h: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    hidden = h.shape[1]
    rz = torch.sigmoid(F.linear(torch.cat([a, h], 1), params[f"{P}.gru.rz"],
                                params[f"{P}.gru.rz.b"]))
    r, z = rz[:, :hidden], rz[:, hidden:]
    c = fast_tanh(F.linear(torch.cat([a, r * h], 1), params[f"{P}.gru.c"],
                            params[f"{P}.gru.c.b"]))
    return z * h + (1.0 - z) * c


def _terms(h: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    gate = torch.sigmoid(F.linear(h, params[f"{P}.gate"], params[f"{P}.gate.b"]))
    return gate * fast_tanh(F.linear(h, params[f"{P}.proj"], params[f"{P}.proj.b"]))


def _sq_err(g: Tensor, codes: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``(pred - z)^2`` per row of ``g``; ``z = codes / TARGET_SCALE``: the standardised
    targets."""
    hid = fast_tanh(F.linear(g, params[f"{P}.hid"], params[f"{P}.hid.b"]))
    pred = F.linear(hid, params[f"{P}.pred"], params[f"{P}.pred.b"]).squeeze(1)
    return (pred - codes.to(pred.dtype) / TARGET_SCALE) ** 2


def _targets(insts: Sequence[MoleculeInstance], device: torch.device) -> Tensor:
    """The coded targets (``round(z * TARGET_SCALE)``, int64) of ``insts``."""
    return torch.tensor([inst.target_code for inst in insts], dtype=torch.int64,
                        device=device)


def _messages(h: Tensor, src: Tensor, kind: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``A_b h_src + c_b`` per directed edge."""
    out = h.new_zeros(len(src), h.shape[1])
    for t, bond in enumerate(BOND_TYPES):
        sel = torch.nonzero(kind == t).reshape(-1)
        if len(sel):
            out[sel] = F.linear(h[src[sel]], params[f"{P}.msg.{bond}"],
                                params[f"{P}.msg.{bond}.b"])
    return out


# ---------------------------------------------------------------------- unbatched
def _molecule_loss(rounds: int, atoms: Tensor, edges: tuple[Tensor, Tensor, Tensor],
                   z: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    h = _embed(atoms, params)
    src, dst, kind = edges
    for _ in range(rounds):
        a = h.new_zeros(h.shape).index_add(0, dst, _messages(h, src, kind, params))
        h = _gru(a, h, params)
    g = _terms(h, params).sum(dim=0, keepdim=True)
    return _sq_err(g, z, params).sum()


class GGNNUnbatched(hand_batched.HandBatched):
    """One molecule at a time: ``prepare`` makes each molecule's atom rows and edge index
    tensors, ``forward`` runs the molecules in a Python loop."""

    def prepare(self, instances: Sequence[MoleculeInstance]) -> list[tuple[Any, ...]]:
        dev = self.params[f"{P}.atom_emb"].device
        return [(_atoms(inst, dev), _edges([inst], dev), _targets([inst], dev))
                for inst in instances]

    def forward(self, prepared: list[tuple[Any, ...]]) -> Tensor:
        total: Tensor | None = None
        for atoms, edges, z in prepared:
            loss = _molecule_loss(self.wl.rounds, atoms, edges, z, self.params)
            total = loss if total is None else total + loss
        assert total is not None, "no instances"
        return total


def unbatched_loss(workload: GGNNMolecules, insts: Sequence[MoleculeInstance],
                   params: Mapping[str, Tensor]) -> Tensor:
    """Summed loss, one molecule at a time (per-molecule tensors, a Python loop over them)."""
    return GGNNUnbatched(workload, params).loss(insts)


# ---------------------------------------------------------------------- PyG
_CONV: dict[str, Any] = {}


def _typed_messages() -> Any:
    """The ``MessagePassing`` class ``a_v = sum_{(u, v, b)} A_b h_u + c_b`` (PyG imported
    on first use)."""
    if "cls" not in _CONV:
        from torch_geometric.nn import MessagePassing

        class TypedMessages(MessagePassing):  # type: ignore[misc]
            """One linear map per bond type on the source state, ``add`` aggregation."""

            def __init__(self, params: Mapping[str, Tensor]) -> None:
                super().__init__(aggr="add", node_dim=0)
                self.weights = params

            def forward(self, h: Tensor, edge_index: Tensor, edge_type: Tensor) -> Tensor:
                return self.propagate(edge_index, h=h, edge_type=edge_type)  # type: ignore[no-any-return]

            def message(self, h_j: Tensor, edge_type: Tensor) -> Tensor:
                return _messages(h_j, torch.arange(len(h_j), device=h_j.device), edge_type,
                                 self.weights)

        _CONV["cls"] = TypedMessages
    return _CONV["cls"]


class GGNNPyG(hand_batched.HandBatched):
    """PyTorch Geometric: ``prepare`` collates the molecules into one ``Batch``; ``forward``
    runs ``rounds`` of ``MessagePassing`` + GRU on it and pools per molecule."""

    def __init__(self, wl: GGNNMolecules, params: Mapping[str, Tensor]) -> None:
        super().__init__(wl, params)
        self.conv = _typed_messages()(params)

    def prepare(self, instances: Sequence[MoleculeInstance]) -> tuple[Any, Tensor]:
        from torch_geometric.data import Batch, Data

        dev = self.params[f"{P}.atom_emb"].device
        data = []
        for inst in instances:
            src, dst, kind = _edges([inst], dev)
            data.append(Data(x=_atoms(inst, dev).reshape(-1, 6),
                             edge_index=torch.stack([src, dst]), edge_type=kind,
                             num_nodes=inst.n_atoms))
        return Batch.from_data_list(data), _targets(instances, dev)

    def forward(self, prepared: tuple[Any, Tensor]) -> Tensor:
        from torch_geometric.nn import global_add_pool

        batch, z = prepared
        h = _embed(batch.x, self.params)
        for _ in range(self.wl.rounds):
            h = _gru(self.conv(h, batch.edge_index, batch.edge_type), h, self.params)
        g = global_add_pool(_terms(h, self.params), batch.batch, size=len(z))
        return _sq_err(g, z, self.params).sum()


def pyg_loss(workload: GGNNMolecules, insts: Sequence[MoleculeInstance],
             params: Mapping[str, Tensor]) -> Tensor:
    """Summed loss of one PyG batch (``Batch.from_data_list`` of the molecules)."""
    return GGNNPyG(workload, params).loss(insts)


#: The hand-batched (practitioner's) model of this workload: PyTorch Geometric.
HandBatched = GGNNPyG
#: The per-instance PyTorch model of this workload.
Unbatched = GGNNUnbatched
